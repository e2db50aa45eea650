"""The results of evaluation, comparison and sweep in a notebook: `_repr_html_`, the short repr
and `to_pandas()` of `EvalReport`, `CompareTable` (and the API's `Comparison`) and
`SweepResult`, checked against the JSON and CSV files their commands write."""

from __future__ import annotations

import dataclasses
import json
import math

import pandas
import pytest

from resstream.api.compare import compare
from resstream.cli.main import main
from resstream.errors import UsageError
from resstream.reporting.evaluation import EVAL_COLUMNS
from resstream.reporting.notebook import frame_csv
from resstream.reporting.tables import COMPARE_COLUMNS, SWEEP_COLUMNS, compare_table
from resstream.training.evaluate import EvalReport
from resstream.training.records import load_runs
from resstream.training.scoring import ScoreSums
from tests.notebook_support import assert_displays, assert_frame_columns
from tests.test_evaluate import make_run, write_data_dir
from tests.test_reporting import EVALS, VAL, hand_result, write_sweep

BENCHMARKS = ("wikitext-2", "lambada")


def as_json(data: object) -> object:
    """`data` as it reads back from a JSON file."""
    return json.loads(json.dumps(data))


def cell(frame, **where):
    """The one row of `frame` whose columns have the given values (None: a missing value)."""
    mask = True
    for column, value in where.items():
        mask = mask & (frame[column].isna() if value is None else frame[column] == value)
    rows = frame[mask]
    assert len(rows) == 1, (where, rows)
    return rows.iloc[0]


def same(frame_value, json_value) -> bool:
    """A frame cell holds the JSON value (null in the JSON is a missing value in the frame)."""
    if json_value is None:
        return bool(pandas.isna(frame_value))
    return frame_value == json_value


# ------------------------------------------------------------------------------ eval
@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """`resstream eval` of a tiny run on openwebtext and LAMBADA: its output folder and the
    `EvalReport` the command wrote its files from."""
    import resstream.training.evaluate as evaluate

    root = tmp_path_factory.mktemp("eval")
    run, data = make_run(root / "run"), write_data_dir(root / "data")
    reports: list[EvalReport] = []
    scored = evaluate.run_plan

    def keep(plan, **options):
        reports.append(scored(plan, **options))
        return reports[-1]

    out = root / "out"
    args = ["--model", str(run), "--data-dir", str(data), "--benchmarks", "openwebtext,lambada"]
    args += ["--max-tokens", "120", "--batch-size", "3", "--stride", "8", "--out", str(out), "--quiet"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate, "run_plan", keep)
        code = main(["eval", *args])
    assert code == 0
    (report,) = reports
    return out, report


def test_eval_report_shows_its_frame(evaluated):
    _, report = evaluated
    fragment = assert_displays(report, ["eval.csv", *EVAL_COLUMNS, "last_word_accuracy"], figure=False)
    assert "openwebtext" in fragment and "lambada" in fragment


def test_eval_report_repr_names_the_model_and_each_benchmark(evaluated):
    _, report = evaluated
    text = repr(report)
    assert text.startswith("EvalReport(") and len(text.splitlines()) <= 6, text
    assert repr(report.model) in text and "results=" not in text
    lines = text.splitlines()
    lam = report.results[1]
    assert any(line.strip().startswith("openwebtext: perplexity") for line in lines), text
    assert f"last word {lam.last_word_accuracy:.1f}% of {lam.num_examples} passages" in text


def test_eval_frame_holds_what_eval_json_holds(evaluated):
    out, report = evaluated
    saved = json.loads((out / "eval.json").read_text())
    assert saved == as_json(report.to_dict())
    frame = assert_frame_columns(report, EVAL_COLUMNS)
    assert set(frame["model"]) == {saved["model"]}
    for entry in saved["benchmarks"]:
        for metric in ("loss", "perplexity", "accuracy"):
            row = cell(frame, benchmark=entry["name"], metric=metric)
            assert row["value"] == entry[metric] and row["n"] == entry["num_tokens"]
    lam = cell(frame, benchmark="lambada", metric="last_word_accuracy")
    assert lam["value"] == saved["benchmarks"][1]["last_word_accuracy"]
    assert lam["n"] == saved["benchmarks"][1]["num_examples"]
    assert len(frame) == 3 + 4  # openwebtext has no last-word accuracy


def test_eval_csv_is_the_frame(evaluated):
    out, report = evaluated
    assert (out / "eval.csv").read_text() == frame_csv(report.to_pandas())


def test_a_score_null_in_eval_json_is_missing_in_the_frame_and_empty_in_the_csv():
    report = EvalReport("m", (ScoreSums().result("wikitext-2"),), stride=8, block_size=16)
    frame = report.to_pandas()
    assert list(frame["metric"]) == ["loss", "perplexity", "accuracy"] and frame["value"].isna().all()
    assert frame_csv(frame).splitlines()[1:] == [f"m,wikitext-2,{m},,0" for m in frame["metric"]]


# --------------------------------------------------------------------------- compare
@pytest.fixture
def sweep(tmp_path, monkeypatch):
    """A hand-made sweep directory (no weights: its scores are the saved ones), offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    return write_sweep(tmp_path / "sweep", VAL, EVALS)


def test_compare_table_shows_the_table_bold_and_its_figure(sweep):
    table = compare_table(load_runs([sweep]), BENCHMARKS)
    headers = ["compare.md", "model", "val loss", "wikitext-2 ppl", "lambada last-word acc (%)"]
    fragment = assert_displays(table, [*headers, "best fixed cut (k=1, α=0.5)", "compare.png"])
    assert "<strong>2.600 ± 0.141</strong>" in fragment  # the best val loss, as compare.md's bold
    assert fragment.count("<img") == 1


def test_compare_table_repr_gives_each_rows_val_loss(sweep):
    text = repr(compare_table(load_runs([sweep]), BENCHMARKS))
    assert text.splitlines()[1:4] == [
        "  baseline (n=2): val loss 3.000 ± 1.414",
        "  best fixed cut (k=1, α=0.5) (n=2): val loss 2.600 ± 0.141",
        "  learned gate (n=2): val loss 3.000 ± 0.000",
    ]
    assert "wikitext-2 ppl" in text.splitlines()[4] and len(text.splitlines()) == 6


def test_compare_frame_holds_every_cell_of_the_json(sweep):
    table = compare_table(load_runs([sweep]), BENCHMARKS)
    frame = assert_frame_columns(table, COMPARE_COLUMNS)
    data = table.to_dict()
    assert len(frame) == len(data["rows"]) * len(data["columns"])
    for row in data["rows"]:
        for key, stat in row["cells"].items():
            benchmark, _, metric = key.rpartition("/")
            found = cell(frame, row=row["row"], benchmark=benchmark or None, metric=metric)
            assert found["model"] == row["label"] and found["seeds"] == row["n"]
            assert same(found["cut_layer"], row["cut_layer"]) and same(found["alpha"], row["alpha"])
            assert found["mean"] == stat["mean"] and same(found["std"], stat["std"])
            assert found["n"] == stat["n"] and found["best"] == stat["best"]


def test_api_compare_is_what_the_command_writes(sweep, tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["--benchmarks", ",".join(BENCHMARKS), "--out", str(out), "--quiet"]
    assert main(["compare", str(sweep), *args]) == 0
    capsys.readouterr()
    result = compare(str(sweep), BENCHMARKS)
    assert json.loads((out / "compare.json").read_text()) == as_json(result.to_dict())
    assert (out / "compare.csv").read_text() == frame_csv(result.to_pandas())
    assert (out / "compare.md").read_text() == result.table.to_markdown()
    assert_frame_columns(result, COMPARE_COLUMNS)
    assert_displays(result, ["compare.md", "lambada ppl", "best fixed cut (k=1, α=0.5)"])
    text = repr(result)
    assert text.startswith("Comparison(\n") and "10 runs; benchmarks wikitext-2, lambada" in text, text


def test_api_compare_names_the_benchmarks_it_cannot_read(sweep):
    notes: list[str] = []
    result = compare([sweep], log=notes.append)
    assert notes[0].startswith(
        "compare: skipped wikitext-2, lambada, openwebtext, fineweb-edu: no data directory is set "
        "(give `data_dir` or set RESSTREAM_DATA)"
    ), notes
    assert result.benchmarks == ("shakespeare",) and set(result.skipped) == {
        "wikitext-2",
        "lambada",
        "openwebtext",
        "fineweb-edu",
    }
    assert "skipped wikitext-2, lambada, openwebtext, fineweb-edu" in repr(result)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"run_dirs": []}, "`run_dirs` is empty"),
        ({"benchmarks": "lambda"}, "unknown benchmark 'lambda'"),
        ({"benchmarks": " , "}, "`benchmarks` ' , ' names no benchmark"),
        ({"max_eval_tokens": 1}, "`max_eval_tokens` must be >= 2, got 1"),
    ],
)
def test_api_compare_refuses_bad_arguments_naming_them(sweep, arguments, message):
    with pytest.raises(UsageError, match=message):
        compare(**{"run_dirs": [sweep], **arguments})


# ----------------------------------------------------------------------------- sweep
def scored_sweep(tmp_path):
    """`hand_result` (3 layers, seeds 0 and 1, learned gate histories) with one run scored on
    wikitext-2."""
    result = hand_result(tmp_path)
    scores = {"loss": 2.5, "perplexity": math.exp(2.5), "accuracy": 30.0, "num_tokens": 99}
    scores |= {"last_word_accuracy": None, "num_examples": None}
    runs = (dataclasses.replace(result.runs[0], evals={"wikitext-2": scores}), *result.runs[1:])
    return dataclasses.replace(result, runs=runs, benchmarks=("wikitext-2",))


def test_sweep_shows_its_table_and_both_figures(tmp_path):
    result = scored_sweep(tmp_path)
    headers = ["baseline / best fixed cut / learned gate", "val loss", "wikitext-2 ppl"]
    fragment = assert_displays(result, [*headers, "sweep_val_loss.png", "learned_gate_heatmap.png"])
    assert fragment.count("<img") == 2
    without_gate = dataclasses.replace(result, gate_histories={})
    assert without_gate._repr_html_().count("<img") == 1  # as the command: no heatmap then


def test_sweep_repr_gives_the_plan_and_the_mean_val_losses(tmp_path):
    text = repr(scored_sweep(tmp_path))
    assert text.splitlines()[1:4] == [
        "  10 runs of 3-layer models: seeds 0, 1; fixed cuts at layers 0, 1, 2, α = 0.5; learned gate",
        "  val loss (mean over seeds): baseline 3.000, k=0 3.600, k=1 2.600, k=2 2.800, learned 3.000",
        "  benchmarks wikitext-2",
    ], text


def test_sweep_frame_holds_what_sweep_json_holds(tmp_path):
    result = scored_sweep(tmp_path)
    frame = assert_frame_columns(result, SWEEP_COLUMNS)
    data = as_json(result.to_dict())
    for seed, runs in data["runs"].items():
        for name, run in runs.items():
            row = cell(frame, seed=int(seed), run=name, benchmark=None, metric="val_loss")
            assert row["value"] == run["val_loss"] and row["gate"] == run["gate"]
            assert same(row["cut_layer"], run["cut_layer"]) and same(row["alpha"], run["alpha"])
            for benchmark, scores in (run["eval"] or {}).items():
                for metric in ("loss", "perplexity", "accuracy"):
                    found = cell(frame, seed=int(seed), run=name, benchmark=benchmark, metric=metric)
                    assert found["value"] == scores[metric] and found["n"] == scores["num_tokens"]
    assert len(frame) == len(result.runs) + 3  # one val loss per run, three scores of one run
