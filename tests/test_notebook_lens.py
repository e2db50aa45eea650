"""`resstream.lens`, `resstream.tune_lens` and `resstream.evaluate_lens` in a notebook (issue 24):
`LensResult` shows the table of lens.html and the grid of lens.png, `LensEvaluation` and
`TuneLensReport` their values per layer, bits_per_layer.png and training.png; `to_pandas()`
is the documented long frame, holding the numbers of lens.json and evaluation.json."""

from __future__ import annotations

import json
import math
import re

import pytest

import resstream
from resstream.analysis.decoding.lens_training import EVALUATION_COLUMNS, LensEvaluation
from resstream.analysis.decoding.tuned_lens import TunedLens
from resstream.analysis.shift.lens import LENS_COLUMNS, LensResult
from resstream.api.tune_lens import TuneLensReport
from resstream.models import load_model
from resstream.reporting.lens import LAYER_HEADER, LENS_CLASS
from resstream.reporting.notebook import frame_csv
from resstream.reporting.tuned_lens import evaluation_csv
from tests.notebook_support import assert_displays, assert_frame_columns

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")

TEXT = "To be, or not to be, that is the question"
#: The headers of lens.html's table.
LENS_HEADERS = ["<th>pos</th>", "<th>input</th>", "<th>next</th>", LAYER_HEADER]
#: The headers of an evaluation's per-layer table.
EVALUATION_HEADERS = ["layer", "kl_bits (logit)", "kl_bits (tuned)", "ce_bits (logit)", "ce_bits (tuned)"]


@pytest.fixture(scope="module")
def lens() -> LensResult:
    return resstream.lens(TEXT, top_k=3)


@pytest.fixture(scope="module")
def lens_html(lens) -> str:
    """What the lens shows in a notebook (checked as `assert_displays` checks it)."""
    return assert_displays(lens, LENS_HEADERS)


# --------------------------------------------------------------------------- LensResult


def test_a_lens_shows_the_table_of_lens_html_and_its_grid(lens, lens_html) -> None:
    fragment = lens_html
    assert fragment.count("<img") == 1  # one part of lens.png for a short text
    assert fragment.count("<td title=") == len(lens.trajectories) * (lens.num_layers + 1)
    assert "layer 6 decodes the next token at" in fragment  # the summary's headline


def test_the_lens_table_style_stays_inside_its_box(lens_html) -> None:
    fragment = lens_html
    (style,) = [s for s in re.findall(r"<style>(.*?)</style>", fragment, flags=re.DOTALL) if LENS_CLASS in s]
    selectors = [selector for rule in style.split("}") if rule for selector in rule.split("{")[0].split(",")]
    assert selectors and all(selector.startswith(f".{LENS_CLASS} ") for selector in selectors), selectors
    assert f"<div class='{LENS_CLASS}'>" in fragment


def test_the_lens_frame_has_one_row_per_position_layer_and_decoding(lens) -> None:
    frame = assert_frame_columns(lens, LENS_COLUMNS)
    assert len(frame) == len(lens.trajectories) * (lens.num_layers + 1) * lens.top_k
    assert list(frame["rank"][:3]) == [0, 1, 2]
    assert all(name in (LensResult.__doc__ or "") for name in LENS_COLUMNS)  # documented


def test_the_lens_frame_holds_the_numbers_of_lens_json(lens) -> None:
    data, frame = lens.to_dict(), lens.to_pandas()
    last = len(data["positions"]) - 1
    for index, layer, rank in ((0, 0, 0), (2, 3, 1), (last, lens.num_layers, 2)):
        entry = data["positions"][index]
        (row,) = frame[
            (frame["position"] == entry["position"]) & (frame["layer"] == layer) & (frame["rank"] == rank)
        ].itertuples()
        assert row.input_token == entry["input"] and row.token_id == entry["top_ids"][layer][rank]
        assert row.token == lens.token_text(row.token_id)
        assert row.probability == entry["top_probs"][layer][rank]
        assert row.input_rank == entry["input_ranks"][layer]
        assert row.input_probability == entry["input_probs"][layer]
        if entry["next_id"] is None:  # the text's last token: nothing follows
            assert row.next_token is None or row.next_token != row.next_token
            assert row.next_rank is None or str(row.next_rank) == "<NA>"
            assert math.isnan(row.next_probability)
        else:
            assert row.next_token == entry["next"] and row.next_rank == entry["next_ranks"][layer]
            assert row.next_probability == entry["next_probs"][layer]
    assert data["positions"][last]["next_id"] is None


def test_a_lens_read_back_from_an_old_lens_json_leaves_the_missing_columns_empty(lens) -> None:
    data = lens.to_dict()
    for entry in data["positions"]:  # lens.json before probabilities and ranks were written
        for key in ("input_ranks", "next_ranks", "top_probs", "input_probs", "next_probs"):
            entry.pop(key)
    frame = LensResult.from_dict(data).to_pandas()
    assert list(frame.columns) == list(LENS_COLUMNS) and len(frame) == len(lens.to_pandas())
    for column in ("probability", "input_rank", "input_probability", "next_rank", "next_probability"):
        assert frame[column].isna().all(), column
    assert frame["token_id"].tolist() == lens.to_pandas()["token_id"].tolist()


# --------------------------------------------------------------------------- tuned lens


@pytest.fixture(scope="module")
def evaluation() -> LensEvaluation:
    """An evaluation of a 2-layer model, by hand: what `evaluate_lens` returns."""
    return LensEvaluation(
        model="toy",
        layers=(0, 1, 2),
        logit_kl=(4.0, 2.0, 0.0),
        tuned_kl=(1.0, 0.5, 0.0),
        logit_ce=(6.0, 5.0, 4.0),
        tuned_ce=(5.0, 4.5, 4.0),
        num_tokens=1234,
        sample="2 held-out windows",
    )


def test_an_evaluation_shows_its_values_per_layer_and_bits_per_layer(evaluation) -> None:
    fragment = assert_displays(evaluation, EVALUATION_HEADERS)
    assert fragment.count("<img") == 1 and "bits_per_layer.png" in fragment
    text = repr(evaluation)
    assert "logit lens 3.000 bits, tuned lens 0.750 bits, on 1,234 positions" in text
    assert len(text.splitlines()) <= 4


def test_the_evaluation_frame_holds_the_numbers_of_evaluation_json(evaluation) -> None:
    frame = assert_frame_columns(evaluation, EVALUATION_COLUMNS)
    assert all(name in (LensEvaluation.__doc__ or "") for name in EVALUATION_COLUMNS)  # documented
    data = evaluation.to_dict()
    assert len(frame) == len(data["layers"]) * 4 and set(frame["model"]) == {"toy"}
    for key, lens, metric in (
        ("logit_kl", "logit", "kl_bits"),
        ("tuned_kl", "tuned", "kl_bits"),
        ("logit_ce", "logit", "ce_bits"),
        ("tuned_ce", "tuned", "ce_bits"),
    ):
        chosen = frame[(frame["lens"] == lens) & (frame["metric"] == metric)]
        assert chosen["layer"].tolist() == data["layers"] and chosen["value"].tolist() == data[key], key
    assert evaluation_csv(evaluation) == frame_csv(frame)


@pytest.fixture(scope="module")
def zero_lens() -> TunedLens:
    return TunedLens.zero(load_model(None, device="cpu").view, "reference")


def test_a_training_report_adds_its_curve(evaluation, zero_lens) -> None:
    report = TuneLensReport(zero_lens, evaluation, (3.0, 2.0, 1.5))
    fragment = assert_displays(report, EVALUATION_HEADERS)
    assert fragment.count("<img") == 2 and "training.png" in fragment
    assert report.to_pandas().equals(evaluation.to_pandas())
    assert "3 steps" in repr(report) and "tuned lens 0.750 bits" in repr(report)
    untrained = TuneLensReport(zero_lens, evaluation, ())
    assert untrained._repr_html_().count("<img") == 1  # no curve without steps


def test_a_training_report_holds_evaluation_json_with_its_lens_and_curve(evaluation, zero_lens) -> None:
    data = TuneLensReport(zero_lens, evaluation, (3.0, 2.0)).to_dict()
    assert {k: v for k, v in data.items() if k not in ("lens", "history")} == evaluation.to_dict()
    assert data["lens"] == zero_lens.metadata() and data["history"] == [3.0, 2.0]
    json.dumps(data, allow_nan=False)  # JSON-ready


def test_the_frame_of_the_last_position_alone_keeps_numeric_columns(lens) -> None:
    data = lens.to_dict()
    data["positions"] = data["positions"][-1:]  # nothing follows: every next_* value is missing
    frame = LensResult.from_dict(data).to_pandas()
    assert frame["next_probability"].dtype == "float64" and frame["input_probability"].dtype == "float64"
    assert frame["next_rank"].isna().all() and frame["next_probability"].isna().all()
