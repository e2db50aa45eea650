"""Measuring a steer and the attenuation map: each score against a hand computation on a case
small enough to reason about, the sweep's points on a tiny model (coefficient 0 is the
unsteered model: no KL, nothing changed), and inference-time attenuation against a model
trained with the same fixed gate (the same function, so the same loss)."""

from __future__ import annotations

import math

import pytest
import torch

import resstream
from resstream.analysis.steering.sweep import concept_logprob, continuation_nll, mean_kl, probe_probability
from resstream.errors import UsageError
from tests.test_models_adapters import char_tokenizer, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_continuation_nll_reads_the_logits_of_the_position_before() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]))
    ids = torch.tensor([0, 1, 1])
    # token 1 at position 1 given position 0's distribution: -log 0.5; token 1 at 2 given 1's: -log 0.1
    assert torch.allclose(
        continuation_nll(logits, ids, 1), torch.tensor([math.log(2), -math.log(0.1)], dtype=torch.float64)
    )


def test_concept_logprob_is_the_log_of_the_concepts_total_probability() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.7]]))
    assert concept_logprob(logits, torch.tensor([0, 1])).item() == pytest.approx(math.log(0.3))


def test_mean_kl_against_the_formula() -> None:
    p, q = torch.tensor([[0.5, 0.5]]), torch.tensor([[0.9, 0.1]])
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert mean_kl(p.log(), q.log()) == pytest.approx(expected)
    assert mean_kl(p.log(), p.log()) == 0.0


def test_probe_probability_of_the_mean_state() -> None:
    states = torch.tensor([[1.0, 0.0], [3.0, 2.0]])  # mean (2, 1)
    assert probe_probability(states, torch.tensor([1.0, -1.0]), 0.5) == pytest.approx(
        1 / (1 + math.exp(-1.5))
    )


def _hidden(model) -> int:
    return getattr(model.config, "d_model", None) or model.config.hidden_size


def test_a_sweep_scores_every_site_and_coefficient() -> None:
    model = tiny_model("resstream")
    d = _hidden(model)
    direction = torch.randn(d, generator=torch.Generator().manual_seed(1))
    result = resstream.steer(
        model,
        tokenizer=char_tokenizer(),
        directions={"L1.resid": direction, "L2.resid": direction},
        prompts=["Hi", "Yo"],
        coefs=[0, 30],
        concept_tokens=["a"],
        probe=("L1.resid", direction, 0.0),
        max_new_tokens=4,
    )
    assert [(p.site, p.coef) for p in result.points] == [
        ("L1.resid", 0.0),
        ("L1.resid", 30.0),
        ("L2.resid", 0.0),
        ("L2.resid", 30.0),
    ]
    unsteered = result.points[0]
    assert unsteered.kl == 0.0 and unsteered.changed == 0.0
    assert all(0 < p.concept_score < 1 and p.concept_logprob < 0 and p.perplexity > 1 for p in result.points)
    assert result.points[1].kl > 0
    frame = result.to_pandas()
    assert list(frame.columns)[:3] == ["site", "coef", "concept_score"] and len(frame) == 4


def test_a_sweep_refuses_what_the_model_cannot_take() -> None:
    model, reader = tiny_model("resstream"), char_tokenizer()
    zero = torch.zeros(_hidden(model))
    cases = [
        ({"directions": {"L1.resid": zero}}, "is zero or not finite"),
        ({"directions": {"L1.resid": torch.ones(5)}}, "has shape (5,)"),
        ({"coefs": [1.0, float("inf")]}, "`coefs`"),
        ({"concept_tokens": ["ab"]}, "'ab' is 2 tokens"),
        ({"directions": {}}, "`directions` is empty"),
    ]
    for given, message in cases:
        args = {
            "directions": {"L1.resid": torch.ones(_hidden(model))},
            "prompts": ["Hi"],
            "max_new_tokens": 2,
        }
        with pytest.raises(UsageError) as caught:
            resstream.steer(model, tokenizer=reader, **{**args, **given})
        assert message in str(caught.value), str(caught.value)


def _windows(tmp_path) -> str:
    path = tmp_path / "windows.jsonl"
    rows = torch.randint(3, 96, (3, 12), generator=torch.Generator().manual_seed(2)).tolist()
    path.write_text("".join(f'{{"input_ids": {row}}}\n' for row in rows), encoding="utf-8")
    return str(path)


def test_attenuation_at_inference_equals_the_model_trained_with_that_gate(tmp_path) -> None:
    """Scale(L1.resid, 0.5) on a baseline GPT computes what the same weights compute with a
    fixed gate of α 0.5 at block 1: the same loss and shift layer."""
    from resstream.training.config import ModelConfig
    from resstream.training.model import GPT

    baseline = tiny_model("resstream")
    gated = GPT(
        ModelConfig(
            n_layer=2,
            n_head=2,
            d_model=32,
            block_size=16,
            vocab_size=128,
            gate="fixed",
            alpha=0.5,
            cut_layer=1,
        )
    )
    gated.load_state_dict(baseline.state_dict(), strict=False)
    gated.eval()
    windows = _windows(tmp_path)
    args = {"tokenizer": char_tokenizer(), "dataset": windows, "alphas": [1.0, 0.5]}
    map_ = resstream.attenuation(baseline, layers=[1], **args)
    trained = resstream.attenuation(gated, layers=[0], **args)
    at = {(p.layer, p.alpha): p for p in map_.points}
    reference = next(p for p in trained.points if p.alpha == 1.0)  # the gated model itself
    assert at[(1, 0.5)].loss == pytest.approx(reference.loss, abs=1e-5)
    assert at[(1, 0.5)].shift_layer == reference.shift_layer
    assert at[(1, 1.0)].loss != pytest.approx(reference.loss, abs=1e-3)  # the gate matters here
    assert len(map_.to_pandas()) == 2


def test_attenuation_refuses_factors_and_blocks_out_of_range(tmp_path) -> None:
    args = {"tokenizer": char_tokenizer(), "dataset": _windows(tmp_path)}
    with pytest.raises(UsageError, match="allowed: one or more factors in"):
        resstream.attenuation(tiny_model("resstream"), alphas=[1.5], **args)
    with pytest.raises(UsageError, match=r"allowed: blocks 0\.\.1"):
        resstream.attenuation(tiny_model("resstream"), layers=[2], **args)


def test_a_run_trained_with_the_gate_sits_beside_its_cell_of_the_map(tmp_path) -> None:
    """`runs`: a run with a fixed gate (α 0.5 at block 1) and the baseline's weights is scored
    on the same windows, and its loss is the map's at (block 1, α 0.5)."""
    import json as json_

    from tests.test_evaluate import make_run

    baseline = make_run(tmp_path / "baseline")
    gated = make_run(tmp_path / "gated")
    meta = json_.loads((gated / "model.json").read_text())
    meta["config"]["model"] |= {"gate": "fixed", "alpha": 0.5, "cut_layer": 1}
    (gated / "model.json").write_text(json_.dumps(meta))
    windows = tmp_path / "windows.jsonl"
    rows = torch.randint(3, 60, (3, 12), generator=torch.Generator().manual_seed(4)).tolist()
    windows.write_text("".join(f'{{"input_ids": {row}}}\n' for row in rows), encoding="utf-8")
    result = resstream.attenuation(str(baseline), dataset=str(windows), alphas=[1.0, 0.5], runs=[str(gated)])
    (trained,) = result.trained
    assert (trained.gate, trained.layer, trained.alpha) == ("fixed", 1, 0.5)
    cell = next(p for p in result.points if (p.layer, p.alpha) == (1, 0.5))
    assert trained.loss == pytest.approx(cell.loss, abs=1e-5)
    assert list(result.to_pandas()["kind"]) == ["inference"] * 4 + ["trained"]
