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

Cost: the attention sum has H·T(T+1)/2 terms of d dimensions per layer; they are formed and
measured a block of query positions at a time (`memory_budget` bytes of terms), never all
layers or all positions at once.
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

#: Bytes of (head, query, source, d_model) terms held at once while measuring proximities.
DEFAULT_MEMORY_BUDGET = 64 * 2**20


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
    over the leading dimensions (float32 or as given)."""
    distance = torch.linalg.vector_norm(total - terms, ord=1, dim=-1)
    return (torch.linalg.vector_norm(total, ord=1, dim=-1) - distance).clamp_min_(0.0)


def _scaled_proximity(total: Tensor, weights: Tensor, vectors: Tensor) -> Tensor:
    """proximity of the terms weights[h, n, j] · vectors[h, j] to total[n]: (H, N, J) without
    forming weights·vectors and total − term as separate tensors (one fused pass)."""
    diff = torch.addcmul(total[None, :, None, :], weights[..., None], vectors[:, None, :, :], value=-1.0)
    distance = torch.linalg.vector_norm(diff, ord=1, dim=-1)
    return (torch.linalg.vector_norm(total, ord=1, dim=-1)[None, :, None] - distance).clamp_min_(0.0)


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


def _query_blocks(seq_len: int, n_heads: int, d_model: int, budget: int) -> list[Tensor]:
    """Consecutive query positions grouped so that each group's (H, N, K, d) float32 terms
    fit `budget` bytes (at least one position per group)."""
    per_query = n_heads * seq_len * d_model * 4
    size = max(1, budget // max(per_query, 1))
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
    d_model = block.W_O.shape[-1]
    for queries in _query_blocks(seq_len, n_heads, d_model, budget):
        total, res, b, weights, vectors = attention_terms(block, rec, sequence, queries)
        sources = _scaled_proximity(total, weights, vectors).permute(1, 0, 2)  # (N, H, K)
        (r, s, bb), mask = _normalised(proximity(res, total), sources, proximity(b, total))
        rows = queries
        heads[rows, :, : sources.shape[-1]] = s.cpu()
        residual[rows], bias[rows] = r.cpu(), bb.cpu()
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
