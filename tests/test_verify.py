"""`resstream.verify`: every family's view sees exactly what its model computes (fp32 and bf16,
within the tolerances of `analysis.verification.TOLERANCES`), and a view made wrong on
purpose fails the check it breaks."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import resstream
from resstream.analysis import verification
from resstream.analysis.verification import (
    CHECKS,
    TOLERANCES,
    Reference,
    last_state_readings,
    tolerances_for,
    top1_agreement,
)
from resstream.api.verify import DEFAULT_TEXT, own_forward
from resstream.capture import block_internals, residual_states
from resstream.checks import VERIFY_DTYPES
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from resstream.models.adapters.base import InlineScale
from tests.test_models_adapters import ALL_CASES, char_tokenizer, tiny_model

#: Fits every tiny model's context (resstream's: 16 tokens) in the character tokenizer.
TEXT = "the old lamp"
MOE = ("mixtral", "qwen3_moe", "gpt_oss")

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def chars():
    """One token per printable ASCII character (`char_tokenizer`)."""
    return char_tokenizer()


def _copy(case: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return copy.deepcopy(tiny_model(case)).to(dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", ALL_CASES)
def test_every_family_passes_within_the_tolerances_of_its_dtype(case: str, dtype: str, chars) -> None:
    result = resstream.verify(_copy(case, getattr(torch, dtype)), chars, text=TEXT)
    assert result.passed, (result.failed, result.checks)
    assert result.dtype == dtype and result.tolerances == TOLERANCES[dtype]
    assert result.tokens == len(TEXT) and len(result.layers) == view_of(tiny_model(case)).n_layers + 1
    applies = {check.name for check in result.checks if check.applies}
    dense = {"logits", "states", "weights", "decomposition", "lens"}
    assert applies == dense | ({"router"} if case in MOE else set())
    neurons = [layer.neurons for layer in result.layers]  # tiny models: h_L split into every neuron
    assert neurons == [False] * (len(neurons) - 1) + [True]
    if case in MOE:
        assert result.router and all(block.agreement == 1.0 for block in result.router)
    expected = "before the final norm" if case.startswith("resstream") else "after the final norm"
    assert result.last_state.startswith(expected)


def test_a_final_norm_with_a_factor_matches_the_model_before_its_factor(chars) -> None:
    for case in ("cohere", "granite"):
        view = view_of(_copy(case))
        assert isinstance(view.final_norm, InlineScale) and view.final_norm.factor != 1
        result = resstream.verify(view, chars, text=TEXT)
        assert result.passed and result.last_state == "after the final norm, before its factor"


def test_the_figures_are_measured_not_assumed(chars) -> None:
    """fp32 reaches rounding only; bf16 is measurably coarser, and inside its tolerance."""
    fp32 = resstream.verify(_copy("llama"), chars, text=TEXT)
    bf16 = resstream.verify(_copy("llama", torch.bfloat16), chars, text=TEXT)
    assert fp32.logit_relative < 1e-6 and fp32.check("decomposition").value < 1e-6
    assert fp32.check("states").value == 0.0  # the same forward, hooked: the very same tensors
    assert bf16.logit_relative > 10 * fp32.logit_relative
    assert bf16.check("decomposition").value > 10 * fp32.check("decomposition").value
    assert bf16.passed


def test_a_view_whose_final_norm_is_wrong_fails_logits_and_states(chars) -> None:
    view = view_of(_copy("llama"))
    wrong = copy.deepcopy(view.final_norm)
    with torch.no_grad():
        wrong.weight.mul_(1.5)
    result = resstream.verify(dataclasses.replace(view, final_norm=wrong), chars, text=TEXT)
    assert not result.passed and {"logits", "states"} <= set(result.failed)
    assert result.check("decomposition").passed  # the decomposition reads no final norm
    assert result.layers[0].state_relative == 0.0 and result.layers[-1].state_relative > 1e-3


def test_a_view_that_hooks_the_wrong_module_fails_the_states_though_the_logits_pass(chars) -> None:
    """An adapter bug the logits miss: block 0's view names its MLP as the block, so h_0 and
    h_1 are the MLP's input and output; h_2, and so the logits, stay right."""
    view = view_of(_copy("gpt2"))
    first = dataclasses.replace(view.blocks[0], module=view.blocks[0].mlp)
    result = resstream.verify(dataclasses.replace(view, blocks=(first, view.blocks[1])), chars, text=TEXT)
    assert result.check("logits").passed and "states" in result.failed
    assert result.layers[0].state_relative > 1e-3 and result.layers[2].state_relative == 0.0


def test_a_view_with_a_wrong_output_projection_fails_the_decomposition(chars) -> None:
    view = view_of(_copy("qwen2"))
    wrong = dataclasses.replace(view.blocks[1], W_O=view.blocks[1].W_O * 1.01)
    result = resstream.verify(dataclasses.replace(view, blocks=(view.blocks[0], wrong)), chars, text=TEXT)
    assert result.failed == ("weights", "decomposition")
    residuals = [layer.decomposition_relative for layer in result.layers]
    assert residuals[1] < 1e-6 < 1e-3 < residuals[2]  # block 1's heads are wrong from h_2 on


@pytest.mark.parametrize("case", ["llama", "phi3", "falcon_new"])
def test_a_view_with_wrong_query_weights_fails_only_the_weights_check(case: str, chars) -> None:
    """W_Q is read by composition and head read contributions, by nothing the states,
    decomposition or logits depend on: only the weights check can see it (separate, fused
    and grouped projections)."""
    view = view_of(_copy(case))
    block = view.blocks[1]
    right = block.read_attention_weights()
    wrong = dataclasses.replace(right, W_Q=right.W_Q.flip(0))  # heads swapped
    swapped = dataclasses.replace(block, attention_weights=lambda: wrong)
    result = resstream.verify(dataclasses.replace(view, blocks=(view.blocks[0], swapped)), chars, text=TEXT)
    assert result.failed == ("weights",) and result.check("weights").value > 1e-2


def test_wrong_expert_coefficients_fail_the_weights_check(chars) -> None:
    view = view_of(_copy("mixtral"))
    block = view.blocks[0]
    right = block.experts.coefficients
    experts = dataclasses.replace(block.experts, coefficients=lambda x, i, w: 1.01 * right(x, i, w))
    wrong = dataclasses.replace(block, experts=experts)
    result = resstream.verify(dataclasses.replace(view, blocks=(wrong, view.blocks[1])), chars, text=TEXT)
    assert "weights" in result.failed and result.check("weights").value > 1e-3


def _pieces(case: str, chars):
    view = view_of(_copy(case))
    ids = chars(TEXT, return_tensors="pt")["input_ids"]
    return view, residual_states(view, ids)[:, 0], block_internals(view, ids), own_forward(view, ids)


def _verified(view, states, internals, reference: Reference, dtype: str = "float32"):
    return verification.verification(
        view, states, internals, reference, model="tiny", dtype=dtype, device="cpu", text=TEXT
    )


def test_routing_other_than_the_models_fails_the_router_check(chars) -> None:
    view, states, internals, reference = _pieces("mixtral", chars)
    assert _verified(view, states, internals, reference).check("router").passed
    flipped = dataclasses.replace(reference, router_logits=tuple(-r for r in reference.router_logits))
    result = _verified(view, states, internals, flipped)
    assert result.failed == ("router",) and all(block.agreement < 1 for block in result.router)
    missing = _verified(view, states, internals, dataclasses.replace(reference, router_logits=None))
    assert missing.failed == ("router",) and "for 0 of 2 routed blocks" in missing.check("router").note


def test_what_the_model_does_not_offer_does_not_apply(chars) -> None:
    view, states, internals, reference = _pieces("gpt2", chars)
    bare = dataclasses.replace(reference, hidden_states=None, head=None, source="logits only")
    result = _verified(view, states, internals, bare)
    applied = [c.name for c in result.checks if c.applies]
    assert result.passed and applied == ["logits", "weights", "decomposition"]
    assert result.layers[0].state_error is None and result.last_state is None
    assert "no hidden states" in result.check("states").note and result.check("states").passed is None
    short = dataclasses.replace(reference, hidden_states=reference.hidden_states[:-1])
    assert _verified(view, states, internals, short).failed == ("states",)  # a state missing fails


def test_ties_agree_and_a_different_best_token_does_not() -> None:
    ours = torch.tensor([[1.0, 3.0, 3.0], [0.0, 2.0, 1.0], [5.0, 1.0, 0.0]])
    theirs = torch.tensor([[1.0, 2.0, 3.0], [0.0, 2.0, 2.0], [1.0, 5.0, 0.0]])
    # row 0: ours ties 1 and 2, theirs picks 2; row 1: theirs ties 1 and 2; row 2: they differ
    assert top1_agreement(ours, theirs) == pytest.approx(2 / 3)
    assert top1_agreement(ours, ours) == 1.0
    assert top1_agreement(torch.full((1, 3), float("nan")), ours[:1]) == 0.0


def test_the_last_state_readings_compose_to_the_final_norm() -> None:
    norm = torch.nn.LayerNorm(4)
    scaled = InlineScale(0.25, norm)
    h = torch.randn(3, 4)
    readings = last_state_readings(scaled)
    assert [r.label for r in readings] == [
        "before the final norm",
        "after the final norm",
        "after the final norm, before its factor",
    ]
    for reading in readings:
        torch.testing.assert_close(reading.rest(reading.state(h)), scaled(h))
    assert len(last_state_readings(norm)) == 2


def test_a_point_too_large_for_neurons_is_decomposed_into_heads_and_mlps(chars, monkeypatch) -> None:
    view, states, internals, reference = _pieces("llama", chars)
    monkeypatch.setattr(verification, "DECOMPOSITION_BUDGET", (1 + 4 + 48 + 4) * 32)  # not h_2
    result = _verified(view, states, internals, reference)
    assert [layer.neurons for layer in result.layers] == [False, False, False]
    assert result.layers[2].components == 1 + 2 * (4 + 2) and result.passed  # embed; heads, bias, MLP


def test_tolerances_are_one_table_written_with_the_result(chars) -> None:
    assert set(TOLERANCES) == {"float32", "bfloat16"} == set(VERIFY_DTYPES)  # what the CLI allows early
    assert TOLERANCES["float32"].logits <= 1e-5 and TOLERANCES["float32"].decomposition <= 1e-5
    with pytest.raises(UsageError, match=r"unknown `dtype` 'float16'.*; allowed: float32, bfloat16"):
        tolerances_for("float16")
    written = resstream.verify(_copy("gpt2"), chars, text=TEXT).to_dict()
    assert written["tolerances"] == dataclasses.asdict(TOLERANCES["float32"])
    assert [c["name"] for c in written["checks"]] == list(CHECKS) and written["passed"] is True
    assert written["family"] == "gpt2" and written["dtype"] == "float32" and written["device"] == "cpu"
    assert len(written["layers"]) == 3 and written["logits"]["relative"] < 1e-5


def test_the_result_displays_itself_and_gives_one_row_per_layer(chars) -> None:
    result = resstream.verify(_copy("qwen3_moe"), chars, text=TEXT)
    frame = result.to_pandas()
    assert list(frame["layer"]) == [0, 1, 2] and frame["decomposition_relative"].max() < 1e-5
    assert frame["router_agreement"].isna().tolist() == [True, False, False]
    html = result._repr_html_()
    assert "decomposition" in html and "router" in html
    assert "passed" in repr(result) and "qwen3_moe" in repr(result)


def test_bad_input_is_refused(chars) -> None:
    with pytest.raises(UsageError, match="`text` is empty"):
        resstream.verify(_copy("gpt2"), chars, text="  ")
    with pytest.raises(UsageError, match=r"unknown `dtype` 'float16'"):
        resstream.verify("reference", dtype="float16")
    with pytest.raises(UsageError, match=r"the model is in float16, for which verify has no tolerances"):
        resstream.verify(_copy("gpt2", torch.float16), chars, text=TEXT)


def test_the_default_text_is_one_sentence_of_about_twenty_tokens(gpt2_tokenizer) -> None:
    assert 15 <= len(gpt2_tokenizer(DEFAULT_TEXT)["input_ids"]) <= 25
