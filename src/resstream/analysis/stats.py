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

__all__ = ["cluster_ratio", "cluster_ratio_ci", "t_quantile"]

_EXACT_DF_LIMIT = 200


def _t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's t with integer `df` (Abramowitz & Stegun 26.7.3–26.7.4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for j in range(1, (df - 2) // 2 + 1):  # coefficients (1·3·…(2j−1))/(2·4·…2j) cos^{2j}
            term *= c2 * (2 * j - 1) / (2 * j)
            total += term
        return s * total
    if df == 1:
        return 2.0 * theta / math.pi
    term = math.cos(theta)
    total = term
    for j in range(1, (df - 3) // 2 + 1):  # coefficients (2·4·…2j)/(3·5·…(2j+1)) cos^{2j+1}
        term *= c2 * (2 * j) / (2 * j + 1)
        total += term
    return 2.0 / math.pi * (theta + s * total)


def _normal_quantile(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (0.5 < p < 1) of Student's t distribution with `df` ≥ 1 degrees of freedom.

    Exact (bisection on the closed-form CDF for integer df) up to df = 200; above that a
    Cornish–Fisher expansion around the normal quantile (error < 1e-7).
    """
    if not 0.5 < p < 1.0:
        raise ValueError(f"t_quantile needs 0.5 < p < 1, got {p}")
    if df < 1:
        raise ValueError(f"t_quantile needs df >= 1, got {df}")
    if df > _EXACT_DF_LIMIT:
        z = _normal_quantile(p)
        g1 = (z**3 + z) / 4
        g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
        g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
        return z + g1 / df + g2 / df**2 + g3 / df**3
    mass = 2.0 * p - 1.0
    lo, hi = 0.0, 1.0
    while _t_two_sided_mass(hi, df) < mass:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_two_sided_mass(mid, df) < mass:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return 0.5 * (lo + hi)


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
