"""The residual stream as an exact sum of named components.

For one sequence of a batch of `Internals` (capture/internals.py) and a set of positions,
`decompose` writes the state at a residual point as

    state = embedding + Σ_l [ Σ_h head_{l,h} (+ attention bias) + MLP_l (+ MLP bias) ]

where head h of block l writes z_h W_O[h]. On request a head is split further into its
attention sources, α_{t,j} · (x_j W_V[h] + b_V[h]) W_O[h] for every source position j ≤ t
("attention subvalues"), and an MLP into its neurons, m_k · W_out[k] ("FFN subvalues"),
plus its output bias. Residual points are numbered in the order the stream passes them:
0 = L_in_0 (h_0, the embedding output), 2l+1 = L_res_l (after block l's attention),
2l+2 = L_out_l (block l's output, = L_in_{l+1}).

What is linear is split exactly; what is not is frozen at the actual state:

* Gemma-2's post-attention and post-feed-forward RMSNorms are applied to the sum of the
  sub-layer's parts: with their scale frozen at the module's actual input (the sub-layer's
  raw output), each part maps linearly and the parts still add up to the norm's output.
* resstream's post-norm blocks normalise the whole stream (L_res = ln1(x + attn),
  L_out = ln2(L_res + mlp)): every earlier component is passed through the norm frozen at
  the actual sum, and the norm's bias becomes its own component. The sum stays exact, but a
  component's vector then depends on the frozen scales of all later norms (its effect is
  additive only at this state).
* A residual gate's α (resstream: y = α·x + attn) scales every earlier component.
* GPT-NeoX's parallel residual: attention and MLP both read L_in; L_res_l is defined as
  L_in + attention output (a point the model never forms), L_out as L_res + MLP output.

`Decomposition.residual()` measures |Σ components − actual state|: fp32 rounding only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from resstream.analysis.names import EMBEDDING, bias_name, head_name, neuron_name, source_name, sublayer_name
from resstream.analysis.norms import norm_form
from resstream.models.adapters.base import BlockInternals, BlockView, Internals, ModelView

#: Component kinds, in the codes `Decomposition.kinds` stores.
KINDS: tuple[str, ...] = (
    "embed",
    "head",
    "source",
    "attn",
    "attn_bias",
    "neuron",
    "mlp",
    "mlp_bias",
    "norm_bias",
)


def point_name(point: int) -> str:
    """L_in_0, L_res_0, L_out_0, L_res_1, ... for point 0, 1, 2, 3, ... (L_out_l = L_in_{l+1})."""
    if point == 0:
        return "L_in_0"
    layer, stage = divmod(point - 1, 2)
    return f"L_res_{layer}" if stage == 0 else f"L_out_{layer}"


def point_count(n_layers: int) -> int:
    """Number of residual points, 2L + 1."""
    return 2 * n_layers + 1


#: Components summed at once by `Decomposition.total`.
_TOTAL_BLOCK = 2048


@dataclass(frozen=True, eq=False)
class Decomposition:
    """Components of the state at residual point `point` at `positions` of one sequence.

    `vectors` (C, N, d): component c at position n; `kinds` (C,) codes into `KINDS`;
    `layers`, `heads`, `sources`, `neurons` (C,): the block, head, source position and neuron
    of each component (−1 where it does not apply); `state` (N, d) the actual state.
    """

    point: int
    positions: Tensor
    vectors: Tensor
    kinds: Tensor
    layers: Tensor
    heads: Tensor
    sources: Tensor
    neurons: Tensor
    state: Tensor

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    def total(self) -> Tensor:
        """Σ components (N, d), summed in float64 a block of components at a time (no float64
        copy of every component at once: the finest decomposition has tens of thousands)."""
        out = torch.zeros(self.vectors.shape[1:], dtype=torch.float64, device=self.vectors.device)
        for start in range(0, self.vectors.shape[0], _TOTAL_BLOCK):
            out += self.vectors[start : start + _TOTAL_BLOCK].double().sum(0)
        return out

    def residual(self) -> tuple[float, float]:
        """max |Σ components − state| and that divided by max ‖state‖ over positions."""
        diff = (self.total() - self.state.double()).abs().max()
        scale = self.state.double().norm(dim=-1).max().clamp_min(1e-30)
        return float(diff), float(diff / scale)

    def kind(self, index: int) -> str:
        return KINDS[int(self.kinds[index])]

    def label(self, index: int) -> str:
        """A component's name (`analysis.names`): emb, L1.H3, L1.H3.S5 (source position 5),
        L1.attn_bias, L2.mlp, L2.N712, L2.mlp_bias, L2.norm_bias."""
        kind, layer = self.kind(index), int(self.layers[index])
        if kind == "embed":
            return EMBEDDING
        if kind == "head":
            return head_name(layer, int(self.heads[index]))
        if kind == "source":
            return source_name(layer, int(self.heads[index]), int(self.sources[index]))
        if kind == "neuron":
            return neuron_name(layer, int(self.neurons[index]))
        if kind in ("attn", "mlp"):
            return sublayer_name(layer, kind)
        return bias_name(layer, kind)


class _Parts:
    """The growing list of component groups while the stream is walked block by block."""

    def __init__(self) -> None:
        self.vectors: list[Tensor] = []
        self.meta: list[tuple[int, int, Tensor, Tensor, Tensor]] = []  # kind, layer, heads, sources, neurons

    def add(
        self,
        kind: str,
        layer: int,
        vectors: Tensor,
        heads: Tensor | None = None,
        sources: Tensor | None = None,
        neurons: Tensor | None = None,
    ) -> None:
        n = vectors.shape[0]
        none = torch.full((n,), -1, dtype=torch.long)
        self.vectors.append(vectors)
        self.meta.append(
            (
                KINDS.index(kind),
                layer,
                none if heads is None else heads.long().cpu(),
                none if sources is None else sources.long().cpu(),
                none if neurons is None else neurons.long().cpu(),
            )
        )

    def map(self, fn: Callable[[Tensor], Tensor]) -> None:
        """Apply a linear map to every component so far (a gate's α, a frozen norm)."""
        self.vectors = [fn(v) for v in self.vectors]

    def result(self, point: int, positions: Tensor, state: Tensor) -> Decomposition:
        counts = [v.shape[0] for v in self.vectors]
        kinds = torch.cat(
            [torch.full((n,), m[0], dtype=torch.long) for n, m in zip(counts, self.meta, strict=True)]
        )
        layers = torch.cat(
            [torch.full((n,), m[1], dtype=torch.long) for n, m in zip(counts, self.meta, strict=True)]
        )
        return Decomposition(
            point=point,
            positions=positions,
            vectors=torch.cat(self.vectors),
            kinds=kinds,
            layers=layers,
            heads=torch.cat([m[2] for m in self.meta]),
            sources=torch.cat([m[3] for m in self.meta]),
            neurons=torch.cat([m[4] for m in self.meta]),
            state=state,
        )


def decompose(
    view: ModelView,
    internals: Internals,
    positions: Tensor | list[int] | int,
    *,
    point: int | None = None,
    sequence: int = 0,
    heads: bool = True,
    sources: bool = False,
    neurons: bool = False,
) -> Decomposition:
    """The state at residual `point` (default: the last, L_out_{L−1}) at `positions` of
    sequence `sequence` of `internals`, as components (module docstring).

    `heads`: one component per head (else one per attention layer); `sources`: every head
    split into its source positions (needs `internals` recorded with `attention=True`);
    `neurons`: every MLP split into its neurons and its output bias.
    """
    last = point_count(view.n_layers) - 1
    point = last if point is None else point
    if not 0 <= point <= last:
        raise ValueError(f"point {point} is outside 0..{last} (2L+1 residual points)")
    pos = torch.as_tensor(positions, dtype=torch.long).reshape(-1)
    seq_len = internals.input_ids.shape[1]
    if len(pos) == 0 or int(pos.min()) < 0 or int(pos.max()) >= seq_len:
        raise ValueError(f"positions must lie in 0..{seq_len - 1}, got {pos.tolist()}")
    parts = _Parts()
    at = (sequence, pos.to(internals.embedding.device))
    parts.add("embed", -1, internals.embedding[at].unsqueeze(0))
    state = internals.embedding[at]
    for layer, (block, rec) in enumerate(zip(view.blocks, internals.blocks, strict=True)):
        if point <= 2 * layer:
            break
        _scale_by_gate(parts, rec, at)
        attention_parts(parts, layer, block, rec, at, heads=heads or sources, sources=sources)
        if block.norm_position == "post":
            _freeze_stream(parts, layer, block.ln1, attention_base(rec, at) + rec.attn_output[at])
        state = after_attention(block, rec, at)
        if point == 2 * layer + 1:
            break
        mlp_parts(parts, layer, block, rec, at, neurons=neurons)
        if block.norm_position == "post":
            _freeze_stream(parts, layer, block.ln2, state + rec.mlp_output[at])
        state = rec.block_output[at]
    return parts.result(point, pos, state)


def attention_parts(
    parts: _Parts,
    layer: int,
    block: BlockView,
    rec: BlockInternals,
    at: tuple[int, Tensor],
    *,
    heads: bool,
    sources: bool,
) -> None:
    """Add block `layer`'s attention writes as they are added to the stream (Gemma-2: through
    its post-attention norm frozen at the actual raw output): heads, sources or one part."""
    n_before = len(parts.vectors)
    W_O = block.W_O.detach()
    if sources:
        _add_sources(parts, layer, block, rec, at)
    elif heads:
        per_head = torch.einsum("nhd,hdm->hnm", rec.z[at].to(W_O.dtype), W_O)
        parts.add("head", layer, per_head, heads=torch.arange(per_head.shape[0]))
    else:
        bias = 0 if block.b_O is None else block.b_O.detach()
        parts.add("attn", layer, (rec.attn_raw[at] - bias).unsqueeze(0))
    if block.b_O is not None:
        parts.add("attn_bias", layer, block.b_O.detach().expand_as(rec.attn_raw[at]).unsqueeze(0))
    if block.post_attn_norm is not None:
        _freeze_sublayer(parts, n_before, layer, block.post_attn_norm, rec.attn_raw[at])


def attention_base(rec: BlockInternals, at: tuple[int, Tensor]) -> Tensor:
    """The stream the attention output is added to: α·L_in (L_in without a gate)."""
    block_in = rec.block_input[at]
    alpha = identity_scale_at(rec, at)
    return block_in if alpha is None else block_in * alpha


def after_attention(block: BlockView, rec: BlockInternals, at: tuple[int, Tensor]) -> Tensor:
    """The actual L_res: α·L_in + attention output, normalised by ln1 in post-norm blocks."""
    summed = attention_base(rec, at) + rec.attn_output[at]
    return norm_form(block.ln1)(summed) if block.norm_position == "post" else summed


def identity_scale_at(rec: BlockInternals, at: tuple[int, Tensor]) -> Tensor | None:
    """The factor α the block scales its identity path by, at `at` (a gate's scalar or a
    router's per-token value); None for 1."""
    alpha = rec.identity_scale
    if alpha is not None and alpha.ndim >= 2:  # a per-token router: (batch, seq, 1)
        alpha = alpha[at]
    return alpha


def _scale_by_gate(parts: _Parts, rec: BlockInternals, at: tuple[int, Tensor]) -> None:
    """A residual gate scales the block's identity path, so every component so far, by α."""
    alpha = identity_scale_at(rec, at)
    if alpha is not None:
        parts.map(lambda v: v * alpha.to(v.dtype))


def _add_sources(
    parts: _Parts, layer: int, block: BlockView, rec: BlockInternals, at: tuple[int, Tensor]
) -> None:
    """Every head split by source position j: probs[h, t, j] · (x_j W_V[h] + b_V[h]) W_O[h]."""
    sequence, pos = at
    values = head_values(block, rec, sequence, rec.attn_input.shape[1]).to(block.W_O.dtype)
    written = torch.einsum("htd,hdm->htm", values, block.W_O.detach())  # (H, T, d)
    probs = rec.probs_at(sequence, pos).to(written.dtype)  # (H, N, T)
    n_heads, seq_len = written.shape[0], written.shape[1]
    split = probs.permute(0, 2, 1).unsqueeze(-1) * written.unsqueeze(2)  # (H, T, N, d)
    parts.add(
        "source",
        layer,
        split.reshape(n_heads * seq_len, len(pos), -1),
        heads=torch.arange(n_heads).repeat_interleave(seq_len),
        sources=torch.arange(seq_len).repeat(n_heads),
    )


def post_norm_factors(module: nn.Module, raw: Tensor, parts: str) -> tuple[Tensor, Tensor]:
    """A post-sub-layer RMSNorm (Gemma-2) frozen at the sub-layer's actual output `raw`
    (..., d) maps each part linearly: part ↦ part ⊙ gain · 1/s. Returns 1/s (..., 1) and the
    gain (d,) in float32; ValueError for a centring norm, which would not split into `parts`."""
    frozen = norm_form(module).to(torch.float32).freeze(raw.float())
    if frozen.form.centre:
        raise ValueError(f"a centring post-sub-layer norm does not split into {parts}")
    return frozen.inverse_scale, frozen.gain_vector(raw.shape[-1], frozen.inverse_scale)


def neuron_terms(block: BlockView, rec: BlockInternals, at: tuple[int, Tensor]) -> tuple[Tensor, Tensor]:
    """Neuron k's write as added at `at` is m_k·values[k]: returns m (N, d_ff) and values
    (d_ff, d) in float32 — W_out itself, or for Gemma-2 W_out ⊙ gain with m scaled by the
    post-feed-forward norm's 1/s frozen at the actual MLP output."""
    m = rec.coefficients[at].float()
    values = block.read_mlp_weights().W_out.detach().float()
    if block.post_mlp_norm is not None:
        scale, gain = post_norm_factors(block.post_mlp_norm, rec.mlp_raw[at], "neurons")
        m, values = m * scale, values * gain
    return m, values


def head_values(block: BlockView, rec: BlockInternals, sequence: int, count: int) -> Tensor:
    """Every head's value vectors x_j W_V[h] + b_V[h] of the first `count` positions,
    (H, count, d_head) in float32; refused without recorded attention probabilities (sources
    need both)."""
    if rec.probs is None:
        raise ValueError("attention sources need internals recorded with attention=True")
    weights = block.read_attention_weights()
    x = rec.attn_input[sequence, :count].float()
    values = torch.einsum("jm,hmd->hjd", x, weights.W_V.detach().float())
    if weights.b_V is not None:
        values = values + weights.b_V.detach().float()[:, None, :]
    return values


def source_terms(
    block: BlockView, rec: BlockInternals, sequence: int, position: int
) -> tuple[Tensor, Tensor]:
    """The sources j ≤ `position` of every head as added: v_{h,j} = coefficients[h, j] @
    bases[h] with coefficients α_{t,j}·(x_j W_V[h] + b_V[h]) (H, t+1, d_head) and bases W_O
    (H, d_head, d), in float32 (Gemma-2: bases ⊙ the post-attention gain, coefficients × its
    1/s frozen at the actual attention output)."""
    values = head_values(block, rec, sequence, position + 1)
    probs = rec.probs_at(sequence, torch.tensor([position]))[:, 0, : position + 1].float()  # (H, j)
    bases = block.W_O.detach().float()
    if block.post_attn_norm is not None:
        scale, gain = post_norm_factors(block.post_attn_norm, rec.attn_raw[sequence, position], "sources")
        probs, bases = probs * scale, bases * gain
    return probs.unsqueeze(-1) * values, bases


def mlp_parts(
    parts: _Parts, layer: int, block: BlockView, rec: BlockInternals, at: tuple[int, Tensor], *, neurons: bool
) -> None:
    """Add block `layer`'s MLP writes as they are added to the stream (Gemma-2: through its
    post-feed-forward norm frozen at the actual raw output): neurons + bias, or one part."""
    n_before = len(parts.vectors)
    if neurons:
        weights = block.read_mlp_weights()
        m = rec.coefficients[at]  # (N, d_ff)
        split = m.T.unsqueeze(-1).to(weights.W_out.dtype) * weights.W_out.detach().unsqueeze(
            1
        )  # (d_ff, N, d)
        parts.add("neuron", layer, split, neurons=torch.arange(split.shape[0]))
        if weights.b_out is not None:
            parts.add("mlp_bias", layer, weights.b_out.detach().expand_as(rec.mlp_raw[at]).unsqueeze(0))
    else:
        parts.add("mlp", layer, rec.mlp_raw[at].unsqueeze(0))
    if block.post_mlp_norm is not None:
        _freeze_sublayer(parts, n_before, layer, block.post_mlp_norm, rec.mlp_raw[at])


def sublayer_writes(
    view: ModelView,
    internals: Internals,
    layer: int,
    sublayer: str,
    positions: Tensor | list[int],
    *,
    sequence: int = 0,
    sources: bool = False,
    neurons: bool = False,
) -> Decomposition:
    """The parts one sub-layer ("attn": heads or sources + bias; "mlp": the whole MLP or its
    neurons + bias) adds to the stream at `positions`, as added (before a post-norm block's
    stream norm); their sum is the sub-layer's actual output (`state`)."""
    pos = torch.as_tensor(positions, dtype=torch.long).reshape(-1)
    at = (sequence, pos.to(internals.embedding.device))
    block, rec = view.blocks[layer], internals.blocks[layer]
    parts = _Parts()
    if sublayer == "attn":
        attention_parts(parts, layer, block, rec, at, heads=True, sources=sources)
        return parts.result(2 * layer + 1, pos, rec.attn_output[at])
    mlp_parts(parts, layer, block, rec, at, neurons=neurons)
    return parts.result(2 * layer + 2, pos, rec.mlp_output[at])


def residual_points(
    view: ModelView, internals: Internals, positions: Tensor | list[int], *, sequence: int = 0
) -> Tensor:
    """The actual states at all 2L+1 residual points (`point_name`), (2L+1, N, d)."""
    pos = torch.as_tensor(positions, dtype=torch.long).reshape(-1)
    at = (sequence, pos.to(internals.embedding.device))
    states = [internals.embedding[at]]
    for block, rec in zip(view.blocks, internals.blocks, strict=True):
        states += [after_attention(block, rec, at), rec.block_output[at]]
    return torch.stack(states)


def _freeze_sublayer(parts: _Parts, first: int, layer: int, module: nn.Module, raw: Tensor) -> None:
    """Pass the parts added since `first` through a post-sub-layer norm frozen at `raw`."""
    form = norm_form(module)
    frozen = form.freeze(raw)
    parts.vectors[first:] = [frozen.apply(v) for v in parts.vectors[first:]]
    if form.bias is not None:
        parts.add("norm_bias", layer, form.offset(raw).expand_as(raw).unsqueeze(0))


def _freeze_stream(parts: _Parts, layer: int, module: nn.Module | None, summed: Tensor) -> None:
    """Post-norm: pass every component through the stream norm (None: the identity) frozen at
    the actual sum."""
    form = norm_form(module)
    frozen = form.freeze(summed)
    parts.map(frozen.apply)
    if form.bias is not None:
        parts.add("norm_bias", layer, form.offset(summed).expand_as(summed).unsqueeze(0))


__all__ = [
    "KINDS",
    "Decomposition",
    "after_attention",
    "attention_base",
    "decompose",
    "head_values",
    "identity_scale_at",
    "neuron_terms",
    "point_count",
    "point_name",
    "post_norm_factors",
    "residual_points",
    "source_terms",
    "sublayer_writes",
]
