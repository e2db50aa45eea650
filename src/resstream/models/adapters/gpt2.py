"""Adapter for GPT-2 (`GPT2LMHeadModel`).

Pre-norm LayerNorm blocks (`ln_1`, `attn`, `ln_2`, `mlp`) with biases everywhere; learned
absolute positions added to the token embedding (h_0 = wte[t] + wpe[i]); final norm `ln_f`.
Attention's `c_proj` is a `Conv1D`, whose weight is stored (in, out). Tied by default.
Hugging Face's last `hidden_states` entry is after `ln_f`; h_L here is the last block's output.
"""

from __future__ import annotations

from torch import Tensor, nn

from resstream.models.adapters.base import BlockView, ModelView
from resstream.models.adapters.registry import (
    bias_of,
    context_of,
    conv1d_W_O,
    hf_model_view,
    positions,
    register,
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
