"""Adapter for GPT-2 (`GPT2LMHeadModel`).

Pre-norm LayerNorm blocks (`ln_1`, `attn`, `ln_2`, `mlp`) with biases everywhere; learned
absolute positions added to the token embedding (h_0 = wte[t] + wpe[i]); final norm `ln_f`.
Attention's `c_proj` is a `Conv1D`, whose weight is stored (in, out). Tied by default.
Hugging Face's last `hidden_states` entry is after `ln_f`; h_L here is the last block's output.
"""

from __future__ import annotations

from functools import partial

from torch import Tensor, nn

from resstream.models.adapters.base import AttentionWeights, BlockView, MLPWeights, ModelView
from resstream.models.adapters.registry import (
    bias_of,
    context_of,
    conv1d_W_O,
    hf_model_view,
    per_head,
    per_head_bias,
    positions,
    register,
)


def _attention_weights(attn: nn.Module, n_heads: int) -> AttentionWeights:
    """Q/K/V per head from `c_attn` (a Conv1D: weight (d_model, 3·d_model), columns q | k | v)."""
    weights = attn.c_attn.weight.split(attn.c_attn.weight.shape[1] // 3, dim=1)
    bias = attn.c_attn.bias
    biases = bias.split(bias.shape[0] // 3) if bias is not None else (None, None, None)
    W_Q, W_K, W_V = (per_head(w, n_heads) for w in weights)
    b_Q, b_K, b_V = (per_head_bias(b, n_heads) for b in biases)
    return AttentionWeights(W_Q, W_K, W_V, b_Q, b_K, b_V)


def _mlp_weights(mlp: nn.Module) -> MLPWeights:
    """GPT-2's MLP: act(x @ c_fc + b) @ c_proj + b (Conv1D weights are stored (in, out))."""
    return MLPWeights(
        W_in=mlp.c_fc.weight, b_in=mlp.c_fc.bias, W_out=mlp.c_proj.weight, b_out=mlp.c_proj.bias, act=mlp.act
    )


@register("gpt2")
def gpt2_view(model: nn.Module) -> ModelView:
    """The view of a GPT-2 causal LM."""
    config = model.config
    trunk = model.transformer
    n_heads = config.n_head
    blocks = tuple(
        BlockView(
            module=block,
            ln1=block.ln_1,
            attn=block.attn,
            ln2=block.ln_2,
            mlp=block.mlp,
            W_O=conv1d_W_O(block.attn.c_proj, n_heads),
            b_O=bias_of(block.attn.c_proj),
            out_proj=block.attn.c_proj,
            attention_weights=partial(_attention_weights, block.attn, n_heads),
            mlp_weights=partial(_mlp_weights, block.mlp),
            mlp_out_proj=block.mlp.c_proj,
        )
        for block in trunk.h
    )

    def embed(input_ids: Tensor) -> Tensor:
        pos = trunk.wpe(positions(input_ids))
        return trunk.drop(trunk.wte(input_ids) + pos.to(input_ids.device))

    return hf_model_view(
        model,
        family="gpt2",
        trunk=trunk,
        blocks=blocks,
        embed=embed,
        input_embedding=trunk.wte.weight,
        final_norm=trunk.ln_f,
        n_heads=n_heads,
        d_model=config.n_embd,
        max_positions=context_of(config),
    )
