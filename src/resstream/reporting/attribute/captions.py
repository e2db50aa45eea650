"""How to read each figure and table of `attribute`: the one-line captions attribute.html
shows under them, for one text (`CAPTIONS`) and for a corpus (`CORPUS_CAPTIONS`), keyed by
file name (figures) or table name."""

from __future__ import annotations

__all__ = ["CAPTIONS", "CORPUS_CAPTIONS"]

#: How to read each figure and table: the page's one-line captions.
CAPTIONS = {
    "layers.png": "Each block's attention (blue) and MLP (orange): top, C = how much adding its output "
    "raised (above 0) or lowered log p(target); bottom, its direct logit attribution (DLA) through the "
    "final norm frozen at the actual final state. Direct effects only.",
    "heads.png": "Every attention head: C (left) and DLA (right); red raises the target, blue lowers it, "
    "white is no effect; each panel has its own symmetric scale.",
    "trajectory.png": "The target's probability (top) and rank (bottom, log axis, top-1 at the top) at every "
    "residual point: the rank can climb while the probability stays near 0 (silent) before the "
    "probability jumps (loud); the dashed line marks where it first becomes top-1. With a tuned lens, its "
    "reading at each block boundary is drawn dashed in blue.",
    "linearity.png": "Is C additive? Against n, the number of the layer's top neurons by C taken together: "
    "C of their summed value vectors (purple, left axis) and the sum of their single C (green, right "
    "axis); the two coincide only if C is additive. The axes have their own scales unless the two "
    "series span alike (the title says which).",
    "neurons.png": "The neurons with the largest |C| (value vector m·W_out[:, k] added after attention), "
    "labelled L<layer>.N<neuron> with their coefficient m, and the tokens each one's value vector promotes "
    "most.",
    "layers": "Two rows per block, its attention (part attn) and its MLP (part mlp): C, DLA and bias_DLA, "
    "the sub-layer's output bias's share of its DLA.",
    "heads": "One row per head: C (v = the head's output, x = the block's input) and DLA.",
    "sources": "The attention sources with the largest |C|: what one head moved from one source position.",
    "neurons": "The neurons with the largest |C|: coefficient m, C, DLA and the tokens their value vector "
    "promotes most.",
    "trajectory": "The target at every residual point: probability, rank (0 = top-1) and log-probability.",
    "tuned_trajectory": "The target at every block boundary through the tuned lens (each layer's affine "
    "translator, then the logit lens): probability, rank and log-probability.",
    "query_contributions": "Which lower vectors switch an upper neuron on: its pre-activation = Σ shares + "
    "constant (MLP input norm frozen at the actual stream); the largest shares, residual = the check.",
    "linearity": "The linearity check's numbers: n, C of the sum of the top n neurons, sum of their C.",
    "experts": "Mixture of experts: the experts each block routed this token to, with the router's weight, "
    "C and DLA of what each wrote (its neurons' sum, weight included); only these experts wrote the "
    "prediction, and their DLA sums to the block's MLP DLA.",
    "sinks": "Attention sinks: the attention mass each head's learned sink logit took at the position "
    "(1 − the sum of its attention probabilities); the sink writes nothing.",
}
CORPUS_CAPTIONS = {
    "layers.png": "Each block's attention (blue) and MLP (orange), mean over sequences with 95% intervals: "
    "top, C (the change of log p of each position's next token); bottom, DLA to its logit.",
    "heads.png": "Every attention head's mean C (left) and mean DLA (right); red raises the next token, "
    "blue lowers it; each panel has its own symmetric scale.",
    "neurons.png": "The neurons with the largest mean |C| (95% intervals), with their mean coefficient m "
    "and the tokens their value vector promotes most.",
    "layers": "Four rows per block: the mean C and the mean DLA (metric) of its attention and of its MLP "
    "(part); ci_low and ci_high bound the 95% interval over sequences (nan here, empty in the CSV, with one "
    "sequence).",
    "heads": "Two rows per head: its mean C and its mean DLA with their 95% intervals.",
    "neurons": "The neurons with the largest mean |C|, two rows each: mean C and mean DLA (95% intervals), "
    "with the mean coefficient and the promoted tokens.",
}
