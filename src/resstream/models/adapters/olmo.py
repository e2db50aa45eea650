"""Adapter for OLMo-2 and OLMo-3.

No norm before attention or the MLP: each sub-layer reads the residual stream itself, and its
output is normalised inside the residual branch before it is added,
y = x + post_attention_layernorm(attn(x)), out = y + post_feedforward_layernorm(mlp(y)).
The view has ln1 = ln2 = None and those two RMSNorms as `post_attn_norm` / `post_mlp_norm`.
QK-norm: `self_attn.q_norm` / `k_norm` are RMSNorms over ALL heads' concatenated queries
(n_heads·head_dim) and keys (n_kv_heads·head_dim), applied after q_proj / k_proj and before
rotary (`BlockView.qk_norm_span` "all"). Otherwise Llama's pieces: q/k/v/o projections as
`nn.Linear` (grouped-query), gated `mlp`, final norm `model.norm`, h_0 the plain token
embedding, untied unembedding by default. OLMo-3 has the same blocks; its sliding-window
layers (`config.layer_types`, each type with its own rotary parameters) change only the
attention, which the model's own forward computes.
"""

from __future__ import annotations

from dataclasses import replace

from resstream.models.adapters.base import DynamicModule, ModelView
from resstream.models.adapters.layout import BlockLayout
from resstream.models.adapters.llama import BLOCK, llama_like_view, with_qk_norm
from resstream.models.adapters.registry import register

#: OLMo-2's block: Llama's projections, no pre-norms, post-sub-layer norms inside the branch,
#: QK-norm over all heads.
POST_NORM_BLOCK = with_qk_norm(
    BlockLayout(
        attention=replace(BLOCK.attention, norm=None, post_norm="post_attention_layernorm"),
        mlp=replace(BLOCK.mlp, norm=None, post_norm="post_feedforward_layernorm"),
    ),
    span="all",
)
POST_NORM_NOTE = (
    "no norm before attention or the MLP: each reads the residual stream itself, and its "
    "output is RMS-normalised before it is added (post_attention_layernorm, "
    "post_feedforward_layernorm)"
)


@register("olmo2")
def olmo2_view(model: DynamicModule) -> ModelView:
    """The view of an OLMo-2 causal LM."""
    return llama_like_view(model, "olmo2", layout=POST_NORM_BLOCK, notes=(POST_NORM_NOTE,))


@register("olmo3")
def olmo3_view(model: DynamicModule) -> ModelView:
    """The view of an OLMo-3 causal LM (OLMo-2's blocks; some layers attend in a sliding window)."""
    return llama_like_view(model, "olmo3", layout=POST_NORM_BLOCK, notes=(POST_NORM_NOTE,))
