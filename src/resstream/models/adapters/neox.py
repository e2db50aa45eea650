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

from torch import Tensor, nn

from resstream.models.adapters.base import AttentionWeights, DynamicModule, MLPWeights, ModelView
from resstream.models.adapters.layout import BlockLayout, Sublayer, hf_model_view
from resstream.models.adapters.registry import register
from resstream.models.adapters.weights import (
    grouped_qkv_weights,
    interleaved_qkv_columns,
    linear_weight,
    projection_mlp_weights,
)


def _attention_weights(attention: DynamicModule, n_heads: int) -> AttentionWeights:
    """Q/K/V per head from the fused `query_key_value` Linear, whose output is laid out per
    head as [q_h | k_h | v_h]: the grouped layout with one head per group."""
    proj = attention.query_key_value
    return grouped_qkv_weights(proj, n_heads, d_head=linear_weight(proj).shape[1] // (3 * n_heads))


def _qkv_columns(attention: DynamicModule, n_heads: int, which: str, head: int) -> tuple[nn.Module, Tensor]:
    """Head h's query, key or value columns of `query_key_value`'s output ([q_h | k_h | v_h] per head)."""
    proj = attention.query_key_value
    return proj, interleaved_qkv_columns(linear_weight(proj).shape[1], n_heads, which, head)


def _mlp_weights(mlp: DynamicModule) -> MLPWeights:
    """GPT-NeoX's MLP: dense_4h_to_h(act(dense_h_to_4h(x)))."""
    return projection_mlp_weights(mlp.dense_h_to_4h, mlp.dense_4h_to_h, mlp.act)


BLOCK = BlockLayout(
    attention=Sublayer(
        "attention",
        norm="input_layernorm",
        out_proj="dense",
        weights=_attention_weights,
        columns=_qkv_columns,
    ),
    mlp=Sublayer("mlp", norm="post_attention_layernorm", out_proj="dense_4h_to_h", weights=_mlp_weights),
)


@register("gpt_neox")
def neox_view(model: DynamicModule) -> ModelView:
    """The view of a GPT-NeoX causal LM."""
    config = model.config
    trunk = model.gpt_neox
    parallel = bool(getattr(config, "use_parallel_residual", False))

    def embed(input_ids: Tensor) -> Tensor:
        return trunk.emb_dropout(trunk.embed_in(input_ids))

    notes = ("parallel residual: attention and MLP both read the block input",) if parallel else ()
    return hf_model_view(
        model,
        family="gpt_neox",
        trunk=trunk,
        blocks=BLOCK.views(trunk.layers, config.num_attention_heads, parallel=parallel),
        embed=embed,
        input_embedding=trunk.embed_in.weight,
        final_norm=trunk.final_layer_norm,
        n_heads=config.num_attention_heads,
        d_model=config.hidden_size,
        notes=notes,
    )
