"""Adapter for Cohere (Command-R, `CohereForCausalLM`).

One parallel block per layer (`model.layers[l]`), x + attn(ln(x)) + mlp(ln(x)), with ONE
`input_layernorm` whose output both sub-layers read (the view's ln1 and ln2 are that
module). Every norm is a `CohereLayerNorm`: mean-centring LayerNorm with a gain and no bias
(`analysis.norms` reads it). Attention: Llama's q/k/v/o projections (grouped-query, biases
where `attention_bias`); with `config.use_qk_norm`, `q_norm` / `k_norm` are CohereLayerNorms
over one head's d_head whose gain is 2-D, one row per head ((n_heads, d_head) for queries,
(n_kv_heads, d_head) for keys), applied before rotary (the view's q_norm / k_norm, span
"head"). Rotary positions (interleaved pairs) change only attention probabilities. Gated
MLP down_proj(act(gate_proj(x)) · up_proj(x)); final norm `model.norm`; the LM head is tied
to the embedding, and the model MULTIPLIES its logits by `config.logit_scale`: the view's
final norm is `InlineScale(logit_scale, model.norm)`, so decoding any state applies it.
"""

from __future__ import annotations

from dataclasses import replace

from resstream.models.adapters.base import DynamicModule, InlineScale, ModelView
from resstream.models.adapters.layout import BlockLayout, hf_model_view
from resstream.models.adapters.llama import BLOCK as LLAMA_BLOCK
from resstream.models.adapters.llama import shared_norm_notes, with_qk_norm
from resstream.models.adapters.registry import register


def cohere_layout(use_qk_norm: bool) -> BlockLayout:
    """Llama's attention and MLP in a parallel block read through one `input_layernorm`; with
    `use_qk_norm`, attention's per-head `q_norm` / `k_norm`."""
    shared_norm = replace(LLAMA_BLOCK.mlp, norm="input_layernorm")
    layout = BlockLayout(attention=LLAMA_BLOCK.attention, mlp=shared_norm)
    return with_qk_norm(layout) if use_qk_norm else layout


def _notes(logit_scale: float, use_qk_norm: bool) -> tuple[str, ...]:
    """The parallel block, the logit scale and the QK-norm."""
    scale = (
        f"final logits are multiplied by logit_scale = {logit_scale:g}: the view's final norm is "
        "InlineScale(logit_scale, model.norm)"
    )
    qk_norm = "layer-normalised (mean-centred, one gain row per key/value head)" if use_qk_norm else None
    return shared_norm_notes(scale, qk_norm)


@register("cohere")
def cohere_view(model: DynamicModule) -> ModelView:
    """The view of a Cohere causal LM (parallel blocks, logit scale)."""
    config = model.config
    trunk = model.model
    use_qk_norm = bool(config.use_qk_norm)
    return hf_model_view(
        model,
        family="cohere",
        blocks=cohere_layout(use_qk_norm).views(trunk.layers, config.num_attention_heads, parallel=True),
        final_norm=InlineScale(model.logit_scale, trunk.norm),
        notes=_notes(model.logit_scale, use_qk_norm),
    )
