"""Adapter for GPT-2 (`GPT2LMHeadModel`).

Pre-norm LayerNorm blocks (`ln_1`, `attn`, `ln_2`, `mlp`) with biases everywhere; learned
absolute positions added to the token embedding (h_0 = wte[t] + wpe[i]); final norm `ln_f`.
Attention's `c_proj` is a `Conv1D`, whose weight is stored (in, out). Tied by default.
Hugging Face's last `hidden_states` entry is after `ln_f`; h_L here is the last block's output.
"""

from __future__ import annotations

from torch import Tensor

from resstream.models.adapters.base import DynamicModule, MLPWeights, ModelView
from resstream.models.adapters.layout import BlockLayout, Sublayer, hf_model_view, positions
from resstream.models.adapters.registry import register
from resstream.models.adapters.weights import FusedQKV, conv1d_W_O, conv1d_weight, projection_mlp_weights

#: `c_attn`, a Conv1D (weight (d_model, 3·d_model)) whose output is q | k | v.
QKV = FusedQKV("c_attn", weight=conv1d_weight)


def _mlp_weights(mlp: DynamicModule) -> MLPWeights:
    """GPT-2's MLP: act(x @ c_fc + b) @ c_proj + b (Conv1D weights are stored (in, out))."""
    return projection_mlp_weights(mlp.c_fc, mlp.c_proj, mlp.act, weight=conv1d_weight)


BLOCK = BlockLayout(
    attention=Sublayer("attn", norm="ln_1", out_proj="c_proj", weights=QKV.weights, columns=QKV.columns),
    mlp=Sublayer("mlp", norm="ln_2", out_proj="c_proj", weights=_mlp_weights),
    read_W_O=conv1d_W_O,
)


@register("gpt2")
def gpt2_view(model: DynamicModule) -> ModelView:
    """The view of a GPT-2 causal LM."""
    config = model.config
    trunk = model.transformer

    def embed(input_ids: Tensor) -> Tensor:
        pos = trunk.wpe(positions(input_ids))
        return trunk.drop(trunk.wte(input_ids) + pos.to(input_ids.device))

    return hf_model_view(
        model,
        family="gpt2",
        blocks=BLOCK.views(trunk.h, config.n_head),
        embed=embed,
        final_norm=trunk.ln_f,
    )
