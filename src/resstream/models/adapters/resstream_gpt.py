"""Adapter for resstream's own GPT (`resstream.training.model.GPT`).

Layout: `wte` (+ learned `wpe`, or rotary inside attention), blocks with `ln1`, `attn`
(`c_attn`, `c_proj` as `nn.Linear`), `ln2`, `mlp`; `final_norm`; the unembedding is tied to
`wte.weight`. Pre-norm by default; the post-norm variant applies `ln1`/`ln2` to the residual
sums (`BlockView.norm_position == "post"`) and has an identity final norm. Gated models scale
the identity path of their blocks by α from `model.gate` (stated in the notes).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from resstream.models.adapters.base import DynamicModule, MLPWeights, ModelView
from resstream.models.adapters.layout import BlockLayout, Sublayer
from resstream.models.adapters.registry import register
from resstream.models.adapters.weights import FusedQKV, projection_mlp_weights

#: `c_attn`, a Linear whose output is q | k | v, each d_model wide.
QKV = FusedQKV("c_attn")


def _mlp_weights(mlp: DynamicModule) -> MLPWeights:
    """c_proj(act(c_fc(x))), the activation being the module's own `act`."""
    return projection_mlp_weights(mlp.c_fc, mlp.c_proj, mlp.act)


def _gate_alpha(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """The α a resstream block is called with (`Block.forward(x, alpha)`), None for 1."""
    return args[1] if len(args) > 1 else kwargs.get("alpha")


FAMILY = "resstream"  # the model_type that resstream's ModelConfig declares

BLOCK = BlockLayout(
    attention=Sublayer("attn", norm="ln1", out_proj="c_proj", weights=QKV.weights, columns=QKV.columns),
    mlp=Sublayer("mlp", norm="ln2", out_proj="c_proj", weights=_mlp_weights),
)


def _notes(config: Any) -> tuple[str, ...]:
    """What the view says about a post-norm or gated model."""
    notes = []
    if getattr(config, "norm_position", "pre") == "post":
        notes.append(
            "post-norm blocks: ln1/ln2 normalise the residual sums and the final norm is the identity"
        )
    gate = getattr(config, "gate", "none")
    if gate != "none":
        notes.append(
            f"residual gate {gate!r}: each block scales its identity path by alpha_l "
            f"from model.gate (y = alpha_l*x + attn(ln1(x)))"
        )
    return tuple(notes)


@register(FAMILY)
def resstream_view(model: DynamicModule) -> ModelView:
    """The view of a resstream GPT."""
    config = model.config
    post = getattr(config, "norm_position", "pre") == "post"

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
        blocks=BLOCK.views(
            model.blocks, config.n_head, norm_position="post" if post else "pre", identity_scale=_gate_alpha
        ),
        final_norm=model.final_norm,
        W_U=model.W_U,
        W_E=model.wte.weight,
        tied=True,
        n_heads=config.n_head,
        d_model=config.d_model,
        max_positions=config.block_size,
        notes=_notes(config),
        forward=forward,
        attention=attention,
    )
