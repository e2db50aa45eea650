"""Adapter for Gemma, Gemma-2 and Gemma-3 (text).

All three: RMSNorm with a (1 + weight) scale, token embeddings multiplied by sqrt(hidden_size)
(in transformers 5.x inside `Gemma*TextScaledWordEmbedding.forward`, in 4.x inside the model's
forward: both are handled), rotary positions, tied unembedding, no biases.
Gemma: Llama's block layout (`input_layernorm`, `self_attn`, `post_attention_layernorm` =
the norm before the MLP, `mlp`).
Gemma-2: four norms per block: `input_layernorm` before attention, `post_attention_layernorm`
on the attention output before it is added, `pre_feedforward_layernorm` before the MLP,
`post_feedforward_layernorm` on the MLP output; final logits are soft-capped with
`final_logit_softcapping` (tanh(x / c) * c).
Gemma-3 (`Gemma3ForCausalLM`, model_type "gemma3_text"): Gemma-2's four norms, plus QK-norm:
`self_attn.q_norm` / `k_norm` (Gemma RMSNorms over one head's head_dim) normalise queries and
keys before rotary (`BlockView.q_norm`, span "head"). Sliding-window and global layers
(`config.layer_types`, each with its own rotary base), `query_pre_attn_scalar` and the
optional attention soft-capping change only the attention probabilities, which are read from
the model. Final logits are soft-capped where `final_logit_softcapping` is set. A config with
`use_bidirectional_attention` (an embedding model, not a causal LM) is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from resstream.errors import UsageError
from resstream.models.adapters.base import DynamicModule, ModelView
from resstream.models.adapters.layout import BlockLayout
from resstream.models.adapters.llama import BLOCK, SANDWICH_BLOCK, llama_like_view, with_qk_norm
from resstream.models.adapters.registry import register


def _embedder(trunk: DynamicModule, d_model: int) -> tuple[Callable[[Tensor], Tensor], float]:
    """The embedding function (scaled as the model scales it) and its scale."""
    module = trunk.embed_tokens
    if hasattr(module, "embed_scale"):  # transformers 5.x: the module scales its output
        scale = float(getattr(module, "scalar_embed_scale", module.embed_scale))
        return module, scale
    scale = d_model**0.5  # transformers 4.x: the model multiplies by a normaliser of h's dtype

    def embed(input_ids: Tensor) -> Tensor:
        h = module(input_ids)
        return h * torch.tensor(scale, dtype=h.dtype, device=h.device)

    return embed, scale


def _gemma_view(model: DynamicModule, family: str, layout: BlockLayout, *, softcapped: bool) -> ModelView:
    """The view of a Gemma-family model with blocks laid out as `layout`; `softcapped`: the
    family soft-caps its final logits where `final_logit_softcapping` is set."""
    config = model.config
    if getattr(config, "use_bidirectional_attention", False):
        raise UsageError(
            f"{family} config has use_bidirectional_attention set: an embedding model whose "
            "positions see later tokens, not a causal LM; resstream reads causal LMs only"
        )
    embed, scale = _embedder(model.model, config.hidden_size)
    softcap = getattr(config, "final_logit_softcapping", None) if softcapped else None
    notes: tuple[str, ...] = (f"token embeddings are scaled by sqrt(d_model) = {scale:g}",)
    if softcap is not None:
        notes += (f"final logits are soft-capped: tanh(x / {softcap:g}) * {softcap:g}",)
    return llama_like_view(
        model,
        family,
        layout=layout,
        embed=embed,
        notes=notes,
        logit_softcap=float(softcap) if softcap is not None else None,
        embed_scale=scale,
    )


@register("gemma")
def gemma_view(model: DynamicModule) -> ModelView:
    """The view of a Gemma causal LM."""
    return _gemma_view(model, "gemma", BLOCK, softcapped=False)


@register("gemma2")
def gemma2_view(model: DynamicModule) -> ModelView:
    """The view of a Gemma-2 causal LM (post-sublayer norms, logit soft-capping)."""
    return _gemma_view(model, "gemma2", SANDWICH_BLOCK, softcapped=True)


@register("gemma3_text")
def gemma3_text_view(model: DynamicModule) -> ModelView:
    """The view of a Gemma-3 text causal LM (Gemma-2's sandwich norms, QK-norm)."""
    return _gemma_view(model, "gemma3_text", with_qk_norm(SANDWICH_BLOCK), softcapped=True)
