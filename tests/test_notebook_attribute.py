"""`attribute`, `attribute_corpus` and `decompose` results in a notebook: `_repr_html_` shows the
tables and figures of attribute.html, `to_pandas()` has the documented columns and the values
of `to_dict()`, and every CSV the command writes is the frame's text (or a level's slice)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pandas
import pytest

import resstream
from resstream.analysis.attribution.results import (
    ATTRIBUTE_COLUMNS,
    CORPUS_ATTRIBUTION_COLUMNS,
    AttributeResult,
    CorpusAttribution,
)
from resstream.api.decompose import DECOMPOSE_COLUMNS, DecomposeResult
from resstream.reporting.attribute import attribute_figures, write_attribute_csvs
from resstream.reporting.attribute.frames import (
    CORPUS_LEVELS,
    SINGLE_LEVELS,
    level_frame,
    linearity_frame,
    query_frame,
    trajectory_frame,
)
from resstream.reporting.notebook import frame_csv
from tests.notebook_support import assert_displays, assert_frame_columns
from tests.test_reporting_attribute import corpus

TEXT = "The king said that the queen"
pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def one_text() -> AttributeResult:
    return resstream.attribute(TEXT, foil=".", top=5, progress=False)


@pytest.fixture(scope="module")
def corpus_result(tmp_path_factory: pytest.TempPathFactory) -> CorpusAttribution:
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("The king said that the queen was there, and the prince went home. " * 40)
    return resstream.attribute_corpus(
        dataset=str(path), num_seqs=2, seq_len=10, candidates=4, top=4, progress=False
    )


@pytest.fixture(scope="module")
def decomposed() -> DecomposeResult:
    return resstream.decompose(TEXT, point="L_res_3", sources=True, progress=False)


def rows(frame: pandas.DataFrame, **where: object) -> pandas.DataFrame:
    """The rows of `frame` whose columns hold the given values."""
    kept = pandas.Series(True, index=frame.index)
    for column, value in where.items():
        kept &= frame[column] == value
    return frame[kept]


def one(frame: pandas.DataFrame, column: str, **where: object) -> object:
    """The value of `column` in the single row matching `where`."""
    (value,) = rows(frame, **where)[column].tolist()
    return value


# ------------------------------------------------------------------------------- display
def test_one_text_shows_the_pages_tables_and_every_figure(one_text: AttributeResult) -> None:
    result = replace(one_text, notes=("a note about <post-norm> & others",))
    headers = ["prediction", "check", "notes", *(f"{level.name}.csv" for level in SINGLE_LEVELS)]
    headers += ["trajectory.csv", "query_contributions.csv", "linearity.csv", "bias_DLA", "source_token"]
    fragment = assert_displays(result, headers)
    figures = [name for name, _ in attribute_figures(result)]
    assert fragment.count("<img") == len(figures) == 5  # layers, heads, trajectory, linearity, neurons
    assert all(f"{name}: " in fragment for name in figures)  # each with its caption
    assert "&lt;post-norm&gt; &amp; others" in fragment and "<post-norm>" not in fragment


def test_a_corpus_shows_its_tables_and_figures(corpus_result: CorpusAttribution) -> None:
    headers = ["check", "layers.csv", "heads.csv", "neurons.csv", "metric", "ci_low", "mean_coefficient"]
    fragment = assert_displays(corpus_result, headers)
    assert fragment.count("<img") == 3  # layers, heads, neurons
    assert "prediction" not in fragment


def test_decompose_shows_its_largest_components_without_a_figure(decomposed: DecomposeResult) -> None:
    fragment = assert_displays(decomposed, ["component", "kind", "norm", "share"], figure=False)
    name, _ = decomposed.largest(1)[0]
    assert f"<td>{name}</td>" in fragment and f"of {len(decomposed.components):,}" in fragment
    assert len(re.findall("<tr[ >]", fragment)) == 20 + 1  # the 20 largest and the header


# -------------------------------------------------------------------------------- frames
@pytest.mark.parametrize(
    ("cls", "columns"),
    [
        (AttributeResult, ATTRIBUTE_COLUMNS),
        (CorpusAttribution, CORPUS_ATTRIBUTION_COLUMNS),
        (DecomposeResult, DECOMPOSE_COLUMNS),
    ],
)
def test_every_column_is_documented_by_its_class(cls: type, columns: tuple[str, ...]) -> None:
    doc = cls.__doc__ or ""
    assert "`to_pandas()` columns" in doc
    assert [column for column in columns if f"{column} —" not in doc] == []


def test_one_text_frame_holds_the_values_of_to_dict(one_text: AttributeResult) -> None:
    frame = assert_frame_columns(one_text, ATTRIBUTE_COLUMNS)
    data = one_text.to_dict()
    counts = frame["level"].value_counts().to_dict()
    assert counts == {
        "embedding": 1,
        "layer": 2 * len(data["layers"]),
        "head": len(data["heads"]),
        "source": len(data["sources"]),
        "neuron": len(data["neurons"]),
        "final_bias": 1,
    }
    last = data["layers"][-1]
    assert one(frame, "C", level="layer", layer=last["layer"], part="mlp") == last["mlp_contribution"]
    assert one(frame, "bias_DLA", level="layer", layer=last["layer"], part="attn") == last["attn_bias_dla"]
    head = data["heads"][5]
    assert one(frame, "DLA", level="head", layer=head["layer"], head=head["head"]) == head["dla"]
    source = rows(frame, level="source").iloc[0]
    assert (source["layer"], source["head"], source["source"]) == tuple(
        data["sources"][0][k] for k in ("layer", "head", "source_position")
    )
    assert (source["source_token"], source["C"]) == (
        data["sources"][0]["source_token"],
        data["sources"][0]["contribution"],
    )
    neuron = rows(frame, level="neuron").iloc[0]
    assert neuron["coefficient"] == data["neurons"][0]["coefficient"]
    assert json.loads(neuron["promoted"]) == list(data["neurons"][0]["promoted"])
    assert one(frame, "DLA", level="embedding") == data["embed_dla"]
    assert one(frame, "DLA", level="final_bias") == data["bias_dla"]
    assert math.isnan(one(frame, "C", level="embedding"))
    assert pandas.isna(one(frame, "head", level="layer", layer=0, part="attn"))
    whole = frame[frame["level"].isin(["embedding", "layer", "final_bias"])]["DLA"].sum()
    assert whole == pytest.approx(data["logit_difference"], abs=1e-4)  # the DLA adds up


def test_corpus_frame_holds_the_means_and_intervals_of_to_dict(corpus_result: CorpusAttribution) -> None:
    frame = assert_frame_columns(corpus_result, CORPUS_ATTRIBUTION_COLUMNS)
    data = corpus_result.to_dict()
    assert len(frame) == 2 * (2 * len(data["layers"]) + len(data["heads"]) + len(data["neurons"]))
    layer = data["layers"][1]
    row = rows(frame, level="layer", layer=1, part="attn", metric="DLA").iloc[0]
    assert (row["value"], row["ci_low"], row["ci_high"]) == tuple(
        layer["attn_dla"][k] for k in ("value", "low", "high")
    )
    neuron = data["neurons"][0]
    row = rows(frame, level="neuron", neuron=neuron["neuron"], metric="C").iloc[0]
    assert (
        row["value"] == neuron["contribution"]["value"]
        and row["mean_coefficient"] == neuron["mean_coefficient"]
    )
    assert json.loads(row["promoted"]) == list(neuron["promoted"]) and row["part"] == "mlp"


def test_one_sequence_leaves_the_intervals_missing() -> None:
    frame = corpus(num_seqs=1).to_pandas()
    assert frame["ci_low"].isna().all() and frame["value"].notna().all()


def test_decompose_frame_holds_the_components_of_to_dict(decomposed: DecomposeResult) -> None:
    frame = assert_frame_columns(decomposed, DECOMPOSE_COLUMNS)
    components = decomposed.to_dict()["components"]
    assert frame["component"].tolist() == [c["label"] for c in components] == list(decomposed.labels)
    assert frame["norm"].tolist() == [c["norm"] for c in components]
    assert frame["share"].tolist() == [c["share"] for c in components]
    assert frame["share"].sum() == pytest.approx(1.0, abs=1e-4)  # the components sum to the state
    source = rows(frame, component="L0.H1.S2").iloc[0]
    assert (source["kind"], source["layer"], source["head"], source["source"]) == ("source", 0, 1, 2)
    assert pandas.isna(source["neuron"]) and pandas.isna(one(frame, "layer", component="emb"))
    name, norm = decomposed.largest(1)[0]
    assert norm == frame["norm"].max() and name in repr(decomposed)


# ---------------------------------------------------------------------------------- CSVs
def test_one_texts_csvs_are_the_frames_text(one_text: AttributeResult, tmp_path: Path) -> None:
    write_attribute_csvs(one_text, tmp_path)
    frame = one_text.to_pandas()
    for level in SINGLE_LEVELS:
        assert set(level.columns) <= set(ATTRIBUTE_COLUMNS)
        assert (tmp_path / f"{level.name}.csv").read_text() == frame_csv(level_frame(frame, level))
    assert (tmp_path / "trajectory.csv").read_text() == frame_csv(trajectory_frame(one_text.trajectory))
    assert (tmp_path / "query_contributions.csv").read_text() == frame_csv(query_frame(one_text))
    assert one_text.linearity is not None
    assert (tmp_path / "linearity.csv").read_text() == frame_csv(linearity_frame(one_text.linearity))
    header = (tmp_path / "layers.csv").read_text().splitlines()[0]
    assert header == "layer,part,C,DLA,bias_DLA"


def test_a_corpus_csvs_are_the_frames_text(corpus_result: CorpusAttribution, tmp_path: Path) -> None:
    write_attribute_csvs(corpus_result, tmp_path)
    frame = corpus_result.to_pandas()
    for level in CORPUS_LEVELS:
        assert set(level.columns) <= set(CORPUS_ATTRIBUTION_COLUMNS)
        assert (tmp_path / f"{level.name}.csv").read_text() == frame_csv(level_frame(frame, level))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heads.csv", "layers.csv", "neurons.csv"]
