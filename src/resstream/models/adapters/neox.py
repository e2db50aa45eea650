"""Adapter for GPT-NeoX / Pythia (`GPTNeoXForCausalLM`).

Pre-norm LayerNorm blocks: `input_layernorm` before `attention`, `post_attention_layernorm`
before `mlp` (despite its name). With `use_parallel_residual` (Pythia's default) attention
and MLP both read the block input: out = x + attn(ln1(x)) + mlp(ln2(x)) (`BlockView.parallel`).
Rotary positions inside attention, so h_0 is the token embedding `embed_in[t]`. Attention's
`dense` output projection is an `nn.Linear` with bias. The unembedding (`lm_head` in
transformers 5.x, `embed_out` in 4.x checkpoints' naming) is untied in Pythia; final norm
`final_layer_norm`.
"""

from __future__ import annotations

from functools import partial

from torch import Tensor, nn

from resstream.models.adapters.base import AttentionWeights, BlockView, MLPWeights, ModelView
from resstream.models.adapters.registry import (
    bias_of,
    context_of,
    hf_model_view,
    linear_W_O,
    linear_weight,
    register,
)


def _attention_weights(attention: nn.Module, n_heads: int) -> AttentionWeights:
    """Q/K/V per head from the fused `query_key_value` Linear, whose output is laid out per
    head as [q_h | k_h | v_h] (viewed (…, n_heads, 3·d_head) and chunked in three)."""
    W = linear_weight(attention.query_key_value)  # (d_model, n_heads * 3 * d_head)
    d_model = W.shape[0]
    W_Q, W_K, W_V = W.reshape(d_model, n_heads, 3, -1).permute(2, 1, 0, 3).unbind(0)
    bias = attention.query_key_value.bias
    b_Q = b_K = b_V = None
    if bias is not None:
        b_Q, b_K, b_V = bias.reshape(n_heads, 3, -1).unbind(1)
    return AttentionWeights(W_Q, W_K, W_V, b_Q, b_K, b_V)


def _mlp_weights(mlp: nn.Module) -> MLPWeights:
    """GPT-NeoX's MLP: dense_4h_to_h(act(dense_h_to_4h(x)))."""
    return MLPWeights(
        W_in=linear_weight(mlp.dense_h_to_4h),
        b_in=mlp.dense_h_to_4h.bias,
        W_out=linear_weight(mlp.dense_4h_to_h),
        b_out=mlp.dense_4h_to_h.bias,
        act=mlp.act,
    )


@register("gpt_neox")
def neox_view(model: nn.Module) -> ModelView:
    """The view of a GPT-NeoX causal LM."""
    config = model.config
    trunk = model.gpt_neox
    n_heads = config.num_attention_heads
    parallel = bool(getattr(config, "use_parallel_residual", False))
    blocks = tuple(
        BlockView(
            module=layer,
            ln1=layer.input_layernorm,
            attn=layer.attention,
            ln2=layer.post_attention_layernorm,
            mlp=layer.mlp,
            W_O=linear_W_O(layer.attention.dense, n_heads),
            b_O=bias_of(layer.attention.dense),
            out_proj=layer.attention.dense,
            parallel=parallel,
            attention_weights=partial(_attention_weights, layer.attention, n_heads),
            mlp_weights=partial(_mlp_weights, layer.mlp),
            mlp_out_proj=layer.mlp.dense_4h_to_h,
        )
        for layer in trunk.layers
    )

    def embed(input_ids: Tensor) -> Tensor:
        return trunk.emb_dropout(trunk.embed_in(input_ids))

    notes = ("parallel residual: attention and MLP both read the block input",) if parallel else ()
    return hf_model_view(
        model,
        family="gpt_neox",
        trunk=trunk,
        blocks=blocks,
        embed=embed,
        input_embedding=trunk.embed_in.weight,
        final_norm=trunk.final_layer_norm,
        n_heads=n_heads,
        d_model=config.hidden_size,
        max_positions=context_of(config),
        notes=notes,
    )
