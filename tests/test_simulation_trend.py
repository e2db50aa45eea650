"""The trend statistics (resstream.simulation.trend): bands, band ratios and row rank correlations
computed by hand on patterns small enough to reason about, their t-intervals, their coverage on
synthetic data, and what the simulation's standard configurations give."""

from __future__ import annotations

import math

import pytest
import torch

from resstream.simulation import SimulationConfig, simulate
from resstream.simulation.intervals import Estimate, mean_interval, t_quantile
from resstream.simulation.statistics import (
    MomentAccumulator,
    attention_features,
    feature_width,
    summarise_layer,
)
from resstream.simulation.trend import distance_bands, row_spearman, uniform_band_mass

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def uniform(n: int) -> torch.Tensor:
    """Uniform causal attention: query i gives 1/(i + 1) to each key j ≤ i."""
    return torch.tensor([[1 / (i + 1) if j <= i else 0.0 for j in range(n)] for i in range(n)])


def previous_token(n: int) -> torch.Tensor:
    """Every query i ≥ 1 gives all its attention to key i − 1; query 0 to itself."""
    attention = torch.zeros(n, n)
    attention[0, 0] = 1.0
    for i in range(1, n):
        attention[i, i - 1] = 1.0
    return attention


def first_token(n: int) -> torch.Tensor:
    """Every query gives all its attention to key 0."""
    attention = torch.zeros(n, n)
    attention[:, 0] = 1.0
    return attention


def layer_of(*maps: torch.Tensor):
    """The summarised layer of the given per-sample (n, n) maps."""
    n = maps[0].shape[0]
    accumulator = MomentAccumulator(feature_width(n))
    accumulator.add(attention_features(torch.stack(maps)))
    return summarise_layer(1, accumulator, n, threshold=3.0)


def test_bands_are_self_then_doubling() -> None:
    assert distance_bands(2) == ((0, 0), (1, 1))
    assert distance_bands(4) == ((0, 0), (1, 3))
    assert distance_bands(10) == ((0, 0), (1, 3), (4, 7), (8, 9))
    assert distance_bands(64) == ((0, 0), (1, 3), (4, 7), (8, 15), (16, 31), (32, 63))


def test_reference_masses_by_hand() -> None:
    # self: 1 + 1/2 + 1/3 + 1/4; δ 1–3 of 4 tokens, uniform over earlier keys (1/i each):
    # δ = 1: rows 1, 2, 3 → 1 + 1/2 + 1/3; δ = 2: rows 2, 3 → 1/2 + 1/3; δ = 3: row 3 → 1/3
    assert uniform_band_mass(4, (0, 0)) == pytest.approx(25 / 12)
    assert uniform_band_mass(4, (1, 3)) == pytest.approx(11 / 6 + 5 / 6 + 1 / 3)


def test_uniform_attention_has_no_trend() -> None:
    trend = layer_of(uniform(4), uniform(4)).trend
    assert trend.spearman == Estimate(0.0, 0.0, 0.0)  # every row's scores tie: ρ = 0, exactly
    for band in trend.bands:
        assert band.log_ratio.value == pytest.approx(0.0, abs=1e-6)
        assert band.ratio.value == pytest.approx(1.0, abs=1e-6)
    assert trend.direction == "none"


def tilted(n: int, tilt: float) -> torch.Tensor:
    """Uniform causal attention tilted toward later keys: query i gives key j a weight
    proportional to 1 + tilt·j, so every row orders its keys although nearly uniform."""
    weights = torch.tensor([[1 + tilt * j if j <= i else 0.0 for j in range(n)] for i in range(n)])
    return weights / weights.sum(dim=1, keepdim=True)


def test_a_consistent_but_negligible_tilt_is_no_direction() -> None:
    # every row ranks its keys in order (ρ = 1 in every row), yet no band is 5% off uniform
    small = layer_of(tilted(8, 0.001), tilted(8, 0.002), tilted(8, 0.0015)).trend
    assert small.spearman.low > 0.99
    assert all(abs(band.ratio.value - 1) < 0.05 for band in small.bands[1:])
    assert not small.departs_from_uniform and small.direction == "none"
    # the same ordering with a visible tilt is recency
    large = layer_of(tilted(8, 0.5), tilted(8, 0.6), tilted(8, 0.55)).trend
    assert large.departs_from_uniform and large.direction == "recency"


def test_previous_token_pattern_by_hand() -> None:
    n = 8  # bands: self, δ 1–3, δ 4–7
    trend = layer_of(previous_token(n), previous_token(n)).trend
    # row i has m = i earlier keys, all attention on the last: ρ = corr(j, [j = m − 1]) = √(3 / (m + 1))
    expected_rho = sum(math.sqrt(3 / (i + 1)) for i in range(2, n)) / (n - 2)
    assert trend.spearman.value == pytest.approx(expected_rho, abs=1e-6)
    assert trend.direction == "recency"
    self_band, near, far = trend.bands
    assert self_band.ratio.value == pytest.approx(1 / sum(1 / (i + 1) for i in range(n)), abs=1e-6)
    # rows 1..7 each give all their earlier attention to δ = 1
    near_reference = sum(1 / i for delta in (1, 2, 3) for i in range(delta, n))
    assert near.ratio.value == pytest.approx(7 / near_reference, abs=1e-6)
    assert near.log_ratio.value == pytest.approx(math.log(7 / near_reference), abs=1e-6)
    assert far.ratio.value == 0.0 and far.log_ratio.value == -math.inf
    assert (trend.near, trend.far) == (near, far)


def test_first_token_pattern_is_primacy() -> None:
    n = 8
    trend = layer_of(first_token(n), first_token(n)).trend
    expected_rho = -sum(math.sqrt(3 / (i + 1)) for i in range(2, n)) / (n - 2)
    assert trend.spearman.value == pytest.approx(expected_rho, abs=1e-6)
    assert trend.direction == "primacy"
    assert trend.bands[1].ratio.value < 1 < trend.bands[2].ratio.value


def test_spearman_ties_get_average_ranks() -> None:
    # row 3 (keys 0, 1, 2) scores 0.2, 0.2, 0.1: ranks 2.5, 2.5, 1 against positions 0, 1, 2:
    # centred ranks 0.5, 0.5, −1 and positions −1, 0, 1 → cov −1.5, ρ = −1.5 / √(1.5 · 2)
    attention = torch.zeros(1, 4, 4)
    attention[0, 3] = torch.tensor([0.2, 0.2, 0.1, 0.5])
    attention[0, 2] = torch.tensor([0.3, 0.3, 0.4, 0.0])  # row 2: a tie, ρ = 0
    rho = row_spearman(attention.permute(1, 2, 0))
    assert rho.item() == pytest.approx((0.0 + -1.5 / math.sqrt(3.0)) / 2, abs=1e-6)


def test_mean_interval_by_hand() -> None:
    values = [1.0, 2.0, 3.0]
    stderr = 1.0 / math.sqrt(3)  # sample sd 1
    estimate = mean_interval(2.0, stderr, 3)
    half = t_quantile(0.975, 2) * stderr
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, rel=1e-6)
    assert (estimate.low, estimate.high) == pytest.approx((2.0 - half, 2.0 + half))
    assert mean_interval(sum(values) / 3, stderr, 3, bounds=(0.0, 2.5)).high == 2.5
    assert math.isnan(mean_interval(1.0, math.nan, 1).low)


def test_one_sample_gives_no_interval_and_no_direction() -> None:
    trend = layer_of(previous_token(5)).trend
    assert math.isnan(trend.spearman.low) and trend.direction == "untestable"


def _dirichlet_rows(n: int, samples: int, generator: torch.Generator) -> torch.Tensor:
    """(samples, n, n) causal attention whose row i is Dirichlet(α_0..α_i), α_j = 1 + j."""
    alpha = torch.arange(1, n + 1, dtype=torch.float64)
    gamma = torch._standard_gamma(alpha.expand(samples, n, n).contiguous(), generator=generator)
    gamma = gamma.tril()
    return (gamma / gamma.sum(dim=2, keepdim=True)).float()


def test_intervals_cover_the_truth_on_synthetic_data() -> None:
    """95% intervals over 30 samples cover the true values in about 95% of 300 replicates.

    Truth of a band ratio: the earlier keys of a Dirichlet row, renormalised, are Dirichlet of
    their α, so E[share of key j] = α_j / Σ_{k<i} α_k exactly; truth of ρ: 200,000 samples."""
    n, generator = 6, torch.Generator().manual_seed(0)
    alpha = [1.0 + j for j in range(n)]
    near = (1, 3)
    shares = sum(alpha[i - d] / sum(alpha[:i]) for d in range(near[0], near[1] + 1) for i in range(d, n))
    true_near = shares / uniform_band_mass(n, near)
    true_rho = row_spearman(_dirichlet_rows(n, 200_000, generator).permute(1, 2, 0)).double().mean().item()
    covered_near = covered_rho = 0
    replicates = 300
    for _ in range(replicates):
        trend = layer_of(*_dirichlet_rows(n, 30, generator)).trend
        band = trend.bands[1]
        covered_near += band.ratio.low <= true_near <= band.ratio.high
        covered_rho += trend.spearman.low <= true_rho <= trend.spearman.high
    assert 0.90 <= covered_near / replicates <= 0.99, covered_near
    assert 0.90 <= covered_rho / replicates <= 0.99, covered_rho
    assert true_rho > 0.1 and true_near > 1  # the pattern favours recent keys


def test_simulated_layernorm_with_anisotropy_shows_recency_and_layer_one_none() -> None:
    result = simulate(SimulationConfig(layers=3, tokens=8, simulations=4000, gamma=0.5, seed=1))
    layer1, _, layer3 = (layer.trend for layer in result.layers)
    # layer 1's scores are exchangeable in the keys: ρ's interval holds 0
    assert layer1.direction == "none" and layer1.spearman.low < 0 < layer1.spearman.high
    assert layer3.direction == "recency" and layer3.spearman.low > 0.1
    assert layer3.near.ratio.low > 1 > layer3.far.ratio.high


def test_reprs_are_one_short_line() -> None:
    result = simulate(SimulationConfig(layers=2, tokens=5, simulations=200))
    text = repr(result)
    assert "\n" not in text and len(text) < 160, text
    assert "2 layers × 5 tokens" in text and "ρ by layer" in text
    assert len(repr(result.layers[0])) < 120
