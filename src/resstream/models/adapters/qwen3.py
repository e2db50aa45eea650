"""Adapter for Qwen3.

Llama's pre-norm layout (`input_layernorm`, `self_attn`, `post_attention_layernorm` = the norm
before the MLP, gated `mlp`; final norm `model.norm`; h_0 the plain token embedding; no
biases unless `attention_bias`), plus QK-norm: `self_attn.q_norm` / `k_norm`, RMSNorms over
one head's head_dim, normalise each head's query and key after q_proj / k_proj and before
rotary (`BlockView.q_norm` / `k_norm`, span "head"). Sliding-window layers
(`config.layer_types`) change only the attention mask, which the model's own forward applies.
Small Qwen3 models tie their unembedding to the token embedding.
"""

from __future__ import annotations

from resstream.models.adapters.base import DynamicModule, ModelView
from resstream.models.adapters.llama import BLOCK, llama_like_view, with_qk_norm
from resstream.models.adapters.registry import register

#: Qwen3's block: Llama's, with per-head QK-norm.
QK_NORM_BLOCK = with_qk_norm(BLOCK)


@register("qwen3")
def qwen3_view(model: DynamicModule) -> ModelView:
    """The view of a Qwen3 causal LM."""
    return llama_like_view(model, "qwen3", layout=QK_NORM_BLOCK)
