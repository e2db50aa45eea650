"""Routes over a corpus: how often each head and MLP lies on the route of the next-token
prediction, which positions route edges come from, and how much flows through each head.

Every position of a sequence but the last is a prediction; its route is propagated from its
node at the top (`graph.propagate`), all predictions of a sequence at once. Counts are kept
per sequence (`SequenceCounts`), so every rate's interval treats sequences as clusters
(`analysis.stats.cluster_ratio_ci`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from resstream.analysis.routes.graph import head_traffic, mlp_traffic, propagate
from resstream.analysis.routes.importance import FlowImportances
from resstream.analysis.routes.results import Rate
from resstream.analysis.stats import cluster_ratio, cluster_ratio_ci

#: The source categories of head edges: from the first token, the previous position, the
#: query's own position.
EDGE_CATEGORIES = ("first", "previous", "same")


@dataclass(frozen=True)
class SequenceCounts:
    """One sequence's predictions (`positions` of them): per head (L, H) and MLP (L,) and
    attention layer (L,) the number of predictions whose route passes through it; per edge
    category the number of head edges on routes from it, and `head_edges` in all; the summed
    flow through each head (L, H) and MLP (L,)."""

    positions: int
    head_on: Tensor
    mlp_on: Tensor
    attention_on: Tensor
    categories: dict[str, float]
    head_edges: float
    head_flow: Tensor
    mlp_flow: Tensor


def sequence_counts(imp: FlowImportances, threshold: float) -> SequenceCounts:
    """The route counts of every next-token prediction (positions 0..T−2) of one sequence."""
    targets = torch.arange(imp.seq_len - 1)
    reach = propagate(imp, targets, threshold)
    heads = head_traffic(imp, reach, threshold)  # (P, L, H) kept edges into the route
    flow = propagate(imp, targets, None)
    categories, total = _edge_categories(imp, reach, threshold)
    return SequenceCounts(
        positions=len(targets),
        head_on=(heads > 0).sum(0).double(),
        mlp_on=(mlp_traffic(imp, reach, threshold) > 0).sum(0).double(),
        attention_on=(heads.sum(-1) > 0).sum(0).double(),
        categories=categories,
        head_edges=total,
        head_flow=head_traffic(imp, flow, None).sum(0).double(),
        mlp_flow=mlp_traffic(imp, flow, None).sum(0).double(),
    )


def _edge_categories(
    imp: FlowImportances, reach: tuple[Tensor, ...], threshold: float
) -> tuple[dict[str, float], float]:
    """Head edges on the routes of all predictions, by source category, and in all."""
    counts = dict.fromkeys(EDGE_CATEGORIES, 0.0)
    total = 0.0
    positions = torch.arange(imp.seq_len)
    for layer in range(imp.n_layers):
        kept = (imp.heads[layer] >= threshold).float().sum(1)  # (T_i, T_j): heads kept
        on = reach[2 * layer + 1]  # (P, T_i)
        previous = torch.zeros(imp.seq_len)
        previous[1:] = kept[positions[1:], positions[1:] - 1]
        per_query = {"first": kept[:, 0], "previous": previous, "same": kept.diagonal()}
        for name, values in per_query.items():
            counts[name] += float((on @ values).sum())
        total += float((on @ kept.sum(1)).sum())
    return counts, total


@dataclass
class CorpusTally:
    """Per-sequence counts gathered over a corpus, turned into rates by `rates`."""

    sequences: list[SequenceCounts] = field(default_factory=list)

    def add(self, counts: SequenceCounts) -> None:
        self.sequences.append(counts)

    @property
    def positions(self) -> int:
        return sum(s.positions for s in self.sequences)

    def rates(self) -> dict[str, object]:
        """head_on_route (L×H Rate), mlp_on_route, attention_on_route (L Rate), edge_shares
        (category → Rate), head_flow (L×H mean), mlp_flow (L mean)."""
        if not self.sequences:
            raise ValueError("no sequence was counted")
        counts = [float(s.positions) for s in self.sequences]
        edges = [s.head_edges for s in self.sequences]
        positions = float(self.positions)
        return {
            "head_on_route": _rate_table(torch.stack([s.head_on for s in self.sequences]), counts),
            "mlp_on_route": _rate_table(torch.stack([s.mlp_on for s in self.sequences]), counts),
            "attention_on_route": _rate_table(torch.stack([s.attention_on for s in self.sequences]), counts),
            "edge_shares": {
                name: _rate([s.categories[name] for s in self.sequences], edges) for name in EDGE_CATEGORIES
            },
            "head_flow": _nested(torch.stack([s.head_flow for s in self.sequences]).sum(0) / positions),
            "mlp_flow": _nested(torch.stack([s.mlp_flow for s in self.sequences]).sum(0) / positions),
        }


def _rate(sums: list[float], counts: list[float]) -> Rate:
    """Σ sums / Σ counts with its 95% interval over sequences."""
    low, high = cluster_ratio_ci(sums, counts)
    return Rate(cluster_ratio(sums, counts), low, high)


def _rate_table(sums: Tensor, counts: list[float]) -> Any:
    """A nested tuple of `Rate`s, one per entry of sums (S, ...) over the S sequences."""
    if sums.ndim == 1:
        return _rate(sums.tolist(), counts)
    return tuple(_rate_table(sums[:, index], counts) for index in range(sums.shape[1]))


def _nested(values: Tensor) -> Any:
    """A tensor as nested tuples of floats."""
    listed = values.tolist()
    return tuple(tuple(row) for row in listed) if values.ndim == 2 else tuple(listed)


__all__ = ["EDGE_CATEGORIES", "CorpusTally", "SequenceCounts", "sequence_counts"]
