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

from resstream.models.adapters.base import BlockView, ModelView
from resstream.models.adapters.registry import (
    bias_of,
    context_of,
    hf_model_view,
    linear_W_O,
    register,
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
