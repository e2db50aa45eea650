"""Adapter for resstream's own GPT (`resstream.training.model.GPT`).

Layout: `wte` (+ learned `wpe`, or rotary inside attention), blocks with `ln1`, `attn`
(`c_attn`, `c_proj` as `nn.Linear`), `ln2`, `mlp`; `final_norm`; the unembedding is tied to
`wte.weight`. Pre-norm by default; the post-norm variant applies `ln1`/`ln2` to the residual
sums (`BlockView.norm_position == "post"`) and has an identity final norm. Gated models scale
the identity path of their blocks by α from `model.gate` (stated in the notes).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import Tensor, nn

from resstream.models.adapters.base import AttentionWeights, BlockView, MLPWeights, ModelView
from resstream.models.adapters.registry import (
    bias_of,
    linear_W_O,
    linear_weight,
    per_head,
    per_head_bias,
    register,
)


def _attention_weights(attn: nn.Module, n_heads: int) -> AttentionWeights:
    """Q/K/V per head from `c_attn` (a Linear whose output is q | k | v, each d_model wide)."""
    W = linear_weight(attn.c_attn)
    W_Q, W_K, W_V = (per_head(w, n_heads) for w in W.split(W.shape[1] // 3, dim=1))
    bias = bias_of(attn.c_attn)
    biases = bias.split(bias.shape[0] // 3) if bias is not None else (None, None, None)
    b_Q, b_K, b_V = (per_head_bias(b, n_heads) for b in biases)
    return AttentionWeights(W_Q, W_K, W_V, b_Q, b_K, b_V)


def _mlp_weights(mlp: nn.Module) -> MLPWeights:
    """c_proj(act(c_fc(x))), the activation being the module's own `act`."""
    return MLPWeights(
        W_in=linear_weight(mlp.c_fc),
        b_in=bias_of(mlp.c_fc),
        W_out=linear_weight(mlp.c_proj),
        b_out=bias_of(mlp.c_proj),
        act=mlp.act,
    )


def _gate_alpha(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """The α a resstream block is called with (`Block.forward(x, alpha)`), None for 1."""
    return args[1] if len(args) > 1 else kwargs.get("alpha")


FAMILY = "resstream"  # the model_type that resstream's ModelConfig declares


@register(FAMILY)
def resstream_view(model: nn.Module) -> ModelView:
    """The view of a resstream GPT."""
    config = model.config
    norm_position = getattr(config, "norm_position", "pre")
    post = norm_position == "post"
    blocks = tuple(
        BlockView(
            module=block,
            ln1=block.ln1,
            attn=block.attn,
            ln2=block.ln2,
            mlp=block.mlp,
            W_O=linear_W_O(block.attn.c_proj, config.n_head),
            b_O=bias_of(block.attn.c_proj),
            out_proj=block.attn.c_proj,
            norm_position="post" if post else "pre",
            attention_weights=partial(_attention_weights, block.attn, config.n_head),
            mlp_weights=partial(_mlp_weights, block.mlp),
            mlp_out_proj=block.mlp.c_proj,
            identity_scale=_gate_alpha,
        )
        for block in model.blocks
    )
    notes = []
    if post:
        notes.append(
            "post-norm blocks: ln1/ln2 normalise the residual sums and the final norm is the identity"
        )
    gate = getattr(config, "gate", "none")
    if gate != "none":
        notes.append(
            f"residual gate {gate!r}: each block scales its identity path by alpha_l "
            f"from model.gate (y = alpha_l*x + attn(ln1(x)))"
        )

    def embed(input_ids: Tensor) -> Tensor:
        return model.embed(input_ids)

    def forward(input_ids: Tensor, attention_mask: Tensor | None = None) -> object:
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("resstream GPT models take no padding: attention_mask must be all ones")
        return model.hidden_states(input_ids)

    def attention(input_ids: Tensor) -> tuple[Tensor, ...]:
        """Each block's attention probabilities, recomputed from the input its attention gets."""
        probs: list[Tensor] = []
        handles = [
            block.attn.register_forward_pre_hook(
                lambda module, args: probs.append(module.attention_probs(args[0]))
            )
            for block in model.blocks
        ]
        try:
            model.hidden_states(input_ids)
        finally:
            for handle in handles:
                handle.remove()
        return tuple(probs)

    return ModelView(
        family=FAMILY,
        model=model,
        embed=embed,
        blocks=blocks,
        final_norm=model.final_norm,
        W_U=model.W_U,
        W_E=model.wte.weight,
        tied=True,
        n_heads=config.n_head,
        d_model=config.d_model,
        max_positions=config.block_size,
        notes=tuple(notes),
        forward=forward,
        attention=attention,
    )
