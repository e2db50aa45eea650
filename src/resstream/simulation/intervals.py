"""Confidence intervals shared by the simulation and the measured statistics: Student-t
quantiles and the t-interval of a mean from its standard error (torch-free, pure Python).

`resstream.analysis.stats` re-exports `t_quantile` for the cluster intervals of `shift`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Estimate", "mean_interval", "sample_interval", "t_quantile"]

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


@dataclass(frozen=True)
class Estimate:
    """A mean over samples (simulations or sequences) and its confidence interval [low, high].

    nan bounds when there were fewer than two samples; a zero-width interval when every
    sample had the same value (then the estimate is exact).
    """

    value: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        """{"value", "low", "high"} (nan and inf stay floats; `resstream.io.jsonable` maps them to None)."""
        return {"value": self.value, "low": self.low, "high": self.high}


def mean_interval(
    mean: float,
    stderr: float,
    count: int,
    level: float = 0.95,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> Estimate:
    """The t-interval mean ± t(level, count − 1)·stderr of a mean over `count` samples, clipped to
    `bounds` (the range the quantity can take). nan bounds for fewer than two samples or a nan
    standard error."""
    if count < 2 or math.isnan(stderr) or math.isnan(mean):
        return Estimate(mean, math.nan, math.nan)
    half = t_quantile(0.5 + level / 2.0, count - 1) * stderr
    low, high = max(bounds[0], mean - half), min(bounds[1], mean + half)
    return Estimate(mean, low, high)


def sample_interval(
    values: Sequence[float], level: float = 0.95, bounds: tuple[float, float] = (-math.inf, math.inf)
) -> Estimate:
    """The mean of `values` (one per sample: a sequence, a seed) with its t-interval
    (`mean_interval` of their standard error, in float64); nan bounds for fewer than two."""
    import torch

    tensor = torch.tensor(list(values), dtype=torch.float64)
    count = len(tensor)
    stderr = float(tensor.std(unbiased=True) / math.sqrt(count)) if count > 1 else math.nan
    return mean_interval(float(tensor.mean()), stderr, count, level, bounds)
