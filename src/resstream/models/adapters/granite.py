"""Adapter for Granite (`GraniteForCausalLM`).

Llama's layout (`model.layers[l]`: `input_layernorm`, `self_attn`, `post_attention_layernorm`
= the norm before the MLP, gated `mlp`; final `model.norm`), with four constant multipliers:

* `embedding_multiplier`: h_0 = embedding_multiplier · W_E[t] (`model.model` multiplies the
  token embedding before block 0); the view's `embed` returns exactly that product and its
  `embed_scale` is the multiplier;
* `residual_multiplier`: each sub-layer's output is multiplied by it before it is added,
  x + r·attn(ln1(x)), then y + r·mlp(ln2(y)); every block's `post_attn_norm` and
  `post_mlp_norm` are `InlineScale(r)`, so capture and the decomposition count r·output, the
  linear map the model applies;
* `attention_multiplier` replaces 1/√d_head as the scale of attention logits: it changes
  only attention probabilities;
* `logits_scaling`: the model DIVIDES its logits by it; the view's final norm is
  `InlineScale(1 / logits_scaling, model.norm)`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import Tensor

from resstream.models.adapters.base import BlockView, DynamicModule, InlineScale, ModelView
from resstream.models.adapters.llama import llama_like_view
from resstream.models.adapters.registry import register


def _scaled_residual(block: BlockView) -> BlockView:
    """`block` whose sub-layer outputs are multiplied by its `residual_multiplier` before they are added."""
    layer: DynamicModule = block.module
    factor = float(layer.residual_multiplier)
    return replace(block, post_attn_norm=InlineScale(factor), post_mlp_norm=InlineScale(factor))


def _notes(config: Any) -> tuple[str, ...]:
    """The four multipliers and where the view applies them."""
    return (
        f"token embeddings are multiplied by embedding_multiplier = {config.embedding_multiplier:g}",
        f"each sub-layer's output is multiplied by residual_multiplier = {config.residual_multiplier:g} "
        "before it is added (post_attn_norm / post_mlp_norm are that InlineScale)",
        f"attention logits are scaled by attention_multiplier = {config.attention_multiplier:g} "
        "instead of 1/sqrt(d_head): only attention probabilities change",
        f"final logits are divided by logits_scaling = {config.logits_scaling:g}: the view's final "
        "norm is InlineScale(1 / logits_scaling, model.norm)",
    )


@register("granite")
def granite_view(model: DynamicModule) -> ModelView:
    """The view of a Granite causal LM (Llama's layout with embedding, residual, attention and
    logit multipliers)."""
    trunk = model.model
    multiplier = trunk.embedding_multiplier

    def embed(input_ids: Tensor) -> Tensor:
        return trunk.embed_tokens(input_ids) * multiplier

    view = llama_like_view(
        model, "granite", embed=embed, notes=_notes(model.config), embed_scale=float(multiplier)
    )
    return replace(
        view,
        blocks=tuple(_scaled_residual(block) for block in view.blocks),
        final_norm=InlineScale(1 / model.config.logits_scaling, view.final_norm),
    )
