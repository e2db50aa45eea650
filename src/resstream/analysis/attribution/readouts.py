"""Direct logit attribution (DLA): the read-out direction of a target's logit at every write.

The final norm frozen at the actual final state h_L is linear, so the logit of a target w (or
the target − foil difference) is exactly

    logit_w = Σ_c ⟨F(v_c), u⟩ + ⟨β, u⟩ + b_U[w],   u = W_U[w] (− W_U[foil]),

F the frozen norm (centring, gain, 1/s(h_L)) and v_c the components of h_L. Rather than pass
every component through every later map, `readouts` carries the direction u back once
through the frozen maps (`FrozenNorm.adjoint`; a gate's α; post-norm blocks' stream norms;
Gemma-2's post-sub-layer norms): a component written by layer l's attention then has
DLA = ⟨v, r_attn[l]⟩, by its MLP ⟨v, r_mlp[l]⟩, the embedding ⟨h_0, r_embed⟩ — exactly the
terms of the sum above, whose total `actual_logits` computes directly. Logit soft-capping is
applied after the sum and is not attributed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from resstream.analysis.attribution.decomposition import after_attention, attention_base, identity_scale_at
from resstream.analysis.decoding.decoder import Decoder
from resstream.analysis.norms import NormForm, norm_form
from resstream.models.adapters.base import Internals, ModelView


@dataclass(frozen=True, eq=False)
class Readouts:
    """Read-out directions (N, d) per position: ⟨write, r⟩ is the write's DLA.

    `attn[l]` / `mlp[l]` read a sub-layer's raw parts (before Gemma-2's post-sub-layer norm:
    z_h·W_O[h], b_O, m_k·W_out[k], b_out); `embed` reads h_0; `constant` (N,) is the rest of
    the logit: the final norm's bias and b_U terms plus every frozen norm bias on the way.
    """

    embed: Tensor
    attn: tuple[Tensor, ...]
    mlp: tuple[Tensor, ...]
    attn_added: tuple[Tensor, ...]  # reads a sub-layer's parts as added (after its post norm)
    mlp_added: tuple[Tensor, ...]
    constant: Tensor


def direction(decoder: Decoder, target: Tensor, foil: Tensor | None = None) -> Tensor:
    """u = W_U[target] (− W_U[foil]), (N, d) in float64."""
    u = decoder.matrix[target].double()
    return u - decoder.matrix[foil].double() if foil is not None else u


def bias_difference(decoder: Decoder, target: Tensor, foil: Tensor | None = None) -> Tensor:
    """b_U[target] (− b_U[foil]), (N,) float64 (zeros without b_U)."""
    if decoder.bias is None:
        return torch.zeros(target.shape, dtype=torch.float64, device=target.device)
    b = decoder.bias.double()
    return b[target] - (b[foil] if foil is not None else 0)


def readouts(
    view: ModelView,
    internals: Internals,
    decoder: Decoder,
    positions: Tensor,
    target: Tensor,
    foil: Tensor | None = None,
    *,
    sequence: int = 0,
) -> Readouts:
    """The read-out directions of the target's logit (difference) at `positions` (module
    docstring), in float64."""
    at = (sequence, positions.to(internals.embedding.device))
    final = internals.blocks[-1].block_output[at].double()
    form = norm_form(decoder.norm).to(torch.float64)
    u = direction(
        decoder, target.to(decoder.matrix.device), None if foil is None else foil.to(decoder.matrix.device)
    )
    u = u.to(final.device)
    constant = bias_difference(decoder, target, foil).to(final.device) + _bias_term(form, u)
    r = form.freeze(final).adjoint(u)
    attn: list[Tensor] = []
    mlp: list[Tensor] = []
    attn_added: list[Tensor] = []
    mlp_added: list[Tensor] = []
    for block, rec in zip(reversed(view.blocks), reversed(internals.blocks), strict=True):
        if block.norm_position == "post":
            res = after_attention(block, rec, at).double()
            r, constant = _through(block.ln2, res + rec.mlp_output[at].double(), r, constant)
        mlp_added.append(r)
        mlp.append(_sublayer_readout(block.post_mlp_norm, rec.mlp_raw[at], r))
        constant = constant + _sublayer_bias(block.post_mlp_norm, r)
        if block.norm_position == "post":
            r, constant = _through(
                block.ln1, (attention_base(rec, at) + rec.attn_output[at]).double(), r, constant
            )
        attn_added.append(r)
        attn.append(_sublayer_readout(block.post_attn_norm, rec.attn_raw[at], r))
        constant = constant + _sublayer_bias(block.post_attn_norm, r)
        alpha = identity_scale_at(rec, at)
        if alpha is not None:
            r = r * alpha.double()
    return Readouts(
        r,
        tuple(reversed(attn)),
        tuple(reversed(mlp)),
        tuple(reversed(attn_added)),
        tuple(reversed(mlp_added)),
        constant,
    )


def _bias_term(form: NormForm, u: Tensor) -> Tensor:
    """⟨β, u⟩ (N,) for a norm's bias β (zeros when it has none)."""
    if form.bias is None:
        return torch.zeros(u.shape[:-1], dtype=u.dtype, device=u.device)
    return u @ form.bias.to(u.device)


def _through(module: nn.Module | None, actual: Tensor, r: Tensor, constant: Tensor) -> tuple[Tensor, Tensor]:
    """Carry r back through a stream norm (None: the identity) frozen at `actual`, its bias
    joining the constant."""
    form = norm_form(module).to(torch.float64)
    return form.freeze(actual).adjoint(r), constant + _bias_term(form, r)


def _sublayer_readout(module: nn.Module | None, raw: Tensor, r: Tensor) -> Tensor:
    """r for a sub-layer's raw parts: through its post norm frozen at the raw output, if any."""
    if module is None:
        return r
    return norm_form(module).to(torch.float64).freeze(raw.double()).adjoint(r)


def _sublayer_bias(module: nn.Module | None, r: Tensor) -> Tensor:
    if module is None:
        return torch.zeros(r.shape[:-1], dtype=r.dtype, device=r.device)
    return _bias_term(norm_form(module).to(torch.float64), r)


def actual_logits(decoder: Decoder, h: Tensor, target: Tensor, foil: Tensor | None = None) -> Tensor:
    """The target's logit (− the foil's) before soft-capping for final states h (N, d), (N,)
    in float64: the final norm's formula (`norms.py`, checked against the module) applied in
    float64, so a float16/bfloat16 model is read without mixing dtypes."""
    normed = norm_form(decoder.norm).to(torch.float64)(h.double())
    device = decoder.matrix.device
    u = direction(decoder, target.to(device), None if foil is None else foil.to(device)).to(normed.device)
    return (normed * u).sum(-1) + bias_difference(decoder, target.to(device), foil).to(normed.device)


__all__ = ["Readouts", "actual_logits", "bias_difference", "direction", "readouts"]
