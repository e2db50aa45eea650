"""How much each term of a residual sum contributes to the sum: the edge importances of a
prediction's information-flow graph (Ferrando & Voita 2024, "Information Flow Routes").

Every residual state the stream forms is a sum of terms, and the importance of a term c to
the sum y is its *proximity* to y, normalised over the terms of that sum:

    proximity(c, y) = max(0, ‖y‖₁ − ‖y − c‖₁),    importance(c, y) = proximity(c, y) / Σ_c' proximity(c', y)

A term that points where the sum points and is as long scores high; one that the other terms
cancel scores 0. Two sums per block and position i (`analysis.attribution.decomposition`'s
residual points):

* attention, at L_res_l (point 2l+1): y = α·L_in_l(i) + attention output(i), terms the
  residual α·L_in_l(i), every head h's every source j ≤ i, α^h_{ij}·(x_j W_V[h] + b_V[h]) W_O[h]
  (the attention subvalues `attribute` splits heads into), and the output bias b_O;
* MLP, at L_out_l (point 2l+2): y = L_res_l(i) + MLP output(i), terms the residual L_res_l(i)
  and the MLP output.

The bias is a term of the sum (so the importances of a node sum to one) but never an edge of
the graph: it carries no information from any position. Where the model normalises after a
sub-layer (Gemma-2/3's and OLMo-2's post-sub-layer norms, Granite's residual multiplier), the
sources pass through that norm frozen at the sub-layer's actual output, as everywhere in
resstream, so they still add up to what the sub-layer writes. A post-norm block (resstream's
`norm_position="post"`) normalises the stream after the sum: importances are those of the sum
before the norm, the only place its terms add. A parallel block's MLP reads L_in, not L_res:
its edge starts there (`FlowImportances.parallel`). When no term has a positive proximity
(the terms cancel in every direction of y), the node's whole importance goes to its residual
term and the node is counted in `degenerate`.

The paper normalises importances exactly so; it draws edges per source position, with every
head of a layer summed, and we keep each head's source as its own term (an edge names its
head). Proximity rather than DLA: the route asks which terms *make up* a state — the state's
content, which later layers read — not which terms push one token's logit, and proximity is
defined at every node without choosing a token there.

Cost: the attention sum has H·T(T+1)/2 terms of d dimensions per layer. They are never formed:
a term is a·u (an attention weight times its source's vector), and its proximity is one inner
product plus a correction at the few coordinates where it can overshoot the sum
(`_source_proximity`). One layer is held at a time: its T source vectors per head (H·T·d) and
(H, N, T) proximities for a block of queries (`memory_budget` bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from resstream.analysis.attribution.decomposition import (
    after_attention,
    attention_base,
    head_values,
    post_norm_factors,
)
from resstream.models.adapters.base import BlockInternals, BlockView, Internals, ModelView

#: Bytes of (head, query, source) proximities computed at once.
DEFAULT_MEMORY_BUDGET = 64 * 2**20
#: Bytes of (pair, head, source) overshoots computed at once: cache-sized blocks run fastest
#: (GPT-2 small, 128 tokens: 1 MiB 0.16 s, 64 MiB 0.31 s for every layer's importances).
OVERSHOOT_BLOCK = 2**20


@dataclass(frozen=True, eq=False)
class FlowImportances:
    """Every node's term importances for one sequence of T tokens (module docstring).

    Attention of block l, at query position i: `heads[l, i, h, j]` for head h's source j
    (0 for j > i), `attn_residual[l, i]`, `attn_bias[l, i]`; MLP of block l at position i:
    `mlp[l, i]` and `mlp_residual[l, i]`. Per node they sum to one (float32 rounding).
    `parallel[l]`: block l's MLP reads L_in_l (its edge starts at point 2l, else 2l+1);
    `degenerate`: nodes where every proximity was 0 (importance 1 on the residual).
    """

    heads: Tensor  # (L, T, H, T)
    attn_residual: Tensor  # (L, T)
    attn_bias: Tensor  # (L, T)
    mlp: Tensor  # (L, T)
    mlp_residual: Tensor  # (L, T)
    parallel: tuple[bool, ...]
    degenerate: int

    @property
    def n_layers(self) -> int:
        return int(self.heads.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.heads.shape[1])

    @property
    def n_heads(self) -> int:
        return int(self.heads.shape[2])


def proximity(terms: Tensor, total: Tensor) -> Tensor:
    """max(0, ‖total‖₁ − ‖total − term‖₁) of every term (..., d) against `total`, broadcast
    over the leading dimensions, computed coordinate by coordinate without subtracting the
    two large norms (`_source_proximity` explains how)."""
    sign = _sign(total)
    aligned = sign * terms
    linear = aligned.sum(-1)
    return (linear - 2.0 * (aligned - total.abs()).clamp_min_(0.0).sum(-1)).clamp_min_(0.0)


def _sign(total: Tensor) -> Tensor:
    """sign(total) with +1 at 0 (the identity of `_source_proximity` needs a sign at every coordinate)."""
    return torch.where(total >= 0, 1.0, -1.0).to(total.dtype)


def _source_proximity(total: Tensor, weights: Tensor, terms: SourceVectors, budget: int) -> Tensor:
    """proximity of every term weights[h, n, j] · vectors[h, j] to total[n], (H, N, K).

    Per coordinate, with s = sign(y) and w = s·a·u: |y| − |y − a·u| = w − 2·max(0, w − |y|).
    Summed, the first part is a·⟨s, u⟩ (one matrix product for every term); the second is
    non-zero only at coordinates where a term overshoots |y|, which a bound finds: no term of
    query n can overshoot coordinate m unless max_j a · max_j s·u > |y_m|. Only those
    (query, coordinate) pairs are visited (a few percent of N·d on GPT-2-shaped models; every
    pair at worst), `budget` bytes of (pair, head, source) excesses at a time, which keeps the
    cost near one matrix product instead of a pass over H·N·K·d numbers. Sources after a
    query have weight 0 and add nothing. The bound needs weights ≥ 0: attention probabilities,
    times a post-sub-layer norm's positive 1/s (gains and multipliers are in the vectors)."""
    sign = _sign(total)
    n_heads, count = weights.shape[0], weights.shape[-1]
    linear = weights * torch.einsum("nd,hkd->hnk", sign, terms.vectors[:, :count])
    highest = torch.where(sign > 0, terms.highest, terms.lowest)  # (N, d): the largest s·u
    magnitude = total.abs()
    rows, coords = torch.nonzero(highest * weights.amax(dim=(0, 2))[:, None] > magnitude, as_tuple=True)
    overshoot = torch.zeros_like(linear)
    step = max(1, budget // (n_heads * count * 4))
    for start in range(0, len(rows), step):
        n, m = rows[start : start + step], coords[start : start + step]
        aligned = terms.by_coordinate[m, :, :count] * sign[n, m, None, None]  # (P, H, K)
        excess = weights[:, n].transpose(0, 1) * aligned - magnitude[n, m, None, None]
        overshoot.index_add_(1, n, excess.clamp_min_(0.0).transpose(0, 1))
    return (linear - 2.0 * overshoot).clamp_min_(0.0)


@dataclass(frozen=True, eq=False)
class SourceVectors:
    """A layer's source vectors u[h, j] (H, T, d), laid out per coordinate (d, H, T), and per
    coordinate their largest value and largest negation over every head and source."""

    vectors: Tensor
    by_coordinate: Tensor
    highest: Tensor
    lowest: Tensor

    @classmethod
    def of(cls, vectors: Tensor) -> SourceVectors:
        return cls(
            vectors=vectors,
            by_coordinate=vectors.permute(2, 0, 1).contiguous(),
            highest=vectors.amax(dim=(0, 1)),
            lowest=(-vectors).amax(dim=(0, 1)),
        )


def _normalised(*proximities: Tensor) -> tuple[list[Tensor], Tensor]:
    """Each proximity over the per-node sum of all (first dims summed to the node's shape);
    nodes with a zero sum give their residual (the first) importance 1. Returns the
    importances and the mask of degenerate nodes."""
    total = sum(p.reshape(p.shape[0], -1).sum(-1) if p.ndim > 1 else p for p in proximities)
    assert isinstance(total, Tensor)
    degenerate = total <= 0
    safe = torch.where(degenerate, torch.ones_like(total), total)
    out = []
    for index, p in enumerate(proximities):
        shape = (-1,) + (1,) * (p.ndim - 1)
        value = p / safe.reshape(shape)
        fill = 1.0 if index == 0 else 0.0
        out.append(torch.where(degenerate.reshape(shape), torch.full_like(value, fill), value))
    return out, degenerate


def attention_terms(
    block: BlockView, rec: BlockInternals, sequence: int, queries: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The attention sum at query positions `queries` (N,) as terms, float32: the sum y (N, d),
    the residual (N, d), the bias (N, d), source weights (H, N, K) and source vectors
    (H, K, d) with K = max(queries) + 1, so that y = residual + bias + Σ_{h,j} weights·vectors
    (module docstring; a post-sub-layer norm frozen at the actual attention output)."""
    count = int(queries.max()) + 1
    at = (sequence, queries.to(rec.block_input.device))
    values = head_values(block, rec, sequence, count)  # (H, K, d_head)
    bases = block.W_O.detach().float()
    weights = rec.probs_at(sequence, queries)[:, :, :count].float()  # (H, N, K)
    raw_bias = None if block.b_O is None else block.b_O.detach().float().expand(len(queries), -1)
    if block.post_attn_norm is not None:
        scale, gain = post_norm_factors(block.post_attn_norm, rec.attn_raw[at], "sources")
        weights, bases = weights * scale.reshape(1, -1, 1), bases * gain
        raw_bias = None if raw_bias is None else raw_bias * gain * scale
    vectors = torch.einsum("hkd,hdm->hkm", values, bases)
    residual = attention_base(rec, at).float()
    total = residual + rec.attn_output[at].float()
    bias = torch.zeros_like(total) if raw_bias is None else raw_bias
    return total, residual, bias, weights, vectors


def _query_blocks(seq_len: int, n_heads: int, budget: int) -> list[Tensor]:
    """Consecutive query positions grouped so that each group's (H, N, T) float32 source
    proximities fit `budget` bytes (at least one position per group)."""
    size = max(1, budget // max(n_heads * seq_len * 4, 1))
    return [torch.arange(start, min(seq_len, start + size)) for start in range(0, seq_len, size)]


def flow_importances(
    view: ModelView,
    internals: Internals,
    *,
    sequence: int = 0,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> FlowImportances:
    """Every node's term importances for sequence `sequence` of `internals` (recorded with
    `attention=True`, every query row): `FlowImportances` (module docstring)."""
    if memory_budget <= 0:
        raise ValueError(f"memory_budget must be positive, got {memory_budget}")
    seq_len = internals.input_ids.shape[1]
    heads, attn_res, attn_bias, mlp, mlp_res = [], [], [], [], []
    degenerate = 0
    for block, rec in zip(view.blocks, internals.blocks, strict=True):
        layer = _attention_layer(block, rec, sequence, seq_len, memory_budget)
        heads.append(layer[0])
        attn_res.append(layer[1])
        attn_bias.append(layer[2])
        degenerate += layer[3]
        pair = _mlp_layer(block, rec, sequence, seq_len)
        mlp_res.append(pair[0])
        mlp.append(pair[1])
        degenerate += pair[2]
    return FlowImportances(
        heads=torch.stack(heads),
        attn_residual=torch.stack(attn_res),
        attn_bias=torch.stack(attn_bias),
        mlp=torch.stack(mlp),
        mlp_residual=torch.stack(mlp_res),
        parallel=tuple(bool(block.parallel) for block in view.blocks),
        degenerate=degenerate,
    )


def _attention_layer(
    block: BlockView, rec: BlockInternals, sequence: int, seq_len: int, budget: int
) -> tuple[Tensor, Tensor, Tensor, int]:
    """One block's attention importances: heads (T, H, T), residual (T,), bias (T,) and the
    number of degenerate nodes."""
    n_heads = block.W_O.shape[0]
    heads = torch.zeros(seq_len, n_heads, seq_len)
    residual = torch.zeros(seq_len)
    bias = torch.zeros(seq_len)
    degenerate = 0
    total, res, b, weights, vectors = attention_terms(block, rec, sequence, torch.arange(seq_len))
    terms = SourceVectors.of(vectors)
    chunk = min(budget, OVERSHOOT_BLOCK)
    for queries in _query_blocks(seq_len, n_heads, budget):
        here = total[queries]
        sources = _source_proximity(here, weights[:, queries], terms, chunk).permute(1, 0, 2)  # (N, H, K)
        (r, s, bb), mask = _normalised(proximity(res[queries], here), sources, proximity(b[queries], here))
        heads[queries] = s.cpu()
        residual[queries], bias[queries] = r.cpu(), bb.cpu()
        degenerate += int(mask.sum())
    return heads, residual, bias, degenerate


def _mlp_layer(
    block: BlockView, rec: BlockInternals, sequence: int, seq_len: int
) -> tuple[Tensor, Tensor, int]:
    """One block's MLP importances at every position: residual (T,), MLP (T,), degenerate count."""
    at = (sequence, torch.arange(seq_len, device=rec.block_input.device))
    base = after_attention(block, rec, at).float()
    written = rec.mlp_output[at].float()
    total = base + written
    (r, m), mask = _normalised(proximity(base, total), proximity(written, total))
    return r.cpu(), m.cpu(), int(mask.sum())


__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "FlowImportances",
    "attention_terms",
    "flow_importances",
    "proximity",
]
