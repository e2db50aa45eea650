"""Adapter for Llama and the families that share its layout: Mistral and Qwen2.

Pre-norm RMSNorm blocks: `input_layernorm`, `self_attn` (q/k/v/o projections as
`nn.Linear`; rotary positions, grouped-query attention), `post_attention_layernorm` (the norm
before the MLP), gated `mlp`; final norm `model.norm`. h_0 is the plain token embedding.
Biases: none in Llama/Mistral by default (Llama's `attention_bias` may add them, o_proj
included); Qwen2 has q/k/v biases but no o_proj bias. Llama and Mistral are untied by
default, small Qwen2 models tied. `head_dim` may differ from hidden_size / n_heads.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from torch import Tensor, nn

from resstream.models.adapters.base import AttentionWeights, BlockView, MLPWeights, ModelView
from resstream.models.adapters.registry import (
    bias_of,
    context_of,
    hf_model_view,
    linear_W_O,
    linear_weight,
    per_head,
    per_head_bias,
    register,
    repeat_heads,
)


def _attention_weights(attn: nn.Module, n_heads: int) -> AttentionWeights:
    """Q/K/V per query head from q/k/v_proj; grouped key/value heads repeated (`repeat_heads`)."""

    def read(proj: nn.Module) -> tuple[Tensor, Tensor | None]:
        W = linear_weight(proj)
        heads = W.shape[1] // attn.head_dim
        W_h = repeat_heads(per_head(W, heads), n_heads)
        return W_h, repeat_heads(per_head_bias(bias_of(proj), heads), n_heads)

    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = (read(p) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    return AttentionWeights(W_Q, W_K, W_V, b_Q, b_K, b_V)


def _mlp_weights(mlp: nn.Module) -> MLPWeights:
    """The gated MLP: down_proj(act(gate_proj(x)) * up_proj(x))."""
    return MLPWeights(
        W_in=linear_weight(mlp.gate_proj),
        b_in=bias_of(mlp.gate_proj),
        W_up=linear_weight(mlp.up_proj),
        b_up=bias_of(mlp.up_proj),
        W_out=linear_weight(mlp.down_proj),
        b_out=bias_of(mlp.down_proj),
        act=mlp.act_fn,
    )


def llama_like_blocks(trunk: nn.Module, n_heads: int, *, sandwich: bool = False) -> tuple[BlockView, ...]:
    """The blocks of Llama's layout (`trunk.layers[l]`: `input_layernorm`, `self_attn` with
    `o_proj`, `post_attention_layernorm`, `mlp`). `sandwich` is Gemma-2's variant: the norm
    before the MLP is `pre_feedforward_layernorm`, and `post_attention_layernorm` /
    `post_feedforward_layernorm` normalise the sublayer outputs before they are added."""
    return tuple(
        BlockView(
            module=layer,
            ln1=layer.input_layernorm,
            attn=layer.self_attn,
            ln2=layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm,
            mlp=layer.mlp,
            W_O=linear_W_O(layer.self_attn.o_proj, n_heads),
            b_O=bias_of(layer.self_attn.o_proj),
            post_attn_norm=layer.post_attention_layernorm if sandwich else None,
            post_mlp_norm=layer.post_feedforward_layernorm if sandwich else None,
            out_proj=layer.self_attn.o_proj,
            attention_weights=partial(_attention_weights, layer.self_attn, n_heads),
            mlp_weights=partial(_mlp_weights, layer.mlp),
            mlp_out_proj=layer.mlp.down_proj,
        )
        for layer in trunk.layers
    )


def llama_like_view(
    model: nn.Module,
    family: str,
    *,
    sandwich: bool = False,
    embed: Callable[[Tensor], Tensor] | None = None,
    notes: tuple[str, ...] = (),
    **extra: Any,
) -> ModelView:
    """The view of a model with Llama's layout (`model.model.layers[l].self_attn.o_proj` ...).

    Gemma and Gemma-2 share it and pass what they do differently: `sandwich` blocks
    (`llama_like_blocks`), their scaled `embed` (default: the plain token embedding), their
    `notes`, and the rarer `ModelView` fields (soft-capping, embedding scale) in `extra`.
    """
    config = model.config
    trunk = model.model
    n_heads = config.num_attention_heads
    return hf_model_view(
        model,
        family=family,
        trunk=trunk,
        blocks=llama_like_blocks(trunk, n_heads, sandwich=sandwich),
        embed=embed or trunk.embed_tokens,
        input_embedding=trunk.embed_tokens.weight,
        final_norm=trunk.norm,
        n_heads=n_heads,
        d_model=config.hidden_size,
        max_positions=context_of(config),
        notes=notes,
        **extra,
    )


@register("llama")
def llama_view(model: nn.Module) -> ModelView:
    """The view of a Llama causal LM."""
    return llama_like_view(model, "llama")


@register("mistral")
def mistral_view(model: nn.Module) -> ModelView:
    """The view of a Mistral causal LM."""
    return llama_like_view(model, "mistral")


@register("qwen2")
def qwen2_view(model: nn.Module) -> ModelView:
    """The view of a Qwen2 causal LM."""
    return llama_like_view(model, "qwen2")
