"""Trend statistics: how far attention favours recent (or early) keys, with confidence intervals.

The strict verdicts (`resstream.simulation.results`) ask whether every step of every row is
decisively ordered; on 63 keys a few noisy steps always fail. These statistics measure the
trend instead, per simulation (or per sequence of a trained model), so that their mean over
the samples has a standard error and a t-interval (`resstream.simulation.intervals`):

* **Band ratios.** Distances δ = i − j are grouped into bands: self (δ = 0), 1–3, 4–7, 8–15, …
  (powers of two, the last band cut at n − 1; `distance_bands`). The self ratio is the
  attention queries give themselves, Σ_i A[i][i], over what uniform causal attention gives
  (Σ_i 1/(i + 1)). For a band of δ ≥ 1, each row's scores of its earlier keys are first divided
  by their sum (the row's attention outside itself), and the ratio is their total over the
  pairs (i, j) with i − j in the band divided by what uniform attention over the earlier keys
  (1/i each) gives there (`uniform_band_mass`). So a band ratio says where the attention that
  leaves the token goes, whatever share self-attention takes: all ratios are 1 for uniform
  attention, near ratios above 1 and far ones below 1 mean recency. (Without that division a
  stack whose self-attention dominates early rows, as in the simulations, shows its near band
  *below* its far band although every row favours recent keys.) The per-sample ratios are
  averaged; the log-ratio and its interval are the logs of that mean and of the ends of its
  t-interval (a lower end ≤ 0 gives −inf). A band covering every earlier distance is 1 exactly.
* **Row rank correlation.** For each query row i ≥ 2, Spearman's ρ between the scores of the
  earlier keys j < i (self excluded, like the band ratios' near bands) and their positions j,
  ties given their average rank and ρ = 0 when all of a row's scores tie; then the mean over
  the rows i = 2..n − 1, all rows weighted alike. ρ > 0: later keys get more (recency);
  ρ < 0: earlier keys get more (primacy). Uniform attention gives 0; a previous-token head
  gives +1 in rows with two earlier keys, less in longer rows (the other keys tie).

Both are extra features of the per-sample feature row (`resstream.simulation.statistics`), so
they stream through the same chunked moment accumulators as the scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from resstream.simulation.intervals import mean_interval
from resstream.simulation.results import AttentionTrend, BandRatio

__all__ = [
    "distance_bands",
    "row_spearman",
    "summarise_trend",
    "trend_features",
    "trend_width",
    "uniform_band_mass",
]

#: The first band after self: the nearest three keys.
_NEAR_LAST = 3


def distance_bands(tokens: int) -> tuple[tuple[int, int], ...]:
    """Bands (first δ, last δ) of distances i − j for `tokens` positions: (0, 0) for self, then
    (1, 3), (4, 7), (8, 15), … with the last band cut at tokens − 1."""
    bands = [(0, 0)]
    first, last = 1, _NEAR_LAST
    while first <= tokens - 1:
        bands.append((first, min(last, tokens - 1)))
        first, last = last + 1, 2 * last + 1
    return tuple(bands)


def uniform_band_mass(tokens: int, band: tuple[int, int]) -> float:
    """The reference mass of a band: for self, Σ_i 1/(i + 1), what uniform causal attention
    gives the query itself; for δ ≥ 1, Σ over δ in the band of Σ_{i = δ}^{tokens − 1} 1/i, what
    uniform attention over each row's earlier keys gives those distances."""
    first, last = band
    if last == 0:
        return math.fsum(1.0 / (i + 1) for i in range(tokens))
    return math.fsum(1.0 / i for delta in range(first, last + 1) for i in range(delta, tokens))


def trend_width(tokens: int) -> int:
    """Number of trend features per sample: one ratio per band and the mean row ρ."""
    return len(distance_bands(tokens)) + 1


def _earlier_keys(tokens: int, device: torch.device) -> Tensor:
    """(n, n, 1) bool, True for the earlier keys j < i of query i."""
    return torch.ones(tokens, tokens, dtype=torch.bool, device=device).tril_(diagonal=-1).unsqueeze(2)


def _band_weights(tokens: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(bands − 1, n·n): row b has 1 / (reference mass of band b + 1) on the flat indices i·n + j
    of the pairs in that band, so weights @ (row-normalised earlier scores) gives the ratios."""
    bands = distance_bands(tokens)[1:]
    distance = (torch.arange(tokens).unsqueeze(1) - torch.arange(tokens).unsqueeze(0)).flatten()
    weights = torch.zeros(len(bands), tokens * tokens, dtype=torch.float64)
    for b, band in enumerate(bands):
        inside = (distance >= band[0]) & (distance <= band[1])
        weights[b, inside] = 1.0 / uniform_band_mass(tokens, band)
    return weights.to(device=device, dtype=dtype)


def band_ratios(attention: Tensor, out: Tensor) -> Tensor:
    """Every band's ratio (module docstring) of (n, n, batch) attention, query i, key j, samples
    last, into `out` (bands, batch). A row that gives its earlier keys nothing at all (attention
    only on itself) counts as uniform over them: it does not order them."""
    n, batch = attention.shape[0], attention.shape[2]
    earlier = _earlier_keys(n, attention.device)
    scores = attention.masked_fill(~earlier, 0.0)
    mass = scores.sum(dim=1, keepdim=True)
    positions = torch.arange(n, device=attention.device, dtype=attention.dtype)
    uniform = (1.0 / positions.clamp(min=1)).view(n, 1, 1).expand(n, n, 1).masked_fill(~earlier, 0.0)
    shares = torch.where(mass > 0, scores / mass.clamp(min=torch.finfo(attention.dtype).tiny), uniform)
    weights = _band_weights(n, attention.dtype, attention.device)
    torch.matmul(weights, shares.reshape(n * n, batch), out=out[1:])
    self_scores = torch.diagonal(attention, dim1=0, dim2=1)  # (batch, n)
    out[0] = self_scores.sum(dim=1) / uniform_band_mass(n, (0, 0))
    return out


def row_spearman(attention: Tensor) -> Tensor:
    """(n, n, batch) attention, query i, key j, samples last → (batch,) the mean over rows
    i = 2..n − 1 of Spearman's ρ between A[i][j] and j over the earlier keys j < i (module
    docstring); zeros when n < 3 (no row has two earlier keys).

    Centred average ranks without sorting: r_j − (m + 1)/2 = ½·Σ_k sign(A[i][j] − A[i][k]) over
    the m earlier keys k (ties count 0), one row at a time (an (i, i, batch) tensor)."""
    n, batch = attention.shape[0], attention.shape[2]
    total = attention.new_zeros(batch)
    for i in range(2, n):
        scores = attention[i, :i]  # (i, batch)
        centred_ranks = torch.sign(scores.unsqueeze(1) - scores.unsqueeze(0)).sum(dim=1)  # 2·(r − r̄)
        positions = torch.arange(i, device=attention.device, dtype=attention.dtype) - (i - 1) / 2
        covariance = positions @ centred_ranks
        rank_spread = centred_ranks.square().sum(dim=0)
        position_spread = float(positions.square().sum())
        rho = covariance / (rank_spread * position_spread).sqrt()
        total += torch.where(rank_spread > 0, rho, torch.zeros_like(rho))
    return total / max(n - 2, 1)


def trend_features(attention: Tensor, out: Tensor) -> Tensor:
    """The trend features of (n, n, batch) attention (samples last) into `out`
    (`trend_width(n)`, batch): the band ratios, then the mean row ρ."""
    band_ratios(attention, out[:-1])
    out[-1].copy_(row_spearman(attention))
    return out


def summarise_trend(
    mean: Sequence[float], stderr: Sequence[float], count: int, tokens: int
) -> AttentionTrend:
    """The `AttentionTrend` from the means and standard errors of the trend features over
    `count` samples: 95% t-intervals, ratios kept ≥ 0 and ρ within [−1, 1]."""
    bands = tuple(
        BandRatio(band[0], band[1], mean_interval(m, e, count, bounds=(0.0, math.inf)))
        for band, m, e in zip(distance_bands(tokens), mean[:-1], stderr[:-1], strict=True)
    )
    spearman = mean_interval(mean[-1], stderr[-1], count, bounds=(-1.0, 1.0))
    return AttentionTrend(spearman=spearman, bands=bands, samples=count)
