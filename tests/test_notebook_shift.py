"""`resstream.shift` in a notebook (issue 24): `AlignmentResult` and `ShiftReport` display their
values per layer and the figures `resstream shift` writes, and `to_pandas()` is the long frame
(`SHIFT_COLUMNS`) whose numbers are those of shift.json."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas
import pytest

import resstream
from resstream.analysis.shift.alignment import SHIFT_COLUMNS, SHIFT_METRICS, AlignmentResult
from resstream.api.shift import ShiftReport
from resstream.reporting.notebook import frame_csv
from resstream.reporting.shift import shift_csv
from tests.notebook_support import assert_displays, assert_frame_columns

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")

#: The per-layer table's headers: layer, relative depth and one column per metric.
LAYER_HEADERS = ["layer", "depth", *SHIFT_METRICS]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> ShiftReport:
    """The built-in model through two decoders on two windows of a short text."""
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("To be, or not to be, that is the question. " * 40, encoding="utf-8")
    return resstream.shift(
        dataset=str(path), num_seqs=2, seq_len=16, top_k=3, decoder=["logit-lens", "embedding"]
    )


def images(fragment: str) -> int:
    return fragment.count("<img")


def test_a_result_shows_its_values_per_layer_and_its_three_figures(report) -> None:
    result = report.results[0]
    fragment = assert_displays(result, LAYER_HEADERS)
    assert images(fragment) == 3  # match rates, similarity, shift depths
    assert "shift layer" in fragment and "top-3 match rates" in fragment
    assert ">decoder<" not in fragment  # one result: no model or decoder column


def test_a_report_shows_every_figure_the_command_writes(report) -> None:
    fragment = assert_displays(report, ["<th>decoder</th>", *LAYER_HEADERS])
    # comparison.png, decoders_reference.png, and three per result (model and decoder)
    assert images(fragment) == 1 + 1 + 3 * len(report.results)
    assert "reference (embedding)" in fragment and "reference (logit-lens)" in fragment


def test_the_frame_has_the_documented_columns_and_one_row_per_layer_and_metric(report) -> None:
    result = report.results[0]
    frame = assert_frame_columns(result, SHIFT_COLUMNS)
    assert len(frame) == len(result.layers) * len(SHIFT_METRICS)
    assert list(frame["metric"][: len(SHIFT_METRICS)]) == list(SHIFT_METRICS)
    assert all(name in (result.__doc__ or "") for name in SHIFT_COLUMNS)  # documented
    whole = assert_frame_columns(report, SHIFT_COLUMNS)
    parts = [r.to_pandas() for r in report.results]
    pandas.testing.assert_frame_equal(whole, pandas.concat(parts, ignore_index=True))


def cell(frame: pandas.DataFrame, metric: str, layer: int, column: str = "value") -> float:
    (value,) = frame.loc[(frame["metric"] == metric) & (frame["layer"] == layer), column]
    return float(value)


def same(a: float, b: float | None) -> bool:
    """Equal, with JSON's None standing for nan."""
    return math.isnan(a) if b is None else a == b


def test_the_frame_holds_the_numbers_of_shift_json(report) -> None:
    for result in report.results:
        data, frame = result.to_dict(), result.to_pandas()
        assert set(frame["decoder"]) == {data["decoder"]} and set(frame["model"]) == {data["model"]}
        for layer in (0, 2, data["num_layers"]):
            for metric in ("in_match", "out_match"):
                assert cell(frame, metric, layer) == data[metric][layer]
                low, high = data[f"{metric}_ci"][layer]
                assert same(cell(frame, metric, layer, "ci_low"), low)
                assert same(cell(frame, metric, layer, "ci_high"), high)
            for metric in ("cos_in", "cos_out", "projection"):
                assert cell(frame, metric, layer) == data[metric][layer]
                assert math.isnan(cell(frame, metric, layer, "ci_low"))
            share = cell(frame, "shift_depth", layer)
            assert share == data["shift_depths"][layer] / data["num_tokens"]
            assert cell(frame, "in_match", layer, "depth") == layer / data["num_layers"]
        shares = frame.loc[frame["metric"] == "shift_depth", "value"].sum()
        assert shares + data["never_shifted"] / data["num_tokens"] == pytest.approx(1.0)
        depths = frame[frame["metric"] == "shift_depth"]
        counts = [round(v * n) for v, n in zip(depths["value"], depths["n"], strict=True)]
        assert counts == data["shift_depths"]  # value × n gives back the counts
        assert set(frame.loc[frame["metric"] == "in_match", "n"]) == {data["num_tokens"]}
        assert set(frame.loc[frame["metric"] == "projection", "n"]) == {data["num_projection_tokens"]}


def test_shift_csv_is_the_frame_and_a_missing_interval_is_empty(report) -> None:
    text = shift_csv(report.results)
    assert text == frame_csv(report.to_pandas())
    header, first, *_ = text.splitlines()
    assert header == ",".join(SHIFT_COLUMNS)
    cosine = next(line for line in text.splitlines() if ",cos_in," in line)
    assert ",,," in cosine  # no interval: empty, not "nan"
    assert first.startswith("reference,logit-lens,0,0.0,in_match,")


def test_a_result_read_back_from_shift_json_gives_the_same_frame(report) -> None:
    result = report.results[1]
    again = AlignmentResult.from_dict(result.to_dict())
    pandas.testing.assert_frame_equal(again.to_pandas(), result.to_pandas())


def test_the_short_repr_names_the_model_and_the_shift_layer(report) -> None:
    lines = repr(report).splitlines()
    assert len(lines) <= 5 and any("shift layer" in line and "of 6" in line for line in lines)
    assert "shift layer" in repr(report.results[0]) and len(repr(report.results[0])) < 200


def test_a_shift_that_never_happens_reads_as_one_sentence_everywhere(report, tmp_path, monkeypatch, capsys):
    """The terminal line, both reprs and the report page's caption say it in the same words
    (issue 38: they printed `shift layer never of 6`)."""
    import resstream.api.shift as api_shift
    import resstream.reporting.shift as rendering
    from resstream.cli.main import main
    from resstream.reporting.report.shift_figures import ShiftRun, match_section

    never = dataclasses.replace(report.results[0], shift_layer=None)
    alone = dataclasses.replace(report, results=(never,))
    sentence = "the next token never overtakes the input token in its 6 layers, so there is no shift layer"
    monkeypatch.setattr(api_shift, "shift", lambda *args, **kwargs: alone)
    for name in ("plot_match_rates", "plot_similarity", "plot_shift_depths"):
        monkeypatch.setattr(rendering, name, lambda *args, **kwargs: None)
    assert main(["shift", "--quiet", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    page = match_section([ShiftRun(never, "text", never.sample)])
    for text in (printed, repr(never), repr(alone), page):
        assert sentence in text and "never of" not in text, text


def test_a_single_sequence_has_no_interval(tmp_path: Path) -> None:
    rows = tmp_path / "one.jsonl"
    rows.write_text('{"input_ids": [5, 17, 300, 42, 9, 7, 12]}\n', encoding="utf-8")
    result = resstream.shift(dataset=str(rows), top_k=2).results[0]
    frame = result.to_pandas()
    assert frame["ci_low"].isna().all() and frame["ci_high"].isna().all()
    assert all(math.isnan(bound) for bound in result.in_match_ci[0])  # (nan, nan) in the result itself
