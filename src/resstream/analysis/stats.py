"""Small statistics helpers: Student-t quantiles and cluster (per-sequence) confidence intervals.

Rates such as the top-k match rate are means over token positions, but positions of one
sequence are not independent. The interval therefore treats each sequence as a cluster and
uses the ratio estimator R = Σ_s y_s / Σ_s n_s (y_s: the sequence's sum, n_s: its number of
positions) with the linearised ("delta method") variance

    var(R) = S / (S − 1) · Σ_s (y_s − R·n_s)² / (Σ_s n_s)²

and a Student-t quantile with S − 1 degrees of freedom (S sequences). With equal-length
sequences this is the familiar mean ± t·sd/√S of the per-sequence rates.
Degenerate cases: fewer than two sequences (or no positions) give (nan, nan); sequences that all
have the same rate give a zero-width interval (R, R).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from resstream.simulation.intervals import t_quantile

__all__ = ["cluster_ratio", "cluster_ratio_ci", "t_quantile"]


def cluster_ratio(sums: Sequence[float], counts: Sequence[float]) -> float:
    """Σ sums / Σ counts, nan when there is nothing counted."""
    total = float(sum(counts))
    return float(sum(sums)) / total if total > 0 else math.nan


def cluster_ratio_ci(
    sums: Sequence[float],
    counts: Sequence[float],
    level: float = 0.95,
    clip: tuple[float, float] | None = (0.0, 1.0),
) -> tuple[float, float]:
    """Confidence interval of Σ sums / Σ counts with sequences as clusters (module docstring).

    `clip` bounds the interval to the range the quantity can take (a rate: [0, 1]).
    Returns (nan, nan) for fewer than two clusters with positions; a zero-width interval when
    every cluster has the same ratio.
    """
    if len(sums) != len(counts):
        raise ValueError(f"{len(sums)} sums but {len(counts)} counts")
    pairs = [(float(y), float(n)) for y, n in zip(sums, counts, strict=True) if n > 0]
    if len(pairs) < 2:
        return (math.nan, math.nan)
    num = len(pairs)
    total = sum(n for _, n in pairs)
    ratio = sum(y for y, _ in pairs) / total
    resid = sum((y - ratio * n) ** 2 for y, n in pairs)
    se = math.sqrt(num / (num - 1) * resid) / total
    half = t_quantile(0.5 + level / 2.0, num - 1) * se
    low, high = ratio - half, ratio + half
    if clip is not None:
        low, high = max(clip[0], low), min(clip[1], high)
    return (low, high)
