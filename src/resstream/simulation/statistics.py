"""Streaming means and standard errors of the attention matrices, chunk by chunk.

Per simulation and layer the statistics see one row of *features* (`attention_features`):
the n² scores A[i][j], the n·(n−1) steps A[i][j+1] − A[i][j], the n − 1 spreads
A[i][i−1] − A[i][0] (i ≥ 1) and the trend features (`resstream.simulation.trend`: one ratio to
uniform attention per distance band and the mean row rank correlation). Per chunk,
`MomentAccumulator.add` takes the fp32 chunk mean and the sum of squared deviations from it (two
passes, no cancellation), then merges them into fp64 totals with Chan et al.'s parallel formula.
The standard error of a mean over N simulations is sd / √N with the sample (N − 1) standard
deviation; nan for N = 1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from resstream.simulation.results import LayerAttention, trend_verdict
from resstream.simulation.trend import summarise_trend, trend_features, trend_width

__all__ = ["MomentAccumulator", "attention_features", "feature_width", "summarise_layer"]


def feature_width(tokens: int) -> int:
    """Number of features per simulation: n² scores, n·(n−1) steps, n − 1 spreads, then the
    trend features (`trend_width`)."""
    return _spreads_end(tokens) + trend_width(tokens)


def _spreads_end(tokens: int) -> int:
    """Where the trend features start: after the scores, steps and spreads."""
    return tokens * tokens + tokens * (tokens - 1) + tokens - 1


def attention_features(attention: Tensor, out: Tensor | None = None) -> Tensor:
    """(batch, n, n) attention, one matrix per simulation (any strides) → (`feature_width(n)`,
    batch) features, simulations last (module docstring). Steps j ≥ i of row i and the spread
    of row 1 are computed too and ignored later; `out` may be a column slice of a wider buffer.
    """
    batch, n = attention.shape[0], attention.shape[1]
    a = attention.permute(1, 2, 0)  # (n, n, batch): a view, contiguous for the simulation's own
    if out is None:
        out = attention.new_empty(feature_width(n), batch)
    scores_end, steps_end, spreads_end = n * n, n * n + n * (n - 1), _spreads_end(n)
    out[:scores_end].view(n, n, batch).copy_(a)
    steps = out[scores_end:steps_end].view(n, n - 1, batch)
    torch.sub(a[:, 1:], a[:, :-1], out=steps)
    recent = torch.diagonal(a, offset=-1, dim1=0, dim2=1).T
    torch.sub(recent, a[1:, 0], out=out[steps_end:spreads_end])
    trend_features(a, out=out[spreads_end:])
    return out


class MomentAccumulator:
    """Count, mean and sum of squared deviations of each feature over all simulations so far."""

    def __init__(self, width: int, device: torch.device | str = "cpu") -> None:
        self.count = 0
        self.mean = torch.zeros(width, dtype=torch.float64, device=device)
        self.squared_deviations = torch.zeros(width, dtype=torch.float64, device=device)

    def add(self, features: Tensor) -> None:
        """Merge a chunk of (width, batch) features, simulations last. Overwrites `features`
        (centres and squares it in place)."""
        batch = features.shape[1]
        chunk_mean = features.mean(dim=1, keepdim=True)
        chunk_squares = features.sub_(chunk_mean).square_().sum(dim=1)
        chunk_mean = chunk_mean.squeeze(1)
        total = self.count + batch
        delta = chunk_mean.double() - self.mean
        self.mean.add_(delta, alpha=batch / total)
        self.squared_deviations.add_(chunk_squares.double())
        self.squared_deviations.add_(delta.square_(), alpha=self.count * batch / total)
        self.count = total

    def stderr(self) -> Tensor:
        """Standard error of each mean (fp64); nan with fewer than two simulations."""
        if self.count < 2:
            return torch.full_like(self.mean, math.nan)
        variance = self.squared_deviations.clamp(min=0.0) / (self.count - 1)
        return (variance / self.count).sqrt_()


def _square(values: list[float], n: int) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(values[i * n : (i + 1) * n]) for i in range(n))


def _steps(values: list[float], n: int) -> tuple[tuple[float, ...], ...]:
    width = n - 1
    return tuple(tuple(values[i * width : i * width + i]) for i in range(n))


def _spreads(values: list[float], n: int) -> tuple[float, ...]:
    return (math.nan, math.nan, *values[1:])  # values[0] is row 1, always 0


def summarise_layer(
    layer: int, accumulator: MomentAccumulator, tokens: int, threshold: float
) -> LayerAttention:
    """The `LayerAttention` of a layer (1-based `layer`) from its accumulated features."""
    n = tokens
    mean = accumulator.mean.cpu().tolist()
    stderr = accumulator.stderr().cpu().tolist()
    scores_end, steps_end, spreads_end = n * n, n * n + n * (n - 1), _spreads_end(n)
    step_mean = _steps(mean[scores_end:steps_end], n)
    step_stderr = _steps(stderr[scores_end:steps_end], n)
    return LayerAttention(
        layer=layer,
        mean=_square(mean[:scores_end], n),
        stderr=_square(stderr[:scores_end], n),
        step_mean=step_mean,
        step_stderr=step_stderr,
        spread_mean=_spreads(mean[steps_end:spreads_end], n),
        spread_stderr=_spreads(stderr[steps_end:spreads_end], n),
        recency=trend_verdict(layer, step_mean, step_stderr, "recency", threshold),
        primacy=trend_verdict(layer, step_mean, step_stderr, "primacy", threshold),
        trend=summarise_trend(mean[spreads_end:], stderr[spreads_end:], accumulator.count, n),
    )
