"""The route of a prediction: the information-flow graph kept above a threshold, from the
importances of `routes.importance`.

Nodes are residual states (point, position), points numbered as in the decomposition
(0 = L_in_0, 2l+1 = L_res_l, 2l+2 = L_out_l); an edge is a term of the sum a node is, from
the node the term was computed from:

* `residual`: (2l, i) → (2l+1, i) and (2l+1, i) → (2l+2, i);
* `head`: (2l, j) → (2l+1, i) through head h of block l (source j ≤ i);
* `mlp`: (2l+1, i) → (2l+2, i) (a parallel block's MLP reads L_in: (2l, i) → (2l+2, i)).

From the prediction's node (2L, position) an edge is kept when its importance is at least the
threshold τ and its target node is on the route, recursively downwards (Ferrando & Voita
2024). Everything is propagated for many prediction positions at once, as (P, T) matrices per
point: `reach` (1 where a node is on the route) and, with no threshold, `flow` — the share of
the prediction's node that reaches a node along all paths (the product of importances along a
path, summed over paths; the bias terms are where the rest goes). A head's flow is the flow
through its edges: the share of the prediction that passed through the head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from resstream.analysis.routes.importance import FlowImportances
from resstream.checks import check_fraction

#: The paper's threshold τ for the graphs it shows.
DEFAULT_THRESHOLD = 0.04

#: Edge kinds, in the codes `Edges.kinds` stores.
EDGE_KINDS: tuple[str, ...] = ("residual", "head", "mlp")


def check_threshold(threshold: float) -> float:
    """`threshold` when it lies in (0, 1); UsageError naming it otherwise (as the command line
    refuses it, before torch: `resstream.checks.check_fraction`)."""
    check_fraction("threshold", threshold)
    return threshold


def propagate(imp: FlowImportances, targets: Tensor, threshold: float | None) -> tuple[Tensor, ...]:
    """Per point 0..2L, a (P, T) matrix for the prediction positions `targets` (P,): with a
    `threshold`, 1 where the node is on the route of the prediction (0 elsewhere); without,
    the flow from the prediction's node (module docstring)."""
    n_layers, seq_len = imp.n_layers, imp.seq_len
    points: list[Tensor] = [torch.zeros(len(targets), seq_len) for _ in range(2 * n_layers + 1)]
    points[-1][torch.arange(len(targets)), targets] = 1.0
    keep = _keeper(threshold)
    for layer in reversed(range(n_layers)):
        top, mid, low = 2 * layer + 2, 2 * layer + 1, 2 * layer
        mlp_to = low if imp.parallel[layer] else mid
        points[mid] = points[mid] + points[top] * keep(imp.mlp_residual[layer])
        points[mlp_to] = points[mlp_to] + points[top] * keep(imp.mlp[layer])
        sources = keep(imp.heads[layer]).sum(1) if threshold is None else keep(imp.heads[layer]).amax(1)
        points[low] = points[low] + points[mid] * keep(imp.attn_residual[layer]) + points[mid] @ sources
        if threshold is not None:
            points[mid].clamp_(max=1.0)
            points[low].clamp_(max=1.0)
    return tuple(points)


def _keeper(threshold: float | None) -> Callable[[Tensor], Tensor]:
    """The edge weight: the importance itself (no threshold) or 1 where it is ≥ threshold."""
    if threshold is None:
        return lambda weights: weights
    return lambda weights: (weights >= threshold).float()


def head_traffic(imp: FlowImportances, points: tuple[Tensor, ...], threshold: float | None) -> Tensor:
    """(P, L, H): with a threshold, the number of each head's kept edges into nodes on the
    route; without, each head's flow (the share of the prediction through its edges)."""
    keep = _keeper(threshold)
    per_head = [points[2 * layer + 1] @ keep(imp.heads[layer]).sum(-1) for layer in range(imp.n_layers)]
    return torch.stack(per_head, dim=1)


def mlp_traffic(imp: FlowImportances, points: tuple[Tensor, ...], threshold: float | None) -> Tensor:
    """(P, L): with a threshold, the number of positions whose MLP edge is kept into a node on
    the route; without, the MLP's flow."""
    keep = _keeper(threshold)
    return torch.stack(
        [(points[2 * layer + 2] * keep(imp.mlp[layer])).sum(-1) for layer in range(imp.n_layers)], dim=1
    )


@dataclass(frozen=True, eq=False)
class Edges:
    """A route's edges, one entry each: `kinds` (codes into `EDGE_KINDS`), `layers` (block),
    `heads` (−1 unless a head), `sources` and `targets` (positions), `from_points` and
    `to_points` (residual points) and `importances`."""

    kinds: Tensor
    layers: Tensor
    heads: Tensor
    sources: Tensor
    targets: Tensor
    from_points: Tensor
    to_points: Tensor
    importances: Tensor

    def __len__(self) -> int:
        return int(self.kinds.shape[0])

    def kind(self, index: int) -> str:
        return EDGE_KINDS[int(self.kinds[index])]


def route_edges(imp: FlowImportances, target: int, threshold: float) -> Edges:
    """Every kept edge of the route of the prediction at position `target` (module docstring),
    block by block from the top; within a block the MLP node's edges (residual, then MLP, by
    position), then the attention node's (residual by position, then heads by target, head
    and source)."""
    points = propagate(imp, torch.tensor([target]), threshold)
    rows: list[tuple[Tensor, ...]] = []
    for layer in reversed(range(imp.n_layers)):
        top, mid, low = 2 * layer + 2, 2 * layer + 1, 2 * layer
        on_top, on_mid = points[top][0] > 0, points[mid][0] > 0
        mlp_from = low if imp.parallel[layer] else mid
        rows.append(_position_edges("residual", layer, mid, top, on_top, imp.mlp_residual[layer], threshold))
        rows.append(_position_edges("mlp", layer, mlp_from, top, on_top, imp.mlp[layer], threshold))
        rows.append(_position_edges("residual", layer, low, mid, on_mid, imp.attn_residual[layer], threshold))
        rows.append(_head_edges(layer, on_mid, imp.heads[layer], threshold))
    columns = [torch.cat([row[k] for row in rows]) for k in range(8)]
    return Edges(*columns)


def _position_edges(
    kind: str, layer: int, low: int, high: int, on: Tensor, weights: Tensor, threshold: float
) -> tuple[Tensor, ...]:
    """The kept edges (low, i) → (high, i) of one kind into the nodes `on` (T,)."""
    positions = torch.nonzero(on & (weights >= threshold)).reshape(-1)
    n = len(positions)
    codes = (EDGE_KINDS.index(kind), layer, -1)
    return (*_constants(n, *codes), positions, positions, *_constants(n, low, high), weights[positions])


def _head_edges(layer: int, on: Tensor, weights: Tensor, threshold: float) -> tuple[Tensor, ...]:
    """The kept head edges (2l, j) → (2l+1, i) into the nodes `on` (T,); `weights` (T, H, T)."""
    kept = (weights >= threshold) & on[:, None, None]
    target, head, source = torch.nonzero(kept, as_tuple=True)
    n = len(target)
    kind, points = _constants(n, EDGE_KINDS.index("head"), layer), _constants(n, 2 * layer, 2 * layer + 1)
    return (*kind, head, source, target, *points, weights[target, head, source])


def _constants(n: int, *values: int) -> tuple[Tensor, ...]:
    """One (n,) long column per value, filled with it."""
    return tuple(torch.full((n,), value, dtype=torch.long) for value in values)


__all__ = [
    "DEFAULT_THRESHOLD",
    "EDGE_KINDS",
    "Edges",
    "check_threshold",
    "head_traffic",
    "mlp_traffic",
    "propagate",
    "route_edges",
]
