"""How to read each figure and table of `attribute`: the one-line captions attribute.html
shows under them, for one text (`CAPTIONS`) and for a corpus (`CORPUS_CAPTIONS`), keyed by
file name (figures) or table name and written for the result's ranking (`captions_of`); and
the line that says which score leads the outputs and where the scores' faithfulness is
measured (`ranking_line`, printed and on the page)."""

from __future__ import annotations

from resstream.analysis.attribution.results import (
    SCORE_NAMES,
    AttributeResult,
    CorpusAttribution,
    other_ranking,
)

__all__ = ["CAPTIONS", "CORPUS_CAPTIONS", "FAITHFULNESS", "SCORE_MEANINGS", "captions_of", "ranking_line"]

#: Where the scores' faithfulness is measured, as the summary and the page name it.
FAITHFULNESS = 'docs/causal.md "Measured faithfulness" (resstream ablate --faithfulness)'
#: What each score is, as the summary and the page say it.
SCORE_MEANINGS = {
    "dla": "DLA (direct logit attribution = minus the zero-ablation direct effect)",
    "c": "C (additive log-probability share, nats; the seed paper's score)",
}
#: What a panel of each score shows, as the figures' captions say it.
PANEL_MEANINGS = {
    "dla": "the direct logit attribution (DLA) through the final norm frozen at the actual final state, "
    "exactly minus the zero-ablation direct effect",
    "c": "C, an additive log-probability share: how much adding its output raised (above 0) or lowered "
    "log p(target)",
}
#: Which neurons a corpus lists, per ranking.
CORPUS_NEURONS = {"dla": "of all neurons", "c": "of those whose C was computed exactly"}

#: How to read each figure and table: the page's one-line captions ({lead}: the score the
#: outputs are ranked by, {beside}: the other one; `captions_of` fills them in).
CAPTIONS = {
    "layers.png": "Each block's attention (blue) and MLP (orange): top, {lead_meaning}; bottom, "
    "{beside_meaning}. Direct effects only.",
    "heads.png": "Every attention head: {lead} (left, what the outputs are ranked by) and {beside} (right); "
    "red raises the target, blue lowers it, white is no effect; each panel has its own symmetric scale.",
    "trajectory.png": "The target's probability (top) and rank (bottom, log axis, top-1 at the top) at every "
    "residual point: the rank can climb while the probability stays near 0 (silent) before the "
    "probability jumps (loud); the dashed line marks where it first becomes top-1. With a tuned lens, its "
    "reading at each block boundary is drawn dashed in blue.",
    "linearity.png": "Is C additive? Against n, the number of the layer's top neurons by C taken together: "
    "C of their summed value vectors (purple, left axis) and the sum of their single C (green, right "
    "axis); the two coincide only if C is additive. The axes have their own scales unless the two "
    "series span alike (the title says which).",
    "neurons.png": "The neurons with the largest |{lead}| (value vector m·W_out[:, k] added after "
    "attention): {lead} (left) and {beside} (right), labelled L<layer>.N<neuron> with their coefficient m, "
    "and the tokens each one's value vector promotes most.",
    "layers": "Two rows per block, its attention (part attn) and its MLP (part mlp): C, DLA and bias_DLA, "
    "the sub-layer's output bias's share of its DLA.",
    "heads": "One row per head: C (v = the head's output, x = the block's input) and DLA.",
    "sources": "The attention sources with the largest |{lead}| (L<layer>.H<head>.S<source> in the "
    "interventions): what one head moved from one source position.",
    "neurons": "The neurons with the largest |{lead}|: coefficient m, C, DLA and the tokens their value "
    "vector promotes most.",
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
    "layers.png": "Each block's attention (blue) and MLP (orange), mean over sequences with 95% intervals "
    "(each position's next token the target): top, {lead_meaning}; bottom, {beside_meaning}.",
    "heads.png": "Every attention head's mean {lead} (left, what the outputs are ranked by) and mean "
    "{beside} (right); red raises the next token, blue lowers it; each panel has its own symmetric scale.",
    "neurons.png": "The neurons with the largest mean |{lead}| ({among}), 95% intervals: mean {lead} "
    "(left) and mean {beside} (right), with their mean coefficient m and the tokens their value vector "
    "promotes most.",
    "layers": "Four rows per block: the mean C and the mean DLA (metric) of its attention and of its MLP "
    "(part); ci_low and ci_high bound the 95% interval over sequences (nan here, empty in the CSV, with one "
    "sequence).",
    "heads": "Two rows per head: its mean C and its mean DLA with their 95% intervals.",
    "neurons": "The neurons with the largest mean |{lead}| ({among}), two rows each: mean C and mean DLA "
    "(95% intervals), with the mean coefficient and the promoted tokens.",
}


def ranking_line(result: AttributeResult | CorpusAttribution) -> str:
    """Which score leads (`rank_by`) and which is beside it, and where their faithfulness is
    measured."""
    lead, beside = result.rank_by, other_ranking(result.rank_by)
    return (
        f"ranked by {SCORE_MEANINGS[lead]}, {SCORE_MEANINGS[beside]} beside it; "
        f"which predicts ablation: {FAITHFULNESS}"
    )


def captions_of(result: AttributeResult | CorpusAttribution) -> dict[str, str]:
    """How to read each figure and table of `result`, keyed by file or table name, in the
    order of its ranking (`rank_by`: the leading score first)."""
    lead, beside = result.rank_by, other_ranking(result.rank_by)
    names = {
        "lead": SCORE_NAMES[lead],
        "beside": SCORE_NAMES[beside],
        "lead_meaning": PANEL_MEANINGS[lead],
        "beside_meaning": PANEL_MEANINGS[beside],
        "among": CORPUS_NEURONS[lead],
    }
    captions = CORPUS_CAPTIONS if isinstance(result, CorpusAttribution) else CAPTIONS
    return {name: text.format(**names) for name, text in captions.items()}
