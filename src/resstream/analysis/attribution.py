"""Direct logit attribution and the attribution of one prediction or of a corpus.

Direct logit attribution (DLA): the final norm frozen at the actual final state h_L is linear,
so the logit of a target w (or the target − foil difference) is exactly

    logit_w = Σ_c ⟨F(v_c), u⟩ + ⟨β, u⟩ + b_U[w],   u = W_U[w] (− W_U[foil]),

F the frozen norm (centring, gain, 1/s(h_L)) and v_c the components of h_L. Rather than pass
every component through every later map, `readouts` carries the direction u back once
through the frozen maps (`FrozenNorm.adjoint`; a gate's α; post-norm blocks' stream norms;
Gemma-2's post-sub-layer norms): a component written by layer l's attention then has
DLA = ⟨v, r_attn[l]⟩, by its MLP ⟨v, r_mlp[l]⟩, the embedding ⟨h_0, r_embed⟩ — exactly the
terms of the sum above. Logit soft-capping is applied after the sum and is not attributed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from resstream.analysis.decoding import Decoder
from resstream.analysis.decomposition import after_attention, attention_base
from resstream.analysis.norms import NormForm, norm_form
from resstream.capture.internals import Internals
from resstream.models.adapters.base import ModelView


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
    constant: Tensor
    final_constant: Tensor  # the final norm's bias and b_U part of `constant`


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
    final_constant = constant.clone()
    r = form.freeze(final).adjoint(u)
    attn: list[Tensor] = []
    mlp: list[Tensor] = []
    for block, rec in zip(reversed(view.blocks), reversed(internals.blocks), strict=True):
        if block.norm_position == "post":
            res = after_attention(block, rec, at).double()
            r, constant = _through(block.ln2, res + rec.mlp_output[at].double(), r, constant)
        mlp.append(_sublayer_readout(block.post_mlp_norm, rec.mlp_raw[at], r))
        constant = constant + _sublayer_bias(block.post_mlp_norm, r)
        if block.norm_position == "post":
            r, constant = _through(
                block.ln1, (attention_base(rec, at) + rec.attn_output[at]).double(), r, constant
            )
        attn.append(_sublayer_readout(block.post_attn_norm, rec.attn_raw[at], r))
        constant = constant + _sublayer_bias(block.post_attn_norm, r)
        alpha = rec.identity_scale
        if alpha is not None:
            r = r * (alpha[at] if alpha.ndim >= 2 else alpha).double()
    return Readouts(r, tuple(reversed(attn)), tuple(reversed(mlp)), constant, final_constant)


def _bias_term(form: NormForm, u: Tensor) -> Tensor:
    """⟨β, u⟩ (N,) for a norm's bias β (zeros when it has none)."""
    if form.bias is None:
        return torch.zeros(u.shape[:-1], dtype=u.dtype, device=u.device)
    return u @ form.bias.to(u.device)


def _through(module: nn.Module, actual: Tensor, r: Tensor, constant: Tensor) -> tuple[Tensor, Tensor]:
    """Carry r back through a stream norm frozen at `actual`, its bias joining the constant."""
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


__all__ = ["Readouts", "bias_difference", "direction", "readouts"]
