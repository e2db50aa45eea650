"""Measured positional bias of trained models: mean attention by query and key position.

`RecencyAccumulator.update(probs)` takes the attention probabilities of a batch of sequences,
(L, batch, heads, T, T) from `resstream.capture.attention_probs`, and keeps, per layer and
head and for the head average, the streaming mean and standard error of every score A[i][j],
of every step A[i][j+1] − A[i][j] and of every spread A[i][i−1] − A[i][0] — the statistics
the parameter-free simulation reports (`resstream.simulation.statistics`), with one sequence
playing the part of one simulation. So the recency / primacy verdicts of a trained model and of
the simulation are the same statistics: the trend (`resstream.simulation.trend`: rank
correlation of attention with key position and ratios to uniform causal attention by distance
band, with 95% intervals over the sequences, which are the clusters) and the strict verdict
(`resstream.simulation.results`): a row shows recency when every step is positive by at least
`threshold` standard errors.

`by_distance[δ]` is the mean over queries i ≥ δ of mean[i][i − δ]: how much attention goes
δ tokens back, averaged over the positions where that distance exists (δ = 0: the token
itself).

`RecencyResult` is one model's statistics, `RecencyReport` those of every model `resstream.recency`
ran on one corpus sample; both display themselves in a notebook and give a DataFrame
(`RECENCY_COLUMNS`), drawn by `resstream.reporting.attention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from resstream.display import Displayable
from resstream.io import jsonable
from resstream.reprs import summary
from resstream.simulation.results import LayerAttention, trend_summary
from resstream.simulation.statistics import (
    MomentAccumulator,
    attention_features,
    feature_width,
    summarise_layer,
)

__all__ = [
    "RECENCY_COLUMNS",
    "HeadAttention",
    "RecencyAccumulator",
    "RecencyReport",
    "RecencyResult",
    "distance_profile",
]

Matrix = tuple[tuple[float, ...], ...]

#: The columns of `RecencyResult.to_pandas()` and `RecencyReport.to_pandas()`, in order.
RECENCY_COLUMNS = ("model", "layer", "head", "query", "key", "distance", "value", "stderr")


def distance_profile(mean: Matrix) -> tuple[float, ...]:
    """by_distance[δ] = mean over queries i ≥ δ of mean[i][i − δ] (module docstring)."""
    n = len(mean)
    return tuple(sum(mean[i][i - delta] for i in range(delta, n)) / (n - delta) for delta in range(n))


@dataclass(frozen=True)
class HeadAttention:
    """Mean attention of one layer: its head average and every head (layers from 1)."""

    layer: int
    average: LayerAttention  # attention averaged over heads, per sequence, then over sequences
    heads: tuple[LayerAttention, ...]

    @property
    def by_distance(self) -> tuple[float, ...]:
        return distance_profile(self.average.mean)

    def head_by_distance(self) -> tuple[tuple[float, ...], ...]:
        return tuple(distance_profile(head.mean) for head in self.heads)


@dataclass(frozen=True)
class RecencyResult(Displayable, renderer="resstream.reporting.attention"):
    """Positional attention of one model over a corpus sample (module docstring).

    `to_pandas()` columns (`RECENCY_COLUMNS`; one row per layer, head and pair of positions
    key <= query): model — the model's name; layer — from 1; head — the head (from 0), NA for
    the average over heads (each sequence's heads averaged first); query, key — the positions
    i and j (from 0); distance — i − j; value — the mean attention of query i to key j over the
    sequences; stderr — its standard error over the sequences (NaN with one sequence). A layer's
    distance profile `by_distance` is the mean of `value` over the queries at each distance:
    `frame.groupby(["model", "layer", "head", "distance"], dropna=False)["value"].mean()`.
    """

    model: str
    num_layers: int
    num_heads: int
    seq_len: int
    num_sequences: int
    threshold: float
    layers: tuple[HeadAttention, ...]
    sample: str = ""
    notes: tuple[str, ...] = ()

    @property
    def mean_attention(self) -> tuple[Matrix, ...]:
        """mean_attention[l][i][j]: head-averaged mean score of key j for query i in layer l + 1."""
        return tuple(layer.average.mean for layer in self.layers)

    @property
    def stderr(self) -> tuple[Matrix, ...]:
        """Per layer: the standard error of the head-averaged attention matrix (beside
        `mean_attention`)."""
        return tuple(layer.average.stderr for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: per layer the head average (matrix, stderr, verdicts, distance profile)
        and per head its verdicts and distance profile (the per-head matrices go to the .npz)."""
        layers = []
        for layer in self.layers:
            entry = layer.average.to_dict()
            entry["by_distance"] = list(layer.by_distance)
            entry["heads"] = [
                {
                    "head": h,
                    "trend": head.trend.to_dict(),
                    "recency": head.recency.to_dict(),
                    "primacy": head.primacy.to_dict(),
                    "by_distance": list(profile),
                }
                for h, (head, profile) in enumerate(zip(layer.heads, layer.head_by_distance(), strict=True))
            ]
            layers.append(entry)
        return jsonable(
            {
                "model": self.model,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "seq_len": self.seq_len,
                "num_sequences": self.num_sequences,
                "threshold": self.threshold,
                "sample": self.sample,
                "notes": list(self.notes),
                "trend": [layer.average.trend.to_dict() for layer in self.layers],
                "mean_attention": [list(map(list, m)) for m in self.mean_attention],
                "stderr": [list(map(list, m)) for m in self.stderr],
                "layers": layers,
            }
        )

    def __repr__(self) -> str:
        return summary(
            self,
            f"{self.model!r}, {self.num_layers} layers × {self.num_heads} heads, "
            f"{self.num_sequences} sequences of {self.seq_len} tokens",
            trend_summary([layer.average for layer in self.layers]),
        )

    def head_arrays(self) -> dict[str, Tensor]:
        """(L, H, T, T) tensors of the per-head means and standard errors (for the .npz)."""
        mean = torch.tensor([[head.mean for head in layer.heads] for layer in self.layers])
        stderr = torch.tensor([[head.stderr for head in layer.heads] for layer in self.layers])
        return {"mean_attention_heads": mean, "stderr_heads": stderr}


@dataclass(frozen=True)
class RecencyReport(Displayable, renderer="resstream.reporting.attention"):
    """`resstream.recency` over one or several models on a corpus sample: each model's
    `RecencyResult`, in the order given.

    `to_pandas()` columns: those of `RecencyResult.to_pandas()` (`RECENCY_COLUMNS`), every
    model's rows one after the other.
    """

    results: tuple[RecencyResult, ...]
    dataset: str
    dataset_fingerprint: str | None
    seq_len: int

    def to_dict(self) -> dict[str, Any]:
        """The content of recency.json."""
        return {
            "dataset": self.dataset,
            "dataset_fingerprint": self.dataset_fingerprint,
            "seq_len": self.seq_len,
            "models": [r.to_dict() for r in self.results],
        }

    def __repr__(self) -> str:
        return summary(self, f"{self.dataset!r}, {self.seq_len} tokens", *map(repr, self.results))


class RecencyAccumulator:
    """Streams batches of attention probabilities into per-layer, per-head statistics."""

    def __init__(self, *, num_layers: int, num_heads: int, seq_len: int, threshold: float = 3.0) -> None:
        if seq_len < 2:
            raise ValueError(f"seq_len {seq_len}; allowed: >= 2 (a single key has no order)")
        self.num_layers, self.num_heads, self.seq_len = num_layers, num_heads, seq_len
        self.threshold = threshold
        width = feature_width(seq_len)
        # slot H of each layer is the head average
        self._moments = [[MomentAccumulator(width) for _ in range(num_heads + 1)] for _ in range(num_layers)]

    def update(self, probs: Tensor) -> None:
        """Add a batch: probs (L, batch, heads, T, T), each sequence one sample."""
        self.add(self.measure(probs))

    def add(self, part: list[list[Tensor]]) -> None:
        """Add one batch's `measure`: batches added in the same order give the same result,
        whichever process measured them (`resstream.distributed.run_sharded`)."""
        for layer, features in enumerate(part):
            for head, chunk in enumerate(features):
                self._moments[layer][head].add(chunk)

    def measure(self, probs: Tensor) -> list[list[Tensor]]:
        """One batch's features (`update`'s argument), per layer and head (the last: the head
        average), not yet added."""
        expected = (self.num_layers, self.num_heads, self.seq_len, self.seq_len)
        if probs.ndim != 5 or (probs.shape[0], *probs.shape[2:]) != expected:
            raise ValueError(
                f"attention of shape {tuple(probs.shape)}; expected (L, batch, H, T, T) "
                f"with (L, H, T, T) = {expected}"
            )
        probs = probs.detach().float().cpu()
        return [
            [attention_features(probs[layer][:, head]) for head in range(self.num_heads)]
            + [attention_features(probs[layer].mean(dim=1))]
            for layer in range(self.num_layers)
        ]

    @property
    def num_sequences(self) -> int:
        return self._moments[0][0].count if self.num_layers else 0

    def result(self, model: str, *, sample: str = "", notes: tuple[str, ...] = ()) -> RecencyResult:
        """The statistics so far (layers numbered from 1)."""
        if self.num_sequences == 0:
            raise ValueError("no batches were added: call update() with at least one batch first")
        layers = tuple(
            HeadAttention(
                layer=layer + 1,
                average=summarise_layer(layer + 1, moments[self.num_heads], self.seq_len, self.threshold),
                heads=tuple(
                    summarise_layer(layer + 1, m, self.seq_len, self.threshold)
                    for m in moments[: self.num_heads]
                ),
            )
            for layer, moments in enumerate(self._moments)
        )
        return RecencyResult(
            model,
            self.num_layers,
            self.num_heads,
            self.seq_len,
            self.num_sequences,
            self.threshold,
            layers,
            sample,
            notes,
        )
