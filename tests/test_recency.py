"""Measured positional attention: statistics by hand, verdicts, distance profile, real models."""

from __future__ import annotations

import math

import pytest
import torch

from resstream.analysis.recency.measured import RecencyAccumulator, distance_profile
from resstream.capture import attention_probs
from resstream.models.adapters import view_of
from tests.test_models_adapters import tiny_ids, tiny_model


def _maps(rows: list[list[list[float]]]) -> torch.Tensor:
    """(1 layer, batch, 1 head, T, T) from a list of T × T maps."""
    return torch.tensor(rows, dtype=torch.float32)[None, :, None]


def test_means_stderrs_and_steps_by_hand() -> None:
    first = [[1, 0, 0], [0.4, 0.6, 0], [0.2, 0.3, 0.5]]
    second = [[1, 0, 0], [0.2, 0.8, 0], [0.0, 0.3, 0.7]]
    acc = RecencyAccumulator(num_layers=1, num_heads=1, seq_len=3)
    acc.update(_maps([first, second]))
    result = acc.result("toy")
    head = result.layers[0].heads[0]
    assert head.mean[1] == pytest.approx((0.3, 0.7, 0.0))
    # stderr of a mean of two values a, b: |a − b| / 2
    assert head.stderr[1][0] == pytest.approx(0.1)
    # steps of row 2: (0.3 − 0.2, 0.5 − 0.3) and (0.3 − 0.0, 0.7 − 0.3)
    assert head.step_mean[2] == pytest.approx((0.2, 0.3))
    assert head.step_stderr[2] == pytest.approx((0.1, 0.1))
    # spread of row 2: A[2][1] − A[2][0] = 0.1 and 0.3
    assert head.spread_mean[2] == pytest.approx(0.2)
    assert result.num_sequences == 2 and result.layers[0].layer == 1


def test_verdicts_follow_the_steps() -> None:
    rising = [[1, 0, 0], [0.3, 0.7, 0], [0.1, 0.3, 0.6]]
    rising_too = [[1, 0, 0], [0.35, 0.65, 0], [0.15, 0.3, 0.55]]
    acc = RecencyAccumulator(num_layers=1, num_heads=1, seq_len=3, threshold=3.0)
    acc.update(_maps([rising, rising_too] * 4))
    verdict = acc.result("toy").layers[0].average.recency
    assert verdict.holds and verdict.holding_rows == (1, 2) and verdict.untestable_rows == (0,)
    assert acc.result("toy").layers[0].average.primacy.failing_rows == (1, 2)


def test_head_average_is_averaged_per_sequence() -> None:
    probs = torch.zeros(1, 1, 2, 2, 2)
    probs[0, 0, 0] = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    probs[0, 0, 1] = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    acc = RecencyAccumulator(num_layers=1, num_heads=2, seq_len=2)
    acc.update(probs)
    assert acc.result("toy").layers[0].average.mean[1] == pytest.approx((0.5, 0.5))


def test_distance_profile_by_hand() -> None:
    mean = ((1.0, 0.0, 0.0), (0.4, 0.6, 0.0), (0.2, 0.3, 0.5))
    assert distance_profile(mean) == pytest.approx(((1 + 0.6 + 0.5) / 3, (0.4 + 0.3) / 2, 0.2))


def test_a_real_model_streams_into_it_and_rows_sum_to_one() -> None:
    view = view_of(tiny_model("resstream"))
    ids = tiny_ids(batch=3, seq=8)
    acc = RecencyAccumulator(num_layers=view.n_layers, num_heads=view.n_heads, seq_len=8)
    acc.update(attention_probs(view, ids[:2]))
    acc.update(attention_probs(view, ids[2:]))
    result = acc.result("tiny")
    assert result.num_sequences == 3
    for layer in result.layers:
        for row in layer.average.mean:
            assert math.fsum(row) == pytest.approx(1.0, abs=1e-6)
    data = result.to_dict()
    assert len(data["mean_attention"]) == view.n_layers and len(data["layers"][0]["heads"]) == view.n_heads
    assert result.head_arrays()["mean_attention_heads"].shape == (view.n_layers, view.n_heads, 8, 8)


def test_batches_give_the_same_result_as_one() -> None:
    view = view_of(tiny_model("gpt2"))
    ids = tiny_ids(batch=4, seq=6)
    whole = RecencyAccumulator(num_layers=2, num_heads=4, seq_len=6)
    whole.update(attention_probs(view, ids))
    parts = RecencyAccumulator(num_layers=2, num_heads=4, seq_len=6)
    for i in range(4):
        parts.update(attention_probs(view, ids[i : i + 1]))
    a, b = whole.result("m").layers[1].heads[3], parts.result("m").layers[1].heads[3]
    torch.testing.assert_close(torch.tensor(a.mean), torch.tensor(b.mean), atol=1e-7, rtol=0)
    torch.testing.assert_close(
        torch.tensor(a.stderr), torch.tensor(b.stderr), atol=1e-7, rtol=0, equal_nan=True
    )


def test_uniform_profile_equals_the_profile_of_uniform_attention() -> None:
    from resstream.reporting.attention import uniform_profile

    n = 5
    uniform = tuple(tuple(1 / (i + 1) if j <= i else 0.0 for j in range(n)) for i in range(n))
    assert uniform_profile(n) == pytest.approx(distance_profile(uniform))
    assert uniform_profile(3) == pytest.approx(((1 + 1 / 2 + 1 / 3) / 3, (1 / 2 + 1 / 3) / 2, 1 / 3))
