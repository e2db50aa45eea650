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

from torch import Tensor

from resstream.models.adapters.base import DynamicModule, MLPWeights, ModelView
from resstream.models.adapters.layout import BlockLayout, Sublayer, hf_model_view
from resstream.models.adapters.registry import register
from resstream.models.adapters.weights import FusedQKV, projection_mlp_weights

#: The fused `query_key_value`, laid out per head as [q_h | k_h | v_h]: the grouped layout
#: with one head per group.
QKV = FusedQKV("query_key_value", grouped=True)


def _mlp_weights(mlp: DynamicModule) -> MLPWeights:
    """GPT-NeoX's MLP: dense_4h_to_h(act(dense_h_to_4h(x)))."""
    return projection_mlp_weights(mlp.dense_h_to_4h, mlp.dense_4h_to_h, mlp.act)


BLOCK = BlockLayout(
    attention=Sublayer(
        "attention", norm="input_layernorm", out_proj="dense", weights=QKV.weights, columns=QKV.columns
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
        blocks=BLOCK.views(trunk.layers, config.num_attention_heads, parallel=parallel),
        embed=embed,
        final_norm=trunk.final_layer_norm,
        notes=notes,
    )
