"""resstream.simulation: hand-computed layers, the Gram-space algebra against the feature-space
reference loop, chunk-size independence, the input conventions, the statistics and verdicts,
bad input, and the theory checks (recency and primacy) with fixed seeds.

Every simulation here runs in well under a second; torch is limited to one thread in this
module (restored afterwards) because on a shared 2-core machine two threads can stall.
(One file for the simulation's whole contract: slightly over the ~500 lines we aim for.)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import pytest
import torch

from resstream.errors import RunError, UsageError
from resstream.resources import format_bytes
from resstream.simulation import (
    LAYERNORM_EPS,
    SimulationConfig,
    attention_maps,
    chunk_bytes,
    simulate,
    simulate_reference,
    trend_verdict,
)
from resstream.simulation.config import layer_bytes, simulation_work
from resstream.simulation.inputs import (
    bartlett_factors,
    embedding_chunks,
    input_grams,
    token_mixing,
)
from resstream.simulation.reference import layer_norm, reference_attention
from resstream.simulation.results import row_trend
from resstream.simulation.statistics import (
    MomentAccumulator,
    attention_features,
    feature_width,
    summarise_layer,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    return [w / sum(weights) for w in weights]


def both_implementations(x: torch.Tensor, layers: int, layernorm: bool, residual: float):
    """(Gram-space stack, feature-space reference) attention for one (n, d) input, fp64."""
    gram_space = attention_maps(x[None], layers, layernorm, residual)[:, 0]
    feature_space = reference_attention(x, layers, layernorm, residual)
    return gram_space, feature_space


# ------------------------------------------------------------------ hand-computed layers


def test_two_tokens_without_layernorm_by_hand():
    # x0 = (1, 1, 1, 1), x1 = (1, 1, -1, -1), d = 4: scores X·Xᵀ/2 = [[2, 0], [0, 2]].
    x = torch.tensor([[1.0, 1, 1, 1], [1, 1, -1, -1]], dtype=torch.float64)
    e2 = math.exp(2)
    t = math.tanh(1.0)  # A11 − A10 = (e² − 1)/(e² + 1)
    # Layer 1: row 1 = softmax(0, 2). Layer 2 input: x1' = A10·x0 + A11·x1 = (1, 1, −t, −t),
    # so its scores are x1'·x0'/2 = 1 − t and x1'·x1'/2 = 1 + t².
    layer1_row1 = [1 / (1 + e2), e2 / (1 + e2)]
    layer2_row1 = softmax([1 - t, 1 + t * t])
    for maps in both_implementations(x, 2, layernorm=False, residual=0.0):
        assert maps[0, 0].tolist() == [1.0, 0.0]
        assert maps[0, 1].tolist() == pytest.approx(layer1_row1)
        assert maps[1, 1].tolist() == pytest.approx(layer2_row1)
        assert maps[1, 0].tolist() == [1.0, 0.0]
    assert layer2_row1[0] == pytest.approx(1 / (1 + math.exp(t + t * t)))  # 0.2072438


def test_two_tokens_with_residual_by_hand():
    # As above with X ← A·X + X: x0' = 2·x0 = (2, 2, 2, 2), x1' = (2, 2, −1 − t, −1 − t):
    # scores x1'·x0'/2 = 2 − 2t and x1'·x1'/2 = 4 + (1 + t)².
    x = torch.tensor([[1.0, 1, 1, 1], [1, 1, -1, -1]], dtype=torch.float64)
    t = math.tanh(1.0)
    layer2_row1 = softmax([2 - 2 * t, 4 + (1 + t) ** 2])
    for maps in both_implementations(x, 2, layernorm=False, residual=1.0):
        assert maps[1, 1].tolist() == pytest.approx(layer2_row1)


def test_three_tokens_with_layernorm_by_hand():
    # d = 2: LN maps every token onto ±(1, −1). x0 = (1, 0), x1 = (0, 1), x2 = (3, 1):
    # centred (0.5, −0.5), (−0.5, 0.5), (1, −1); biased variances 0.25, 0.25, 1.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 1.0]], dtype=torch.float64)
    eps = LAYERNORM_EPS
    a = 0.5 / math.sqrt(0.25 + eps)
    b = 1.0 / math.sqrt(1.0 + eps)
    c = [a, -a, b]  # y_i = c_i·(1, −1)
    torch.testing.assert_close(layer_norm(x), torch.tensor([[a, -a], [-a, a], [b, -b]]).double())
    # Scores y_i·y_j/√2 = √2·c_i·c_j.
    layer1 = [softmax([math.sqrt(2) * c[i] * c[j] for j in range(i + 1)]) for i in range(3)]
    assert layer1[1][0] == pytest.approx(sigmoid(-2 * math.sqrt(2) * a * a))
    # Layer 2: x_i' = Σ_j A_ij·y_j = m_i·(1, −1), LN(x_i') = m_i / sqrt(m_i² + eps)·(1, −1).
    m = [sum(layer1[i][j] * c[j] for j in range(i + 1)) for i in range(3)]
    c2 = [mi / math.sqrt(mi * mi + eps) for mi in m]
    layer2 = [softmax([math.sqrt(2) * c2[i] * c2[j] for j in range(i + 1)]) for i in range(3)]
    for maps in both_implementations(x, 2, layernorm=True, residual=0.0):
        for layer, expected in enumerate([layer1, layer2]):
            for i in range(3):
                assert maps[layer, i, : i + 1].tolist() == pytest.approx(expected[i], abs=1e-12)
                assert maps[layer, i, i + 1 :].abs().sum() == 0


@pytest.mark.parametrize("layernorm", [True, False])
@pytest.mark.parametrize("residual", [0.0, 0.5, 1.0])
def test_gram_space_stack_equals_feature_space_definition(layernorm, residual):
    x = 0.8 * torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    gram_space = attention_maps(x, 4, layernorm, residual)
    assert gram_space.shape == (4, 5, 6, 6)
    for s in range(5):
        feature_space = reference_attention(x[s], 4, layernorm, residual)
        torch.testing.assert_close(gram_space[:, s], feature_space, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("layernorm", "residual"), [(True, False), (True, True), (False, False), (False, True)]
)
def test_vectorised_simulation_matches_the_reference_loop(layernorm, residual):
    config = SimulationConfig(
        layers=3,
        tokens=5,
        dim=7,
        simulations=300,
        gamma=0.4,
        sigma=0.7,
        layernorm=layernorm,
        residual=residual,
        residual_scale=0.8,
        sampling="embeddings",
        chunk_size=64,
        seed=5,
    )
    fast, slow = simulate(config), simulate_reference(config)
    assert slow.method == "reference loop" and fast.method == "vectorised"
    for a, b in zip(fast.layers, slow.layers, strict=True):
        torch.testing.assert_close(torch.tensor(a.mean), torch.tensor(b.mean), rtol=0, atol=1e-6)
        torch.testing.assert_close(torch.tensor(a.stderr), torch.tensor(b.stderr), rtol=0, atol=1e-6)


# ------------------------------------------------------------- inputs and chunk sizes


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize(("tokens", "dim", "layernorm"), [(5, 7, True), (6, 3, False), (4, 2, True)])
def test_random_draws_do_not_depend_on_the_chunk_size(chunk, tokens, dim, layernorm):
    base = SimulationConfig(tokens=tokens, dim=dim, simulations=101, gamma=0.3, layernorm=layernorm)
    whole, chunked = replace(base, chunk_size=101), replace(base, chunk_size=chunk)
    assert torch.equal(
        torch.cat(list(bartlett_factors(whole)), dim=-1),
        torch.cat([f.clone() for f in bartlett_factors(chunked)], dim=-1),
    )
    assert torch.equal(
        torch.cat([x.clone() for x in embedding_chunks(whole)]),
        torch.cat([x.clone() for x in embedding_chunks(chunked)]),
    )


@pytest.mark.parametrize("sampling", ["gram", "embeddings"])
def test_results_do_not_depend_on_the_chunk_size(sampling):
    base = SimulationConfig(
        layers=3, tokens=6, dim=16, simulations=1000, gamma=0.5, residual=True, sampling=sampling
    )
    reference = simulate(replace(base, chunk_size=1000))
    for chunk in (7, 256):
        other = simulate(replace(base, chunk_size=chunk))
        for a, b in zip(reference.layers, other.layers, strict=True):
            torch.testing.assert_close(torch.tensor(a.mean), torch.tensor(b.mean), rtol=0, atol=1e-6)
            torch.testing.assert_close(
                torch.tensor(a.step_stderr[-1]), torch.tensor(b.step_stderr[-1]), rtol=1e-4, atol=0
            )


def test_different_seeds_give_different_inputs():
    first = next(input_grams(SimulationConfig(simulations=10, seed=0)))
    second = next(input_grams(SimulationConfig(simulations=10, seed=1)))
    assert not torch.equal(first, second)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.9])
def test_embeddings_have_mean_pairwise_cosine_gamma(gamma):
    # E[cos] = γ up to O(γ(1−γ)/d); at d = 4096 that is far below the standard error here.
    config = SimulationConfig(
        tokens=6, dim=4096, simulations=600, gamma=gamma, sigma=2.0, sampling="embeddings"
    )
    x = torch.cat([x.double() for x in embedding_chunks(config)])
    unit = x / x.norm(dim=-1, keepdim=True)
    cosines = unit @ unit.transpose(1, 2)
    i, j = torch.triu_indices(6, 6, offset=1)
    per_simulation = cosines[:, i, j].mean(dim=1)
    stderr = per_simulation.std() / math.sqrt(len(per_simulation))
    assert abs(per_simulation.mean() - gamma) < 4 * stderr
    assert x.pow(2).mean() == pytest.approx(4.0, rel=0.01)  # σ² scales every feature


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.8])
def test_gram_sampler_has_the_anisotropy_convention(gamma):
    # E[G_ij] = γ·E[G_ii] = σ²·d·γ exactly: the per-simulation G_ij − γ·(G_ii + G_jj)/2 has
    # mean 0, and G_ii has mean σ²·d.
    config = SimulationConfig(tokens=5, dim=9, simulations=40_000, gamma=gamma, sigma=0.5, layernorm=False)
    g = torch.cat(list(input_grams(config)), dim=-1).double()
    diagonal = torch.diagonal(g, dim1=0, dim2=1).T
    i, j = torch.triu_indices(5, 5, offset=1)
    excess = (g[i, j] - gamma * (diagonal[i] + diagonal[j]) / 2).mean(dim=0)
    assert abs(excess.mean()) < 4 * excess.std() / math.sqrt(excess.numel())
    assert abs(diagonal.mean() - 0.25 * 9) < 4 * diagonal.mean(0).std() / math.sqrt(40_000)


def test_token_mixing_is_a_square_root_of_the_token_covariance():
    a, b = token_mixing(7, 0.35, 1.5)
    root = a * torch.eye(7, dtype=torch.float64) + b * torch.ones(7, 7, dtype=torch.float64)
    covariance = 1.5**2 * (0.65 * torch.eye(7, dtype=torch.float64) + 0.35 * torch.ones(7, 7))
    torch.testing.assert_close(root @ root.T, covariance.double())


@pytest.mark.parametrize(("tokens", "dim", "layernorm"), [(5, 7, True), (5, 7, False), (6, 3, True)])
def test_gram_sampler_matches_embedding_grams_in_distribution(tokens, dim, layernorm):
    # Bartlett (incl. the rank-deficient d − 1 < n case) against X·Xᵀ / X·C·Xᵀ of drawn
    # embeddings: first and second moments of every entry agree within 4 standard errors.
    base = SimulationConfig(
        tokens=tokens,
        dim=dim,
        simulations=30_000,
        gamma=0.3,
        sigma=0.8,
        layernorm=layernorm,
        seed=1,
    )
    wishart = torch.cat(list(input_grams(base)), dim=-1).double()
    drawn = torch.cat(list(input_grams(replace(base, sampling="embeddings", seed=2))), dim=-1)
    for moment in (1, 2):
        u, v = wishart.pow(moment), drawn.double().pow(moment)
        se = (u.var(dim=-1) / u.shape[-1] + v.var(dim=-1) / v.shape[-1]).sqrt()
        assert ((u.mean(dim=-1) - v.mean(dim=-1)).abs() < 4 * se).all()


def test_both_samplings_give_the_same_attention_in_distribution():
    base = SimulationConfig(layers=3, tokens=6, dim=5, simulations=20_000, gamma=0.4, residual=True, seed=1)
    a = simulate(base)
    b = simulate(replace(base, sampling="embeddings", seed=2))
    for la, lb in zip(a.layers, b.layers, strict=True):
        mean_a, mean_b = torch.tensor(la.mean), torch.tensor(lb.mean)
        se = (torch.tensor(la.stderr) ** 2 + torch.tensor(lb.stderr) ** 2).sqrt()
        lower = torch.ones(6, 6, dtype=torch.bool).tril()
        assert ((mean_a - mean_b).abs()[lower] <= 4 * se[lower]).all()  # A[0][0] = 1: se 0


# ---------------------------------------------------------- statistics and verdicts


def test_rows_of_mean_attention_sum_to_one_and_the_future_is_zero():
    result = simulate(SimulationConfig(layers=3, tokens=7, simulations=2000, gamma=0.2))
    for layer in result.layers:
        for i, row in enumerate(layer.mean):
            assert sum(row) == pytest.approx(1.0, abs=1e-6)
            assert all(v == 0.0 for v in row[i + 1 :])
            assert all(e == 0.0 for e in layer.stderr[i][i + 1 :])
        assert layer.mean[0][0] == pytest.approx(1.0) and layer.stderr[0][0] == pytest.approx(0.0)


def test_steps_and_spreads_are_differences_of_the_means():
    layer = simulate(SimulationConfig(layers=2, tokens=5, simulations=3000, gamma=0.5)).layers[1]
    for i in range(5):
        assert len(layer.step_mean[i]) == i
        for j in range(i):
            diff = layer.mean[i][j + 1] - layer.mean[i][j]
            assert layer.step_mean[i][j] == pytest.approx(diff, abs=1e-6)
    assert math.isnan(layer.spread_mean[0]) and math.isnan(layer.spread_mean[1])
    assert layer.spread_mean[4] == pytest.approx(layer.mean[4][3] - layer.mean[4][0], abs=1e-6)


def test_step_stderr_comes_from_per_simulation_differences():
    # Two perfectly correlated scores: the difference has zero variance, unlike the scores.
    x = torch.tensor([[0.2, 0.3, 0.5], [0.1, 0.3, 0.6], [0.4, 0.3, 0.3]])
    attention = torch.zeros(3, 3, 3)  # (simulation, query, key)
    attention[:, 2] = x  # steps of row 2: 0.1, 0.2 | 0.2, 0.3 | -0.1, 0.0
    attention[:, 0, 0] = 1.0
    attention[:, 1, :2] = 0.5
    accumulator = MomentAccumulator(feature_width(3))
    accumulator.add(attention_features(attention))
    layer = summarise_layer(1, accumulator, 3, threshold=3.0)
    steps = torch.tensor([[0.1, 0.2], [0.2, 0.3], [-0.1, 0.0]], dtype=torch.float64)
    assert layer.step_mean[2] == pytest.approx(steps.mean(0).tolist())
    assert layer.step_stderr[2] == pytest.approx((steps.std(0) / math.sqrt(3)).tolist())
    assert layer.step_stderr[1] == (0.0,)  # 0.5 − 0.5 in every simulation


def test_moment_accumulator_merges_chunks_without_cancellation():
    values = 1000.0 + torch.randn(3, 5000, generator=torch.Generator().manual_seed(0)) * 1e-3
    accumulator = MomentAccumulator(3)
    for part in values.split(777, dim=1):
        accumulator.add(part.clone())
    exact = values.double()
    torch.testing.assert_close(accumulator.mean, exact.mean(1), rtol=1e-7, atol=0)
    torch.testing.assert_close(accumulator.stderr(), exact.std(1) / math.sqrt(5000), rtol=1e-3, atol=0)
    single = MomentAccumulator(1)
    single.add(torch.ones(1, 1))
    assert math.isnan(single.stderr().item())


def test_row_trend_by_hand():
    rising = row_trend(2, [0.1, 0.2], [0.01, 0.1], "recency", threshold=3.0)
    assert (rising.testable, rising.holds) == (True, False)  # z = 10, 2
    assert (rising.min_z, rising.min_margin, rising.weakest_key) == (pytest.approx(2.0), 0.1, 1)
    assert row_trend(2, [0.1, 0.2], [0.01, 0.05], "recency", 3.0).holds  # z = 10, 4
    falling = row_trend(2, [-0.1, -0.2], [0.01, 0.05], "primacy", 3.0)
    assert falling.holds and falling.min_margin == pytest.approx(0.1)
    assert not row_trend(2, [-0.1, -0.2], [0.01, 0.05], "recency", 3.0).holds
    assert row_trend(1, [0.5], [0.0], "recency", 3.0).holds  # exact, z = inf
    assert not row_trend(1, [0.0], [0.0], "recency", 3.0).holds  # z undefined
    untestable = row_trend(0, [], [], "recency", 3.0)
    assert not untestable.testable and not untestable.holds and untestable.weakest_key is None


def test_trend_verdict_summaries():
    verdict = trend_verdict(4, [[], [0.5], [0.1, 0.1]], [[], [0.01], [0.01, 0.1]], "recency")
    assert verdict.layer == 4 and verdict.direction == "recency"
    assert verdict.untestable_rows == (0,)
    assert verdict.holding_rows == (1,) and verdict.failing_rows == (2,)
    assert not verdict.holds and verdict.min_z == pytest.approx(1.0)
    assert json.loads(json.dumps(verdict.to_dict()))["rows"][0]["min_z"] is None


def test_result_layers_are_numbered_from_one_and_serialise_to_json():
    result = simulate(SimulationConfig(layers=2, tokens=3, simulations=100, threshold=2.5))
    assert [layer.layer for layer in result.layers] == [1, 2]
    assert result.layer(2) is result.layers[1]
    assert result.layers[1].recency.layer == 2 and result.layers[1].recency.threshold == 2.5
    assert result.mean_attention[1] == result.layers[1].mean
    data = json.loads(json.dumps(result.to_dict()))
    assert data["config"]["layernorm_eps"] == LAYERNORM_EPS
    assert data["config"]["resolved_chunk_size"] == 100
    assert data["layers"][0]["spread_mean"][0] is None
    with pytest.raises(UsageError, match=r"layer 3 does not exist; allowed: 1\.\.2"):
        result.layer(3)


# -------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("gamma", 1.0, "0 <= gamma < 1"),
        ("gamma", -0.1, "0 <= gamma < 1"),
        ("gamma", math.nan, "0 <= gamma < 1"),
        ("tokens", 1, "an integer >= 2"),
        ("dim", 1, "an integer >= 2"),
        ("layers", 0, "an integer >= 1"),
        ("simulations", 0, "an integer >= 1"),
        ("simulations", 2.5, "an integer >= 1"),
        ("sigma", 0.0, "a number > 0"),
        ("residual_scale", 0.0, "a number > 0"),
        ("residual_scale", -1.0, "a number > 0"),
        ("threshold", 0.0, "a number > 0"),
        ("chunk_size", 0, "an integer >= 1"),
        ("seed", -1, "0 <= seed <"),
        ("layernorm", "yes", "True, False"),
        ("device", "tpu", "cpu"),
        ("sampling", "wishart", "gram, embeddings"),
    ],
)
def test_bad_input_is_refused_in_one_line(field, value, allowed):
    with pytest.raises(UsageError) as caught:
        SimulationConfig(**{field: value})
    message = str(caught.value)
    assert "\n" not in message
    assert field in message and repr(value) in message and allowed in message


def test_a_chunk_that_does_not_fit_in_memory_is_refused_with_its_size():
    config = SimulationConfig(dim=1024, sampling="embeddings", chunk_size=100, simulations=100)
    need = chunk_bytes(config, 100_000)
    assert need > 10e9  # 100,000 × (11·1024 normals + 2·10·1024 embeddings + ...) × 4 bytes
    with pytest.raises(UsageError) as caught:
        SimulationConfig(
            dim=1024, sampling="embeddings", chunk_size=100_000, memory_limit_bytes=2_000_000_000
        )
    message = str(caught.value)
    assert f"needs ~{format_bytes(need)} of buffers" in message and "limit of 2.0 GB" in message
    assert "allowed: chunk_size <= " in message and "\n" not in message
    fitting = int(message.rsplit("<= ", 1)[1])
    kept = config.layers * layer_bytes(config.tokens)  # every layer's statistics, beside the chunk
    assert chunk_bytes(config, fitting) + kept <= 2e9 < chunk_bytes(config, fitting + 1) + kept


def test_attention_maps_refuses_bad_shapes_and_weights():
    with pytest.raises(UsageError, match="allowed: \\(batch, tokens, dim\\)"):
        attention_maps(torch.zeros(3, 4), 2)
    with pytest.raises(UsageError, match=r"`residual_weight` -1\.0 is not allowed"):
        attention_maps(torch.zeros(1, 3, 4), 2, residual_weight=-1.0)
    with pytest.raises(UsageError, match="`layers` 0 is not allowed"):
        attention_maps(torch.zeros(1, 3, 4), 0)


def test_progress_is_reported_per_chunk():
    seen: list[int] = []
    simulate(SimulationConfig(layers=1, simulations=10, chunk_size=4), progress=seen.append)
    assert seen == [4, 4, 2]


def test_large_scores_do_not_overflow_the_softmax():
    # Without LayerNorm at σ = 4, d = 64 the self scores are about σ²·√d = 128 > log(float32 max).
    result = simulate(SimulationConfig(layers=2, sigma=4.0, layernorm=False, simulations=200))
    for layer in result.layers:
        assert all(math.isfinite(v) for row in layer.mean for v in row)
        assert layer.mean[9][9] == pytest.approx(1.0, abs=1e-6)


def test_overflowing_scores_stop_the_run():
    config = SimulationConfig(
        layers=30, sigma=10.0, layernorm=False, residual=True, residual_scale=10.0, simulations=50
    )
    with pytest.raises(RunError, match="not finite"):
        simulate(config)


# ------------------------------------------------------------------------- theory checks


def off_diagonal_step_z(layer) -> list[float]:
    """z of every step between two earlier keys (j + 1 < i), self excluded."""
    return [
        layer.step_mean[i][j] / layer.step_stderr[i][j]
        for i in range(len(layer.step_mean))
        for j in range(i - 1)
    ]


def test_without_layernorm_layer_2_has_no_recency():
    """Theory check 1. σ = 1, d = 64, 50,000 simulations: every off-diagonal step of layer 2 is
    0 within 4 standard errors (the largest |z| is about 2.7), so no row but row 1 (whose only
    step is the query's own, dominant score) shows recency.

    Not exact at every σ: with 10⁶ simulations layer 2 shows a tiny recency at σ = 0.2–0.3
    (A[9][8] − A[9][0] ≈ +1e-5 to +3e-5, z ≈ 7–9, on scores ≈ 0.1) and a primacy at σ = 0.5
    (≈ −3.5e-4, z ≈ −22); at σ = 1 it stays flat (|z| < 2.7).
    """
    config = SimulationConfig(layers=2, sigma=1.0, dim=64, simulations=50_000, layernorm=False)
    layer2 = simulate(config).layer(2)
    assert max(abs(z) for z in off_diagonal_step_z(layer2)) < 4
    assert layer2.recency.holding_rows == (1,)
    assert layer2.recency.failing_rows == tuple(range(2, 10))


def test_without_layernorm_deeper_layers_concentrate_on_the_first_tokens():
    """Theory check 2. σ = 0.3, d = 64, 20,000 simulations: from layer 3 on, every row's scores
    strictly decrease with the key position, self included (primacy, min z ≈ 116 at layer 3,
    > 500 at layer 6), while layers 1 and 2 show no such order.

    Not decisive where the attention stays close to the identity: at σ = 1, d = 64 the self
    score is 0.99 in layer 1 and still 0.60 in layer 24, the diagonal step keeps primacy from
    holding in every layer up to 24, and the off-diagonal spread A[9][8] − A[9][0] even turns
    positive (beyond 3 standard errors from layer 15; +0.017 ± 0.001 at layer 24). At σ = 0.5
    primacy holds from layer 5; at σ = 2 the attention is the identity to float32 precision.
    """
    config = SimulationConfig(layers=6, sigma=0.3, dim=64, simulations=20_000, layernorm=False)
    result = simulate(config)
    assert [layer.primacy.holds for layer in result.layers] == [False, False] + [True] * 4
    assert result.layer(3).primacy.min_z > 50
    first_key = [layer.mean[9][0] for layer in result.layers[2:]]
    assert all(layer.mean[9][0] > layer.mean[9][9] for layer in result.layers[2:])
    assert first_key[-1] > 0.1  # more than the uniform 1/10 on the first token


def test_with_layernorm_and_anisotropy_layer_2_on_has_strict_recency():
    """Theory check 3. LayerNorm, γ = 0.6, d = 64, 20,000 simulations: layers 2–4 show strict
    recency in every row (min z ≈ 12, 29, 33) while layer 1, whose earlier keys are
    exchangeable, does not. (At γ = 0.3 and d = 64 the trend is there but not yet decisive
    with 20,000 simulations: min z ≈ −1, 0, 1.4 in layers 2–4.)"""
    config = SimulationConfig(layers=4, dim=64, gamma=0.6, simulations=20_000, layernorm=True)
    result = simulate(config)
    assert [layer.recency.holds for layer in result.layers] == [False, True, True, True]
    assert result.layer(2).recency.min_z > 6
    assert max(abs(z) for z in off_diagonal_step_z(result.layer(1))) < 4


def test_the_residual_weakens_the_recency():
    """Theory check 4. Same stack as check 3; the stated quantity is the recency spread of the
    last row, A[9][8] − A[9][0] (most recent earlier token minus the first one). In every layer
    from 2 on it shrinks as λ grows (no residual, λ = 0.5, 1, 2), each step by more than 4
    combined standard errors: at layer 4 about 0.102, 0.071, 0.035, 0.013."""
    base = SimulationConfig(layers=4, dim=64, gamma=0.6, simulations=20_000, layernorm=True)
    runs = [simulate(base)] + [
        simulate(replace(base, residual=True, residual_scale=lam)) for lam in (0.5, 1.0, 2.0)
    ]
    for number in (2, 3, 4):
        spreads = [run.layer(number).spread_mean[9] for run in runs]
        errors = [run.layer(number).spread_stderr[9] for run in runs]
        for k in range(3):
            margin = spreads[k] - spreads[k + 1]
            assert margin > 4 * math.hypot(errors[k], errors[k + 1])
    assert runs[0].layer(4).spread_mean[9] > 2 * runs[2].layer(4).spread_mean[9]


# ------------------------------------------------------------ what a simulation costs
def test_tokens_that_do_not_fit_once_are_blamed_on_tokens_with_what_fits():
    with pytest.raises(UsageError) as caught:
        SimulationConfig(tokens=1_000_000_000, memory_limit_bytes=2_000_000_000)
    message = str(caught.value)
    assert message.startswith("`tokens` 1000000000 needs ~") and "for one simulation" in message
    assert "chunk_size" not in message and "limit of 2.0 GB" in message
    fitting = int(re.search(r"allowed: `tokens` <= (\d+)$", message)[1])
    SimulationConfig(tokens=fitting, chunk_size=1, simulations=1, memory_limit_bytes=2_000_000_000)
    with pytest.raises(UsageError):
        SimulationConfig(tokens=fitting + 1, chunk_size=1, simulations=1, memory_limit_bytes=2_000_000_000)


def test_every_layer_keeps_its_statistics_so_layers_are_limited_by_memory():
    with pytest.raises(UsageError) as caught:
        SimulationConfig(layers=1_000_000_000, memory_limit_bytes=2_000_000_000)
    message = str(caught.value)
    assert message.startswith("`layers` 1000000000 needs ~") and "statistics and results" in message
    fitting = int(re.search(r"allowed: `layers` <= (\d+)$", message)[1])
    SimulationConfig(layers=fitting, simulations=1, memory_limit_bytes=2_000_000_000)


def test_layer_memory_estimate_covers_what_a_run_keeps_per_layer():
    """The per-layer estimate is the right size: measured ~23 KB per layer at 10 tokens (the
    accumulators and the result objects), ~1.6 MB at 100."""
    assert 15_000 < layer_bytes(10) < 60_000
    assert 1_000_000 < layer_bytes(100) < 4_000_000


def test_a_run_that_would_take_years_says_how_long_and_how_many_simulations_fit():
    with pytest.raises(UsageError) as caught:
        SimulationConfig(simulations=10**15)
    message = str(caught.value)
    assert message.startswith(
        "`simulations` 1000000000000000 with `layers` 6 and `tokens` 10 would take at least ~"
    ), message
    fitting = int(re.search(r"allowed: `simulations` <= (\d+), runs estimated under 1.0 years$", message)[1])
    SimulationConfig(simulations=fitting)
    assert fitting > 10**9  # a long but real run is not refused


def test_work_grows_with_every_size_that_costs_time():
    base = SimulationConfig()
    for change in ({"simulations": 200_000}, {"layers": 12}, {"tokens": 20}):
        assert simulation_work(replace(base, **change)) > simulation_work(base)
    embeddings = replace(base, sampling="embeddings")
    assert simulation_work(replace(embeddings, dim=4096)) > simulation_work(embeddings)
