"""Measured and simulated positional attention in a notebook (issue 24): `RecencyReport`,
`RecencyResult`, `SimulationRun` and `SimulationResult` display as self-contained fragments
with the trend lines as a table and the figures `recency` and `simulate` write, give
long-format DataFrames of mean attention with the documented columns whose cells are the
JSON's values, and `to_dict()` is what the command's JSON holds (neither command writes a CSV).

Each command runs once per module (its result kept by wrapping the API function it calls).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from resstream.analysis.recency.measured import RECENCY_COLUMNS
from resstream.reporting.attention import layer_lines, trend_table
from resstream.simulation.results import SIMULATION_COLUMNS, configuration_label
from tests.cli_support import strict_json
from tests.notebook_support import assert_displays, assert_frame_columns
from tests.test_cli_shift import TEXT
from tests.test_notebook_circuits import as_json, run_keeping_result

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAYERS, HEADS, TOKENS = 6, 4, 12
TREND_HEADERS = ["trend by layer", "ρ [95% interval]", "vs uniform [95% interval]", "strict recency"]


@pytest.fixture(scope="module")
def recency_run(tmp_path_factory) -> tuple[Any, Any]:
    """`resstream recency` of the reference model, 3 sequences of 12 tokens: (recency.json, report)."""
    tmp = tmp_path_factory.mktemp("recency")
    corpus = tmp / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    command = ["recency", "--dataset", str(corpus), "--num-seqs", "3", "--seq-len", str(TOKENS)]
    unplotted = ("plot_attention_grid", "plot_distance_profiles")
    out, report = run_keeping_result(command, "recency", tmp, unplotted=unplotted)
    assert not list(out.glob("*.csv"))
    return strict_json(out / "recency.json"), report


def test_recency_displays_the_trend_table_the_grid_and_the_distance_plot(recency_run) -> None:
    _, report = recency_run
    result = report.results[0]
    fragment = assert_displays(result, [*TREND_HEADERS, "heads", "recency.png", "distance plot of reference"])
    assert fragment.count("<img") == 2 and "RecencyResult(" in fragment
    assert len(repr(result).splitlines()) <= 4
    assert "heads: " not in fragment and "(ρ by head " in fragment  # the column says "heads" once


def test_recency_frame_holds_the_json_values(recency_run) -> None:
    data, report = recency_run
    frame = assert_frame_columns(report, RECENCY_COLUMNS)
    pairs = TOKENS * (TOKENS + 1) // 2  # key <= query
    assert len(frame) == LAYERS * (HEADS + 1) * pairs and set(frame["model"]) == {"reference"}
    assert (frame["distance"] == frame["query"] - frame["key"]).all() and (frame["key"] >= 0).all()
    entry = data["models"][0]
    average = frame[frame["head"].isna()]
    for row in average.sample(40, random_state=0).itertuples():
        layer = row.layer - 1
        assert row.value == entry["mean_attention"][layer][row.query][row.key]
        assert row.stderr == entry["stderr"][layer][row.query][row.key]
    # the distance profiles are means over the queries at each distance
    averaged = average.groupby(["layer", "distance"])["value"].mean()
    heads = frame.dropna(subset=["head"]).groupby(["layer", "head", "distance"])["value"].mean()
    for layer in entry["layers"]:
        assert list(averaged[layer["layer"]]) == pytest.approx(layer["by_distance"], abs=1e-12)
        for head in layer["heads"]:
            assert list(heads[(layer["layer"], head["head"])]) == pytest.approx(
                head["by_distance"], abs=1e-12
            )


def test_recency_dict_is_the_json_and_one_model_frames_alike(recency_run) -> None:
    data, report = recency_run
    assert data == as_json(report.to_dict())
    assert report.results[0].to_pandas().equals(report.to_pandas())


def test_recency_of_two_models_shows_a_row_and_a_distance_plot_each(recency_run) -> None:
    _, report = recency_run
    first = dataclasses.replace(report.results[0], layers=report.results[0].layers[:2], num_layers=2)
    other = dataclasses.replace(first, model="other")  # two layers each: fewer panels to draw
    both = dataclasses.replace(report, results=(first, other))
    fragment = assert_displays(both, [*TREND_HEADERS, "distance plot of reference", "distance plot of other"])
    assert fragment.count("<img") == 3 and "RecencyReport(" in fragment
    assert fragment.count("<td>other</td>") == 2  # a trend row per layer of each model
    frame = both.to_pandas()
    assert list(frame["model"].unique()) == ["reference", "other"]
    assert len(frame) == 2 * len(first.to_pandas()) == 2 * 2 * len(report.to_pandas()) // LAYERS


# --------------------------------------------------------------------------- simulate


@pytest.fixture(scope="module")
def simulate_run(tmp_path_factory) -> tuple[Any, Any]:
    """`resstream simulate --grid`, 2 layers of 5 tokens, 300 simulations: (simulate.json, run)."""
    command = ["simulate", "--grid", "--sims", "300", "--tokens", "5", "--layers", "2"]
    out, run = run_keeping_result(
        command, "simulate", tmp_path_factory.mktemp("simulate"), unplotted=("plot_attention_grid",)
    )
    assert not list(out.glob("*.csv"))
    return strict_json(out / "simulate.json"), run


def test_simulation_displays_the_trend_table_and_the_grid(simulate_run) -> None:
    _, run = simulate_run
    fragment = assert_displays(run, [*TREND_HEADERS, "configuration", "simulate.png", *run])
    assert fragment.count("<img") == 1
    result = run.results[2][1]
    fragment = assert_displays(result, [*TREND_HEADERS, configuration_label(result.config)])
    assert fragment.count("<img") == 1
    assert len(repr(result).splitlines()) <= 4


def test_the_trend_table_holds_the_printed_lines(simulate_run) -> None:
    _, run = simulate_run
    table = trend_table([(label, result.layers) for label, result in run.items()], "configuration")
    assert list(table["configuration"]) == [label for label in run for _ in range(2)]
    lines = [line for result in run.values() for line in layer_lines(result.layers)]
    pairs = zip(lines[::2], lines[1::2], strict=True)
    for row, (trend, strict) in zip(table.itertuples(index=False), pairs, strict=True):
        assert trend == f"layer {row[1]}: {row[2]}: ρ {row[3]}; vs uniform {row[4]}"
        assert strict == f"  strict, every step: {row[5]}; {row[6]}"


def test_simulation_frame_holds_the_json_values(simulate_run) -> None:
    data, run = simulate_run
    assert data == as_json(run.to_dict())
    frame = assert_frame_columns(run, SIMULATION_COLUMNS)
    pairs = 5 * 6 // 2
    assert len(frame) == 4 * 2 * pairs and list(frame["configuration"].unique()) == list(run)
    for index, entry in enumerate(data["configurations"]):
        rows = frame[frame["configuration"] == entry["label"]]
        for row in rows.itertuples():
            assert row.value == entry["mean_attention"][row.layer - 1][row.query][row.key]
            assert row.stderr == entry["stderr"][row.layer - 1][row.query][row.key]
        result = run.results[index][1]
        alone = assert_frame_columns(result, SIMULATION_COLUMNS)
        assert set(alone["configuration"]) == {configuration_label(result.config)}
        assert list(alone["value"]) == list(rows["value"])
