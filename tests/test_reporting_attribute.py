"""attribute's renderers (CSV, PNG, HTML, terminal) on hand-made results."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from matplotlib.image import imread

from resstream.analysis.attribution.results import (
    AttributeResult,
    AttributionCheck,
    CorpusAttribution,
    HeadAttribution,
    HeadSummary,
    LayerAttribution,
    LayerSummary,
    LinearityCheck,
    NeuronAttribution,
    NeuronSummary,
    QueryContribution,
    QueryShare,
    SourceAttribution,
    TrajectoryPoint,
)
from resstream.reporting.attribute import (
    CORPUS_FILES,
    SINGLE_FILES,
    attribute_tables,
    heads_figure,
    layers_figure,
    linearity_figure,
    neurons_figure,
    plot_attribute,
    terminal_summary,
    trajectory_figure,
    write_attribute_csvs,
    write_attribute_html,
    write_attribute_report,
)
from resstream.rundir import output_set
from resstream.simulation.intervals import Estimate

CHECK = AttributionCheck(decomposition_max_abs=2.5e-6, decomposition_relative=1.25e-7, dla_residual=3e-6)


def trajectory(layers: int) -> tuple[TrajectoryPoint, ...]:
    """2L+1 points: the rank climbs while p stays near 0 (silent), then p jumps (loud)."""
    names = [("in", 0)] + [(stage, layer) for layer in range(layers) for stage in ("res", "out")]
    count = len(names)
    points = []
    for index, (stage, layer) in enumerate(names):
        loud = index == count - 1
        probability = 0.62 if loud else 1e-5 * (index + 1)
        rank = 0 if loud else 30000 // (index + 1) ** 3
        points.append(
            TrajectoryPoint(f"L_{stage}_{layer}", layer, stage, probability, rank, math.log(probability))
        )
    return tuple(points)


def single(layers: int = 3, heads: int = 4, *, foil: bool = True, target: str = " Paris") -> AttributeResult:
    """3 layers × 4 heads, 6 sources, 8 neurons, 7 trajectory points, 2 query contributions."""
    tokens = ("The", " capital", " of", " France", " is", "\n", "<b>")
    return AttributeResult(
        model="toy-gpt",
        decoder="logit-lens",
        tokens=tokens,
        position=4,
        target_id=6342,
        target=target,
        logit=14.25,
        logprob=math.log(0.62),
        probability=0.62,
        rank=0,
        layers=tuple(
            LayerAttribution(layer, 0.1 * layer - 0.05, 0.7 * layer + 0.01, 0.3 - layer, 1.5 * layer)
            for layer in range(layers)
        ),
        heads=tuple(
            HeadAttribution(layer, head, 0.05 * (head - 1.5) * (layer + 1), 0.2 * (layer - head))
            for layer in range(layers)
            for head in range(heads)
        ),
        sources=tuple(
            SourceAttribution(j % layers, j % heads, j, tokens[j], 0.3 - 0.1 * j, 0.5 - 0.2 * j)
            for j in range(6)
        ),
        neurons=tuple(
            NeuronAttribution(
                (k % layers),
                700 + k,
                2.0 - 0.3 * k,
                0.9 - 0.2 * k,
                1.1 - 0.25 * k,
                (" Paris", " France", "$x$", "\n")[: 1 + k % 4],
            )
            for k in range(8)
        ),
        trajectory=trajectory(layers),
        query_contributions=(
            QueryContribution(
                layers - 1,
                700,
                "key",
                1.75,
                -0.25,
                (
                    QueryShare("emb", None, "embed", 1.0),
                    QueryShare("L0.H3", 0, "head", 0.5),
                    QueryShare("L0.H3.S5", 0, "source", 0.25),
                ),
                1e-7,
            ),
            QueryContribution(
                layers - 1, 701, "gate", -0.5, 0.125, (QueryShare("L0.N712", 0, "neuron", -0.625),), 2e-7
            ),
        ),
        linearity=LinearityCheck(
            layer=layers - 1,
            counts=tuple(range(1, 9)),
            cumulative=tuple(0.2 * n - 0.01 * n * n for n in range(1, 9)),
            summed=tuple(0.2 * n for n in range(1, 9)),
            correlation=0.987,
        ),
        check=CHECK,
        embed_dla=0.4,
        bias_dla=-0.05,
        foil_id=3648 if foil else None,
        foil=" London" if foil else None,
        logit_difference=3.5 if foil else None,
        notes=("a note about <post-norm> models",),
    )


def estimate(value: float, spread: float) -> Estimate:
    return Estimate(value, value - spread, value + spread)


def corpus(layers: int = 3, heads: int = 4, num_seqs: int = 16) -> CorpusAttribution:
    spread = (lambda v: Estimate(v, math.nan, math.nan)) if num_seqs < 2 else (lambda v: estimate(v, 0.1))
    return CorpusAttribution(
        model="toy-gpt",
        decoder="logit-lens",
        dataset="shakespeare",
        num_seqs=num_seqs,
        seq_len=128,
        positions=num_seqs * 127,
        layers=tuple(
            LayerSummary(layer, spread(0.2 * layer), spread(0.5 - 0.1 * layer), spread(-0.3), spread(layer))
            for layer in range(layers)
        ),
        heads=tuple(
            HeadSummary(layer, head, spread(0.01 * (head - layer)), spread(0.1 * head))
            for layer in range(layers)
            for head in range(heads)
        ),
        neurons=tuple(
            NeuronSummary(k % layers, 300 + k, spread(0.4 - 0.05 * k), spread(0.2), 1.5, (" the", " <b>"))
            for k in range(6)
        ),
        neuron_rule="every neuron of every layer, the 6 with the largest mean |C| kept",
        check=CHECK,
        notes=(),
    )


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def optional_int(text: str) -> int | None:
    return None if text == "" else int(text)


def promoted(row: dict[str, str]) -> tuple[str, ...]:
    """The promoted tokens of a neurons.csv row: a JSON list."""
    return tuple(json.loads(row["promoted"]))


def optional_float(text: str) -> float:
    """A CSV number; an empty cell (a missing value) reads as nan."""
    return math.nan if text == "" else float(text)


def read_estimates(rows: list[dict[str, str]], *place: str) -> dict[tuple, Estimate]:
    """(place values..., metric) → Estimate of the rows of a corpus CSV (one row per metric)."""
    return {
        (*(row[p] for p in place), row["metric"]): Estimate(
            float(row["value"]), optional_float(row["ci_low"]), optional_float(row["ci_high"])
        )
        for row in rows
    }


def same(a: Estimate, b: Estimate) -> bool:
    """Equal, nan bounds counting as equal."""
    return all(
        x == y or (math.isnan(x) and math.isnan(y))
        for x, y in zip(a.__dict__.values(), b.__dict__.values(), strict=True)
    )


# ------------------------------------------------------------------------------------ CSV
def test_single_text_csv_rows_equal_the_result_lists(tmp_path):
    result = single()
    paths = write_attribute_csvs(result, tmp_path)
    assert [p.name for p in paths] == [
        "layers.csv",
        "heads.csv",
        "sources.csv",
        "neurons.csv",
        "trajectory.csv",
        "query_contributions.csv",
        "linearity.csv",
    ]
    layers = read_csv(tmp_path / "layers.csv")
    assert list(layers[0]) == ["layer", "part", "C", "DLA", "bias_DLA"]
    assert [r["part"] for r in layers] == ["attn", "mlp"] * len(result.layers)  # two rows per block
    assert (
        tuple(
            LayerAttribution(
                int(attn["layer"]),
                float(attn["C"]),
                float(mlp["C"]),
                float(attn["DLA"]),
                float(mlp["DLA"]),
                float(attn["bias_DLA"]),
                float(mlp["bias_DLA"]),
            )
            for attn, mlp in zip(layers[::2], layers[1::2], strict=True)
        )
        == result.layers
    )
    heads = read_csv(tmp_path / "heads.csv")
    assert list(heads[0]) == ["layer", "head", "C", "DLA"]
    assert (
        tuple(HeadAttribution(int(r["layer"]), int(r["head"]), float(r["C"]), float(r["DLA"])) for r in heads)
        == result.heads
    )
    sources = read_csv(tmp_path / "sources.csv")
    assert (
        tuple(
            SourceAttribution(
                int(r["layer"]),
                int(r["head"]),
                int(r["source"]),
                r["source_token"],
                float(r["C"]),
                float(r["DLA"]),
            )
            for r in sources
        )
        == result.sources
    )
    assert sources[5]["source_token"] == "\n"  # raw token text in the CSV, not the shown form
    neurons = read_csv(tmp_path / "neurons.csv")
    assert (
        tuple(
            NeuronAttribution(
                int(r["layer"]),
                int(r["neuron"]),
                float(r["coefficient"]),
                float(r["C"]),
                float(r["DLA"]),
                promoted(r),
            )
            for r in neurons
        )
        == result.neurons
    )
    points = read_csv(tmp_path / "trajectory.csv")
    assert (
        tuple(
            TrajectoryPoint(
                r["point"],
                int(r["layer"]),
                r["stage"],
                float(r["probability"]),
                int(r["rank"]),
                float(r["logprob"]),
            )
            for r in points
        )
        == result.trajectory
    )


def test_query_contributions_csv_has_one_row_per_share(tmp_path):
    result = single()
    write_attribute_csvs(result, tmp_path)
    rows = read_csv(tmp_path / "query_contributions.csv")
    expected = [(q, s) for q in result.query_contributions for s in q.shares]
    assert len(rows) == len(expected) == 4
    for row, (query, share) in zip(rows, expected, strict=True):
        assert (int(row["layer"]), int(row["neuron"]), row["projection"]) == (
            query.layer,
            query.neuron,
            query.projection,
        )
        assert float(row["preactivation"]) == query.preactivation and float(row["constant"]) == query.constant
        assert float(row["residual"]) == query.residual
        assert (
            QueryShare(
                row["component"], optional_int(row["component_layer"]), row["kind"], float(row["share"])
            )
            == share
        )


def test_linearity_csv_and_floats_keep_full_precision(tmp_path):
    result = single()
    write_attribute_csvs(result, tmp_path)
    rows = read_csv(tmp_path / "linearity.csv")
    assert [int(r["count"]) for r in rows] == list(result.linearity.counts)
    assert tuple(float(r["cumulative"]) for r in rows) == result.linearity.cumulative
    assert tuple(float(r["summed"]) for r in rows) == result.linearity.summed
    assert any(len(r["cumulative"]) > 10 for r in rows)  # e.g. 0.36000000000000004, not rounded


def test_corpus_csv_rows_equal_the_result_lists_with_interval_columns(tmp_path):
    result = corpus()
    paths = write_attribute_csvs(result, tmp_path)
    assert [p.name for p in paths] == ["layers.csv", "heads.csv", "neurons.csv"]
    rows = read_csv(tmp_path / "layers.csv")
    assert list(rows[0]) == ["layer", "part", "metric", "value", "ci_low", "ci_high"]
    assert len(rows) == 4 * len(result.layers)  # attn and mlp, C and DLA
    layers = read_estimates(rows, "layer", "part")
    assert (
        tuple(
            LayerSummary(
                int(layer),
                layers[layer, "attn", "C"],
                layers[layer, "mlp", "C"],
                layers[layer, "attn", "DLA"],
                layers[layer, "mlp", "DLA"],
            )
            for layer in dict.fromkeys(r["layer"] for r in rows)
        )
        == result.layers
    )
    rows = read_csv(tmp_path / "heads.csv")
    assert list(rows[0]) == ["layer", "head", "metric", "value", "ci_low", "ci_high"]
    heads = read_estimates(rows, "layer", "head")
    assert (
        tuple(
            HeadSummary(int(layer), int(head), heads[layer, head, "C"], heads[layer, head, "DLA"])
            for layer, head in dict.fromkeys((r["layer"], r["head"]) for r in rows)
        )
        == result.heads
    )
    rows = read_csv(tmp_path / "neurons.csv")
    neurons = read_estimates(rows, "layer", "neuron")
    assert (
        tuple(
            NeuronSummary(
                int(r["layer"]),
                int(r["neuron"]),
                neurons[r["layer"], r["neuron"], "C"],
                neurons[r["layer"], r["neuron"], "DLA"],
                float(r["mean_coefficient"]),
                promoted(r),
            )
            for r in rows[::2]
        )
        == result.neurons
    )


def test_nan_intervals_are_written_empty_and_read_back(tmp_path):
    result = corpus(num_seqs=1)
    write_attribute_csvs(result, tmp_path)
    rows = read_csv(tmp_path / "layers.csv")
    assert same(read_estimates(rows, "layer", "part")["1", "mlp", "C"], result.layers[1].mlp_contribution)
    assert rows[6]["ci_low"] == rows[6]["ci_high"] == ""  # no interval with one sequence: missing


def test_tables_follow_the_result_types():
    tables = {t.name: t for t in attribute_tables(single())}
    assert tables["neurons"].columns == ("layer", "neuron", "coefficient", "C", "DLA", "promoted")
    assert tables["neurons"].rows[3][-1] == json.dumps([" Paris", " France", "$x$", "\n"])
    assert tables["query_contributions"].columns[-4:] == ("component", "component_layer", "kind", "share")
    assert "linearity" not in {t.name for t in attribute_tables(single_without_linearity())}


def single_without_linearity() -> AttributeResult:
    return replace(single(), linearity=None)


# ---------------------------------------------------------------------------------- files
#: The results whose written report the file and page tests read (each written once).
REPORTS = {
    "single": (single, SINGLE_FILES),
    "corpus": (corpus, CORPUS_FILES),
    "one-layer": (lambda: single(layers=1, heads=1), SINGLE_FILES),
    "one-sequence": (lambda: corpus(layers=1, num_seqs=1), CORPUS_FILES),
    "deep": (lambda: single(layers=32, heads=32), SINGLE_FILES),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Callable[[str], tuple[list[Path], Path]]:
    """The report of `REPORTS[name]` written into a folder of its own, once per module: the
    paths `write_attribute_report` returned and the folder."""
    done: dict[str, tuple[list[Path], Path]] = {}

    def report(name: str) -> tuple[list[Path], Path]:
        if name not in done:
            folder = tmp_path_factory.mktemp(name)
            done[name] = (write_attribute_report(REPORTS[name][0](), folder), folder)
        return done[name]

    return report


@pytest.mark.parametrize("name", list(REPORTS))
def test_every_file_is_written_and_not_empty(written, name):
    paths, folder = written(name)
    names = REPORTS[name][1]
    assert sorted(p.name for p in paths) == sorted(names)
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)  # nothing else, no temporaries
    for path in paths:
        assert path.stat().st_size > 0, path
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            height, width = imread(path).shape[:2]
            assert 200 < width < 3000 and 150 < height < 3000, (path.name, width, height)


def test_without_linearity_there_is_no_linearity_figure(tmp_path):
    names = {p.name for p in plot_attribute(single_without_linearity(), tmp_path)}
    assert names == {"layers.png", "heads.png", "trajectory.png", "neurons.png"}


def test_the_report_is_written_into_an_output_set(tmp_path):
    with output_set(tmp_path / "out", "attribute") as outputs:
        paths = write_attribute_report(single(), outputs)
        outputs.write_record({"command": "attribute"})
    assert {p.name for p in paths} == set(SINGLE_FILES)
    assert {p.name for p in (tmp_path / "out").iterdir()} >= set(SINGLE_FILES)


# -------------------------------------------------------------------------------- figures
def test_layers_figure_has_integer_layer_ticks_a_zero_line_and_names_the_target():
    fig = layers_figure(single(layers=3))
    fig.canvas.draw()
    top, bottom = fig.axes[:2]
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["0", "1", "2"]
    assert any(line.get_ydata()[0] == 0 for line in top.lines)  # the zero line
    title = fig.get_suptitle()
    assert "toy-gpt" in title and "␣Paris" in title and "position 4" in title and "␣London" in title
    assert "logit difference" in top.get_ylabel()  # DLA leads, on top
    assert "additive log-probability share" in bottom.get_ylabel()
    assert "logit difference" not in layers_figure(single(foil=False)).axes[0].get_ylabel()
    top, bottom = layers_figure(replace(single(), rank_by="c")).axes[:2]
    assert top.get_ylabel().startswith("C: additive") and "logit difference" in bottom.get_ylabel()
    heights = [bar.get_height() for bar in top.containers[1]]  # the MLP's bars of the top panel
    assert heights == pytest.approx([layer.mlp_contribution for layer in single().layers])


def test_heads_heatmap_is_centred_at_zero_with_symmetric_limits():
    result = single()
    fig = heads_figure(result)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2  # DLA (leading) and C side by side
    for image, values in zip(
        images, ([h.dla for h in result.heads], [h.contribution for h in result.heads]), strict=True
    ):
        low, high = image.get_clim()
        assert low == -high and high == pytest.approx(max(abs(v) for v in values))
        assert image.get_array().shape == (3, 4)
    assert images[0].get_array()[2, 3] == pytest.approx(result.heads[2 * 4 + 3].dla)
    assert [ax.get_title() for ax in fig.axes if ax.images] == ["DLA per head", "C per head"]
    by_c = heads_figure(replace(result, rank_by="c"))
    assert [ax.get_title() for ax in by_c.axes if ax.images] == ["C per head", "DLA per head"]
    first = next(ax for ax in by_c.axes if ax.images).images[0].get_array()
    assert first[2, 3] == pytest.approx(result.heads[2 * 4 + 3].contribution)


def test_trajectory_shows_probability_and_rank_on_a_log_axis_at_every_point():
    result = single()
    fig = trajectory_figure(result)
    fig.canvas.draw()
    probability, rank = fig.axes[:2]
    assert rank.get_yscale() == "log"
    labels = [t.get_text() for t in rank.get_xticklabels()]
    assert labels == [p.point for p in result.trajectory]
    assert list(probability.lines[0].get_ydata()) == [p.probability for p in result.trajectory]


def test_a_deep_model_names_every_few_blocks_on_the_trajectory_and_one_layer_gets_whole_ticks():
    fig = trajectory_figure(single(layers=32))
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[1].get_xticklabels()]
    assert len(labels) == 65 and [label for label in labels if label][:3] == ["L_in_0", "L_out_3", "L_out_7"]
    heads = heads_figure(corpus(layers=1, num_seqs=1)).axes[0]
    assert list(heads.get_yticks()) == [0] and list(heads.get_xticks()) == [0, 1, 2, 3]


def test_linearity_plots_both_series_against_n_on_twin_axes_labelled_in_their_colours():
    result = single()
    check = result.linearity
    fig = linearity_figure(result)
    left, right = fig.axes
    assert "r = 0.987" in fig.get_suptitle()
    (cumulative,) = left.lines
    (summed,) = right.lines
    assert list(cumulative.get_xdata()) == list(summed.get_xdata()) == list(check.counts)
    assert tuple(cumulative.get_ydata()) == check.cumulative and tuple(summed.get_ydata()) == check.summed
    for ax, line in ((left, cumulative), (right, summed)):
        assert ax.yaxis.label.get_color() == line.get_color()
    assert cumulative.get_color() != summed.get_color()
    assert left.get_xlabel().startswith("n")
    assert all(float(tick).is_integer() for tick in left.get_xticks())


def test_linearity_axes_share_one_scale_when_the_two_series_span_alike_and_not_otherwise():
    result = single()  # cumulative 0.19 … 0.96, summed 0.2 … 1.6: alike
    left, right = linearity_figure(result).axes
    assert left.get_ylim() == right.get_ylim()
    apart = replace(
        result.linearity,
        cumulative=(12.5, 13.9, 14.0, 14.1),
        summed=(12.5, 24.5, 35.6, 46.3),
        counts=(1, 2, 3, 4),
    )  # the reference model's layer 0: C of the sum saturates near 14
    left, right = linearity_figure(replace(result, linearity=apart)).axes
    low, high = left.get_ylim()
    assert low <= 12.5 and 14.1 <= high < 20
    assert right.get_ylim()[1] >= 46.3


def test_linearity_draws_the_ceiling_of_c_when_the_result_carries_it():
    result = single()
    apart = replace(
        result.linearity,
        cumulative=(12.5, 13.9, 14.0, 14.1),
        summed=(12.5, 24.5, 35.6, 46.3),
        counts=(1, 2, 3, 4),
        ceiling=14.5,
    )
    left, _ = linearity_figure(replace(result, linearity=apart)).axes
    flat = [line for line in left.lines if list(line.get_ydata()) == [14.5, 14.5]]
    assert len(flat) == 1 and left.get_ylim()[1] >= 14.5
    assert any("ceiling" in text.get_text() for text in left.texts)
    assert not [t for t in linearity_figure(result).axes[0].texts if "ceiling" in t.get_text()]


def test_neuron_bars_are_labelled_by_layer_and_neuron_with_promoted_tokens():
    result = single()
    fig = neurons_figure(result)
    fig.canvas.draw()
    lead, beside = fig.axes[:2]
    labels = [t.get_text() for t in lead.get_yticklabels()]
    assert labels[0].startswith("L0.N700") and labels[1].startswith("L1.N701")
    widths = [bar.get_width() for bar in lead.patches]
    assert widths == pytest.approx([n.dla for n in result.neurons])  # DLA leads, C beside it
    assert [bar.get_width() for bar in beside.patches] == pytest.approx(
        [n.contribution for n in result.neurons]
    )
    assert "additive log-probability share" in beside.get_xlabel() and lead.get_title() == "ranked by DLA"
    texts = [t.get_text() for t in beside.texts]
    assert any("‘␣Paris’ ‘␣France’" in t for t in texts)
    assert any(r"\$x\$" in t for t in texts)  # a "$" in a token is not read as mathtext


def test_corpus_layers_have_error_bars_and_nan_intervals_draw_none():
    fig = layers_figure(corpus())
    assert fig.axes[0].containers and "16 sequences" in fig.get_suptitle()
    fig = layers_figure(corpus(num_seqs=1))  # nan intervals: no error bar, no warning
    fig.canvas.draw()
    assert "no interval" in fig.get_suptitle()


# ----------------------------------------------------------------------------------- HTML
class Page(HTMLParser):
    """Every tag's attributes and the page's text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text = ""

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text += data


def parsed_page(folder: Path) -> tuple[str, Page]:
    """attribute.html of a written report, as text and parsed."""
    page = (folder / "attribute.html").read_text(encoding="utf-8")
    parsed = Page()
    parsed.feed(page)
    return page, parsed


def page_of(result, tmp_path) -> tuple[str, Page]:
    paths = write_attribute_report(result, tmp_path)
    assert tmp_path / "attribute.html" in paths
    return parsed_page(tmp_path)


@pytest.mark.parametrize("name", ["single", "corpus"])
def test_html_is_self_contained_and_embeds_every_image(written, name):
    _, folder = written(name)
    page, parsed = parsed_page(folder)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.IGNORECASE)
    assert "@import" not in page and "url(" not in page
    images = [attrs for tag, attrs in parsed.tags if tag == "img"]
    pngs = sorted(p.name for p in folder.glob("*.png"))
    assert sorted(a["alt"] for a in images) == pngs
    assert all(a["src"].startswith("data:image/png;base64,") for a in images)
    for name in pngs:  # the embedded bytes are the written file
        import base64

        src = next(a["src"] for a in images if a["alt"] == name)
        assert base64.b64decode(src.split(",", 1)[1]) == (folder / name).read_bytes()
    tables = [attrs for tag, attrs in parsed.tags if tag == "table"]
    assert len(tables) >= len(list(folder.glob("*.csv")))
    assert len([tag for tag, _ in parsed.tags if tag == "figcaption"]) == len(pngs)


def test_html_escapes_token_text_and_shows_the_prediction(tmp_path):
    page, parsed = page_of(single(target="<b>"), tmp_path)
    assert not any(tag == "b" for tag, _ in parsed.tags)  # "<b>" is text, never a tag
    assert "&lt;b&gt;" in page and "<b>" in parsed.text
    assert "&lt;post-norm&gt;" in page  # notes are escaped too
    text = parsed.text
    assert "␣capital" in text and "↵" in text  # spaces and newlines shown
    assert "0.620" in text and "␣London" in text and "3.5" in text  # probability, foil, logit difference
    assert "2.5e-06" in text and "3e-06" in text  # the check residuals


def test_html_marks_the_target_position(written):
    page, parsed = parsed_page(written("single")[1])
    marked = [attrs for tag, attrs in parsed.tags if attrs.get("class") == "position"]
    assert len(marked) == 1
    assert re.search(r'class="position"[^>]*>␣is<', page)


def test_corpus_html_names_the_dataset_and_sequences(written):
    _, parsed = parsed_page(written("corpus")[1])
    assert "shakespeare" in parsed.text and "16 sequences" in parsed.text


def test_html_can_be_written_from_figures_already_saved(tmp_path):
    result = single()
    images = plot_attribute(result, tmp_path)
    path = write_attribute_html(result, tmp_path, images)
    assert path == tmp_path / "attribute.html" and path.stat().st_size > sum(p.stat().st_size for p in images)


# ------------------------------------------------------------------------------- terminal
def test_terminal_summary_of_one_text():
    lines = terminal_summary(single())
    text = "\n".join(lines)
    assert lines[0].startswith("toy-gpt: target '␣Paris' (id 6342) after position 4 '␣is'")
    assert "p 0.620" in lines[0] and "rank 0" in lines[0]
    assert "foil '␣London'" in text and "logit difference 3.5" in text
    assert lines[2].startswith("ranked by DLA (direct logit attribution = minus the zero-ablation direct")
    assert "C (additive log-probability share" in lines[2] and "resstream ablate --faithfulness" in lines[2]
    top_layers = next(line for line in lines if line.startswith("top layers"))
    assert top_layers.startswith("top layers by |DLA|: L2.mlp +3 (C +1.41), L2.attn -1.7 (C +0.15)")
    assert top_layers.count("(C ") == 5
    top_heads = next(line for line in lines if line.startswith("top heads"))
    assert top_heads.startswith("top heads by |DLA|: L0.H3 -0.6 (C +0.075), ")
    first = lines.index("top neurons by |DLA| (→ promoted tokens):")
    assert lines[first + 1 : first + 3] == [
        "  L0.N700 +1.1 (C +0.9) → ␣Paris",
        "  L1.N701 +0.85 (C +0.7) → ␣Paris ␣France",
    ]
    assert (
        lines[first + 5].startswith("  L0.N706 -0.4 (C -0.3)")
        and lines[first + 6] == "note: a note about <post-norm> models"
    )
    assert lines[-1].startswith("check:") and "2.5e-06" in lines[-1] and "3e-06" in lines[-1]


def test_terminal_summary_ranked_by_c_is_the_seed_papers_order_with_dla_beside_it():
    lines = terminal_summary(replace(single(), rank_by="c"))
    assert lines[2].startswith("ranked by C (additive log-probability share")
    top_layers = next(line for line in lines if line.startswith("top layers"))
    assert top_layers.startswith("top layers by |C|: L2.mlp +1.41 (DLA +3), L1.mlp +0.71 (DLA +1.5)")
    top_heads = next(line for line in lines if line.startswith("top heads"))
    assert top_heads.startswith("top heads by |C|: L2.H0 -0.225 (DLA +0.4), L2.H3 +0.225 (DLA -0.2)")
    first = lines.index("top neurons by |C| (→ promoted tokens):")
    assert lines[first + 1] == "  L0.N700 +0.9 (DLA +1.1) → ␣Paris"


def test_terminal_summary_of_a_corpus():
    lines = terminal_summary(corpus())
    assert lines[0].startswith("toy-gpt on shakespeare: 16 sequences × 128 tokens")
    top_layers = next(line for line in lines if line.startswith("top layers"))
    assert top_layers.startswith("top layers by |DLA|: L2.mlp +2 [+1.9, +2.1] (C +0.3), ")
    assert "  L0.N300 +0.2 [+0.1, +0.3] (C +0.4) → ␣the ␣<b>" in lines
    assert lines[-1].startswith("check:")
    one = terminal_summary(corpus(num_seqs=1))
    assert (
        one[0] == "toy-gpt on shakespeare: 1 sequence × 128 tokens, 127 positions (no interval: 1 sequence)"
    )
    assert "L2.mlp +2 (C +0.3), L1.mlp +1 (C +0.4)" in one[2]  # no brackets for nan intervals
