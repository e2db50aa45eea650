"""What a head reads: which lower vectors make up its query (or key) at one position.

`head_read_contributions` asks of an attention head what `scores.query_contributions` asks
of a neuron. The head reads the stream at `position` (L_in of its block, the point 0, 2, 4,
... of `decomposition`; attention reads the block input in every layout: through ln1 before
attention, raw in post-norm blocks, and L_in in parallel blocks too). That stream is split into
`decompose`'s components v_c (embedding, heads or their sources, neurons, biases), and each
is carried to the head's query exactly as the model carries the whole:

    q_c = N₁(v_c) · W_Q[h]         (ln1 frozen at the actual stream: centring, gain, 1/s)
    n_c = N_q(q_c)                 (the QK-norm frozen at the actual query, if there is one)

so that Σ_c n_c + n_0 = q̂, the model's normalised query, with n_0 the constant made of the
biases (ln1's bias through W_Q, b_Q, and the QK-norm's own bias, through the frozen norm).
A QK-norm over all heads joined (OLMo-2) is frozen at the actual query of all heads; the
centring of a LayerNorm QK-norm (Cohere, Phi) is linear and splits exactly. A component's
share is its part along the actual query's direction,

    share_c = ⟨n_c, q̂⟩ / ‖q̂‖,     Σ_c share_c + constant = ‖q̂‖ exactly,

and the same for keys (`which` "k"; grouped-query heads read their key/value head's key).
Rotary position embeddings rotate the normalised query (and key) as a whole, after all of
this: a rotation keeps inner products, so the shares are the same before and after it.
Without a QK-norm the norm step is left out and q̂ is the raw query x·W_Q + b_Q.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from resstream.analysis.attribution.decomposition import Decomposition, decompose
from resstream.analysis.attribution.results import QueryShare
from resstream.analysis.norms import head_norm, norm_form
from resstream.errors import UsageError
from resstream.models.adapters.base import BlockView, Internals, ModelView

Side = Literal["q", "k"]


@dataclass(frozen=True)
class HeadReadContribution:
    """Which lower vectors make up head `head`'s query (`which` "q") or key ("k") at
    `position` (module docstring): `length` is ‖q̂‖ of the actual (normalised) query, exactly
    Σ all shares + `constant`; `shares` lists the `top` largest |share| first."""

    layer: int
    head: int
    which: str
    position: int
    length: float
    constant: float
    shares: tuple[QueryShare, ...]
    residual: float  # |Σ all shares + constant − length|


@dataclass(frozen=True, eq=False)
class _Read:
    """The head's query or key at the position as parts: `parts` (C, d_head) one per
    component, `constant` (d_head,), `actual` (d_head,) as the model computes it, float64."""

    parts: Tensor
    constant: Tensor
    actual: Tensor


def head_read_contributions(
    view: ModelView,
    internals: Internals,
    layer: int,
    head: int,
    position: int,
    which: Side = "q",
    *,
    sources: bool = False,
    top: int = 20,
    sequence: int = 0,
) -> HeadReadContribution:
    """Which lower vectors make up head `head` of `layer`'s query (`which` "q") or key ("k")
    at `position` of sequence `sequence` (module docstring): each component's share along the
    actual normalised query, the biases' constant and the exactness residual. `sources`
    splits lower heads by source position (internals recorded with attention=True).
    UsageError for `which` other than "q" or "k"."""
    if which not in ("q", "k"):
        raise UsageError(f"`which` {which!r} is not one of q, k")
    components = decompose(
        view, internals, [position], point=2 * layer, sequence=sequence, sources=sources, neurons=True
    )
    block = view.blocks[layer]
    actual_input = internals.blocks[layer].attn_input[sequence, position].double()
    read = _through_qk_norm(block, which, _projected(block, which, components, actual_input))
    parts, constant, actual = read.parts[head], read.constant[head], read.actual[head]
    length = actual.norm()
    direction = actual / length.clamp_min(1e-30)
    shares = parts @ direction
    constant_share = float(constant @ direction)
    order = shares.abs().argsort(descending=True)[:top].tolist()
    return HeadReadContribution(
        layer=layer,
        head=head,
        which=which,
        position=position,
        length=float(length),
        constant=constant_share,
        shares=tuple(_share(components, i, float(shares[i])) for i in order),
        residual=abs(float(shares.sum()) + constant_share - float(length)),
    )


def _projected(block: BlockView, which: Side, components: Decomposition, actual_input: Tensor) -> _Read:
    """Every head's query or key before any QK-norm, (H, C, d_head) parts from the components
    through ln1 frozen at the actual stream (none in post-norm blocks), the constant from the
    biases, and the actual one from what attention read (`actual_input`, its ln1 output)."""
    form = norm_form(block.ln1 if block.norm_position == "pre" else None).to(torch.float64)
    state = components.state.double()  # (1, d)
    normed = form.freeze(state).apply(components.vectors.double())[:, 0]  # (C, d)
    weights = block.read_attention_weights()
    W = (weights.W_Q if which == "q" else weights.W_K).detach().double().to(normed.device)
    bias = weights.b_Q if which == "q" else weights.b_K
    b = torch.zeros(W.shape[0], W.shape[2], dtype=W.dtype, device=W.device)
    if bias is not None:
        b = bias.detach().double().to(W.device)
    offset = form.offset(state).expand(state.shape[-1]).to(W.device)
    return _Read(
        parts=torch.einsum("cd,hde->hce", normed, W),
        constant=torch.einsum("d,hde->he", offset, W) + b,
        actual=torch.einsum("d,hde->he", actual_input.to(W.device), W) + b,
    )


def _through_qk_norm(block: BlockView, which: Side, read: _Read) -> _Read:
    """`read` through the block's QK-norm frozen at the actual query (or key) of every head,
    (H, ..., d_head) as before; unchanged without one. The norm's bias joins the constant."""
    norm = head_norm(block, which)
    if norm is None:
        return read
    form = norm.form.to(torch.float64)
    actual = norm.joined(read.actual)
    frozen = form.freeze(actual)
    n_heads = read.actual.shape[0]
    return _Read(
        parts=norm.split(frozen.apply(norm.joined(read.parts)), n_heads),
        constant=norm.split(frozen.apply(norm.joined(read.constant)) + form.offset(actual), n_heads),
        actual=norm.split(form(actual), n_heads),
    )


def _share(components: Decomposition, index: int, share: float) -> QueryShare:
    layer = int(components.layers[index])
    return QueryShare(components.label(index), None if layer < 0 else layer, components.kind(index), share)


__all__ = ["HeadReadContribution", "head_read_contributions"]
