"""The common view of a causal LM's residual stream that every analysis works through.

An adapter maps one model family onto `ModelView`. Residual states follow docs/design.md:
h_0 is the input of block 0 (after any embedding scaling or positional embedding the model
applies); h_l (l = 1..L) is the output of block l, taken before the final norm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor, nn


@dataclass(frozen=True)
class BlockView:
    """One Transformer block.

    `ln1`/`ln2` are the norms before attention / MLP (None where a family has none);
    `attn` and `mlp` the sub-modules whose outputs are added to the residual stream (for
    families with post-sublayer norms, e.g. Gemma-2, the extra norms are `post_attn_norm` /
    `post_mlp_norm`). `W_O` is the attention output projection as (n_heads, d_head, d_model),
    so head h writes z_h @ W_O[h]; `b_O` its bias (d_model) or None. `out_proj` is the module
    that applies W_O: its input is the concatenation of the per-head z (hook it to get z).

    `parallel`: attention and MLP both read the block input (GPT-NeoX's parallel residual:
    out = x + attn(ln1(x)) + mlp(ln2(x))). `norm_position`: "pre" (the usual
    out = y + mlp(ln2(y)), y = x + attn(ln1(x))) or "post" (resstream's post-norm variant:
    ln1 and ln2 are applied to the residual sums, y = ln1(x + attn(x)), out = ln2(y + mlp(y))).
    """

    module: nn.Module
    ln1: nn.Module | None
    attn: nn.Module
    ln2: nn.Module | None
    mlp: nn.Module
    W_O: Tensor
    b_O: Tensor | None = None
    post_attn_norm: nn.Module | None = None
    post_mlp_norm: nn.Module | None = None
    out_proj: nn.Module | None = None
    parallel: bool = False
    norm_position: str = "pre"


@dataclass(frozen=True)
class ModelView:
    """A model seen through its residual stream (see the module docstring)."""

    family: str
    model: nn.Module
    embed: Callable[[Tensor], Tensor]  # token ids (batch, seq) -> h_0 (batch, seq, d_model)
    blocks: tuple[BlockView, ...]
    final_norm: nn.Module
    W_U: Tensor  # (vocab, d_model)
    W_E: Tensor  # (vocab, d_model)
    tied: bool
    n_heads: int
    d_model: int
    max_positions: int | None
    b_U: Tensor | None = None  # (vocab,)
    logit_softcap: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # h_0 = embed_scale * W_E[t] (+ positional embedding): sqrt(d_model) for Gemma, else 1.
    embed_scale: float = 1.0
    # Runs the model's own forward once through every block: (input_ids, attention_mask) ->
    # anything (the LM head may be skipped). `capture.residual_states` hooks the blocks around it.
    forward: Callable[[Tensor, Tensor | None], object] | None = None
    # (input_ids) -> per-layer attention probabilities, each (batch, heads, query, key), for
    # models whose own forward cannot return them; None: Hugging Face's output_attentions
    # under the eager attention implementation (`capture.attention_probs`).
    attention: Callable[[Tensor], tuple[Tensor, ...]] | None = None

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @property
    def d_head(self) -> int:
        """Width of one attention head (from W_O: some families set head_dim explicitly)."""
        if self.blocks:
            return int(self.blocks[0].W_O.shape[1])
        return self.d_model // self.n_heads
