"""Render `attribute`'s results: CSV tables, PNG figures, one self-contained HTML page and a
short terminal summary. Nothing here computes model outputs.

One text (`AttributeResult`): layers.csv, heads.csv, sources.csv, neurons.csv,
trajectory.csv, query_contributions.csv (one row per share), linearity.csv (with a
linearity check); layers.png (attention and MLP per block: C and DLA), heads.png (layer ×
head heatmaps of C and DLA), trajectory.png (the target's probability and rank at every
residual point), linearity.png, neurons.png (top neurons with their promoted tokens).
A corpus (`CorpusAttribution`): layers.csv, heads.csv, neurons.csv with value / low / high
columns for every 95% interval; layers.png with error bars, heads.png of the means,
neurons.png. Both get `attribute.html`, which embeds every figure (data: URIs) and every
table, so it opens without network access.

Every table comes from the result's own fields (`attribute_tables`), so the CSVs and the
HTML tables cannot drift apart from the result types. CSVs hold raw token text and floats at
full precision; figures and the page show tokens with visible whitespace (`show_token`).
"""

from __future__ import annotations

import html
import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from resstream.analysis.attribution.results import (
    AttributeResult,
    AttributionCheck,
    CorpusAttribution,
    HeadAttribution,
    HeadSummary,
    LayerAttribution,
    LayerSummary,
    NeuronAttribution,
    NeuronSummary,
    SourceAttribution,
    TrajectoryPoint,
)
from resstream.io import write_text
from resstream.reporting.csvs import csv_text
from resstream.reporting.figures import integer_ticks, new_figure, save_figure
from resstream.reporting.html import figure_html
from resstream.reporting.text import probability_text, show_token
from resstream.rundir import OutputSet
from resstream.simulation.intervals import Estimate

__all__ = [
    "CORPUS_FILES",
    "SINGLE_FILES",
    "TUNED_FILES",
    "Table",
    "attribute_tables",
    "heads_figure",
    "layers_figure",
    "linearity_figure",
    "neurons_figure",
    "plot_attribute",
    "terminal_summary",
    "trajectory_figure",
    "write_attribute_csvs",
    "write_attribute_html",
    "write_attribute_report",
]

Result = AttributeResult | CorpusAttribution
#: Where files go: a folder, or the `rundir.OutputSet` a command stages its outputs in.
Directory = str | os.PathLike[str] | OutputSet

HTML_FILE = "attribute.html"
#: Every file `write_attribute_report` writes for one text (linearity.* only with a check;
#: with a tuned lens also `TUNED_FILES`).
SINGLE_FILES = (
    "layers.csv",
    "heads.csv",
    "sources.csv",
    "neurons.csv",
    "trajectory.csv",
    "query_contributions.csv",
    "linearity.csv",
    "layers.png",
    "heads.png",
    "trajectory.png",
    "linearity.png",
    "neurons.png",
    HTML_FILE,
)
#: What a tuned lens (`attribute --decoder tuned:DIR`) adds to `SINGLE_FILES`.
TUNED_FILES = ("tuned_trajectory.csv",)
#: Every file `write_attribute_report` writes in corpus mode.
CORPUS_FILES = ("layers.csv", "heads.csv", "neurons.csv", "layers.png", "heads.png", "neurons.png", HTML_FILE)

NEURONS_SHOWN = 30  # bars in neurons.png (the CSV and the page's table have all)
PROMOTED_SHOWN = 5  # promoted tokens beside a neuron's bar
TOKEN_CHARACTERS = 14  # a token in a figure is cut to this many characters
ANNOTATED_CELLS = 256  # heads.png writes each cell's value when the grid has at most this many
INDEX_TICKS = 16  # heads.png labels every layer and head up to this many
LABELLED_POINTS = 41  # trajectory.png names every point up to this many (20 blocks), else every few
MAX_WIDTH = 14.0  # inches: a deep model's bars and points get narrower, not the figure wider
TOP = 5  # entries per line of the terminal summary

ATTN_COLOUR = "tab:blue"
MLP_COLOUR = "tab:orange"
POSITIVE_COLOUR = "#d6604d"  # the red end of RdBu_r: raises the target
NEGATIVE_COLOUR = "#4393c3"  # the blue end: lowers it
HEATMAP = "RdBu_r"
CUMULATIVE_COLOUR = "#762a83"  # linearity.png: C of the summed vectors (purple)
SUMMED_COLOUR = "#1b7837"  # the sum of single C (green)
SHARED_SCALE = 2.0  # linearity.png puts both series on one scale when they span alike (_one_scale)
C_LABEL = "C = Δ log p(target) (nats)"


# ---------------------------------------------------------------------------------- tables
@dataclass(frozen=True)
class Table:
    """One list of a result as rows: `name` is the file stem (layers → layers.csv)."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def _cells(item: Any, promoted_width: int) -> list[tuple[str, Any]]:
    """A result item's fields as (column, value): an Estimate becomes three columns (name,
    name_low, name_high), `promoted` becomes promoted_1..promoted_<width> (blank when
    shorter), None a blank."""
    cells: list[tuple[str, Any]] = []
    for f in fields(item):
        value = getattr(item, f.name)
        if isinstance(value, Estimate):
            cells += [(f.name, value.value), (f"{f.name}_low", value.low), (f"{f.name}_high", value.high)]
        elif f.name == "promoted":
            padded = list(value) + [""] * (promoted_width - len(value))
            cells += [(f"promoted_{i + 1}", token) for i, token in enumerate(padded)]
        else:
            cells.append((f.name, "" if value is None else value))
    return cells


def _table(name: str, items: Sequence[Any], columns: tuple[str, ...]) -> Table:
    """The table of `items` (dataclasses); `columns` names the header of an empty list."""
    width = max((len(getattr(item, "promoted", ())) for item in items), default=0)
    rows = [_cells(item, width) for item in items]
    header = tuple(column for column, _ in rows[0]) if rows else columns
    return Table(name, header, tuple(tuple(value for _, value in row) for row in rows))


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name != "promoted")


def _query_table(result: AttributeResult) -> Table:
    """query_contributions: one row per share, after its neuron's pre-activation and constant."""
    columns = ("layer", "neuron", "projection", "preactivation", "constant", "residual")
    columns += ("component", "component_layer", "kind", "share")
    rows = []
    for query in result.query_contributions:
        head = (
            query.layer,
            query.neuron,
            query.projection,
            query.preactivation,
            query.constant,
            query.residual,
        )
        for share in query.shares:
            layer = "" if share.layer is None else share.layer
            rows.append((*head, share.component, layer, share.kind, share.share))
    return Table("query_contributions", columns, tuple(rows))


def _linearity_table(result: AttributeResult) -> list[Table]:
    check = result.linearity
    if check is None:
        return []
    rows = tuple(zip(check.counts, check.cumulative, check.summed, strict=True))
    return [Table("linearity", ("count", "cumulative", "summed"), rows)]


def attribute_tables(result: Result) -> list[Table]:
    """Every list of `result` as a table, in the order of its files: for one text layers,
    heads, sources, neurons, trajectory, query_contributions (and linearity with a check);
    for a corpus layers, heads, neurons."""
    if isinstance(result, CorpusAttribution):
        return [
            _table("layers", result.layers, _field_names(LayerSummary)),
            _table("heads", result.heads, _field_names(HeadSummary)),
            _table("neurons", result.neurons, _field_names(NeuronSummary)),
        ]
    return [
        _table("layers", result.layers, _field_names(LayerAttribution)),
        _table("heads", result.heads, _field_names(HeadAttribution)),
        _table("sources", result.sources, _field_names(SourceAttribution)),
        _table("neurons", result.neurons, _field_names(NeuronAttribution)),
        _table("trajectory", result.trajectory, _field_names(TrajectoryPoint)),
        _query_table(result),
        *_linearity_table(result),
        *_tuned_table(result),
    ]


def _tuned_table(result: AttributeResult) -> list[Table]:
    """The target through a tuned lens at each block boundary, when one was given."""
    if not result.tuned_trajectory:
        return []
    return [_table("tuned_trajectory", result.tuned_trajectory, _field_names(TrajectoryPoint))]


def _path(directory: Directory, name: str) -> Path:
    """Where file `name` goes: in the folder, or staged in the output set."""
    return directory / name if isinstance(directory, OutputSet) else Path(directory) / name


def _csv_text(table: Table) -> str:
    """Header, then one row per item; floats as Python writes them (shortest exact form)."""
    return csv_text(table.columns, table.rows)


def write_attribute_csvs(result: Result, directory: Directory) -> list[Path]:
    """One CSV per list of `result` (see `attribute_tables`); returns the paths written."""
    paths = []
    for table in attribute_tables(result):
        path = _path(directory, f"{table.name}.csv")
        write_text(path, _csv_text(table))
        paths.append(path)
    return paths


# ------------------------------------------------------------------------- figure helpers
def _literal(text: str) -> str:
    """Text for a figure with every "$" literal (matplotlib reads $...$ as mathtext)."""
    return text.replace("$", r"\$")


def _token(text: str) -> str:
    """A token for a figure, quoted and cut to TOKEN_CHARACTERS."""
    shown = show_token(text)
    if len(shown) > TOKEN_CHARACTERS:
        shown = shown[: TOKEN_CHARACTERS - 1] + "…"
    return "‘" + _literal(shown) + "’"


def _value(score: float | Estimate) -> float:
    return score.value if isinstance(score, Estimate) else score


def _error(score: float | Estimate) -> tuple[float, float]:
    """The distances from a mean down to its interval's low end and up to its high end (nan
    when there is no interval); 0 for a plain number."""
    if not isinstance(score, Estimate):
        return (0.0, 0.0)
    return (score.value - score.low, score.high - score.value)


def _has_intervals(result: Result) -> bool:
    return isinstance(result, CorpusAttribution) and result.num_seqs >= 2


def _title(result: Result) -> str:
    """The figures' title: model and target token and position, or dataset and sequences."""
    if isinstance(result, CorpusAttribution):
        sequences = f"{result.num_seqs} sequence{'s' if result.num_seqs != 1 else ''}"
        title = (
            f"{result.model} on {result.dataset}: {sequences} × {result.seq_len} tokens "
            f"({result.positions:,} positions, each one's next token the target)"
        )
        if result.num_seqs < 2:
            title += "\nno interval: 1 sequence"
        else:
            title += "\nmeans over sequences with 95% intervals"
        return _literal(title)
    after = _token(result.tokens[result.position]) if 0 <= result.position < len(result.tokens) else ""
    title = (
        f"{_literal(result.model)}: target {_token(result.target)} after position {result.position} {after}"
        f" (p {probability_text(result.probability)}, rank {result.rank})"
    )
    if result.foil is not None:
        title += f", foil {_token(result.foil)}"
    return title


def _dla_label(result: Result) -> str:
    if isinstance(result, AttributeResult) and result.foil is not None:
        return "DLA (logit difference target − foil)"
    return "DLA (logit of the target)"


def _zero_line(ax: Axes, *, vertical: bool = False) -> None:
    if vertical:
        ax.axvline(0, color="black", linewidth=0.8)
    else:
        ax.axhline(0, color="black", linewidth=0.8)


def _grouped_bars(ax: Axes, layers: Sequence[int], series: Sequence[tuple[str, str, Sequence[Any]]]) -> None:
    """Bars side by side per layer: series = (label, colour, scores); an Estimate score gets an
    error bar from its interval (none where the interval is nan)."""
    width = 0.8 / len(series)
    x = np.arange(len(layers), dtype=float)
    for index, (label, colour, scores) in enumerate(series):
        offset = (index - (len(series) - 1) / 2) * width
        values = [_value(s) for s in scores]
        errors = np.array([_error(s) for s in scores], dtype=float).T
        drawn = errors if np.isfinite(errors).any() and np.any(errors) else None
        ax.bar(
            x + offset,
            values,
            width,
            label=label,
            color=colour,
            yerr=drawn,
            capsize=3 if drawn is not None else 0,
            error_kw={"elinewidth": 1},
        )
    _zero_line(ax)
    ax.set_xticks(x, [str(layer) for layer in layers])
    ax.grid(axis="y", alpha=0.3)


# -------------------------------------------------------------------------------- figures
def layers_figure(result: Result) -> Figure:
    """Per block: the attention's and the MLP's C (top panel) and DLA (bottom panel) as
    grouped bars, with a zero line; corpus means get their 95% intervals as error bars."""
    layers = [entry.layer for entry in result.layers]
    fig = new_figure(min(MAX_WIDTH, max(6.4, 2.0 + 0.55 * len(layers))), 6.2)
    fig.set_layout_engine("constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    attn_c = [entry.attn_contribution for entry in result.layers]
    mlp_c = [entry.mlp_contribution for entry in result.layers]
    _grouped_bars(top, layers, [("attention", ATTN_COLOUR, attn_c), ("MLP", MLP_COLOUR, mlp_c)])
    top.set_ylabel(("mean " if isinstance(result, CorpusAttribution) else "") + C_LABEL)
    top.legend(fontsize=8)
    attn_d = [entry.attn_dla for entry in result.layers]
    mlp_d = [entry.mlp_dla for entry in result.layers]
    _grouped_bars(bottom, layers, [("attention", ATTN_COLOUR, attn_d), ("MLP", MLP_COLOUR, mlp_d)])
    bottom.set_ylabel(("mean " if isinstance(result, CorpusAttribution) else "") + _dla_label(result))
    label = "layer (block)"
    if isinstance(result, AttributeResult):
        label += f"; not drawn: embedding DLA {result.embed_dla:+.3g}, bias term {result.bias_dla:+.3g}"
    bottom.set_xlabel(label)
    fig.suptitle(_title(result), fontsize=9)
    return fig


def _head_matrix(heads: Sequence[HeadAttribution | HeadSummary], rows: int, name: str) -> np.ndarray:
    """Layers × heads of one score (`name`: contribution or dla); nan where no head is listed."""
    columns = max((head.head for head in heads), default=-1) + 1
    rows = max(rows, max((head.layer for head in heads), default=-1) + 1)
    matrix = np.full((rows, columns), np.nan)
    for head in heads:
        matrix[head.layer, head.head] = _value(getattr(head, name))
    return matrix


def _symmetric_limit(matrix: np.ndarray) -> float:
    """The largest |value| (the colour scale runs from −it to +it); 1 when there is none."""
    finite = np.abs(matrix[np.isfinite(matrix)])
    largest = float(finite.max()) if finite.size else 0.0
    return largest if largest > 0 else 1.0


def _annotate_cells(ax: Axes, matrix: np.ndarray, limit: float) -> None:
    if matrix.size > ANNOTATED_CELLS:
        return
    size = 7 if matrix.shape[1] <= 12 else 5.5
    for (row, column), value in np.ndenumerate(matrix):
        if np.isfinite(value):
            colour = "white" if abs(value) > 0.6 * limit else "black"
            ax.text(column, row, f"{value:.2g}", ha="center", va="center", fontsize=size, color=colour)


def _index_ticks(axis: Axis, count: int) -> None:
    """Every index 0..count−1 when there are few, else whole numbers chosen by matplotlib (a
    locator alone puts fractional ticks on an axis that holds one row)."""
    if count <= INDEX_TICKS:
        axis.set_ticks(range(count))
    else:
        integer_ticks(axis)


def _diverging_heatmap(fig: Figure, ax: Axes, matrix: np.ndarray, title: str, label: str) -> None:
    """A layer × head heatmap centred at 0 with symmetric limits, its colour bar and cell
    values; grey where no head is listed."""
    import matplotlib

    limit = _symmetric_limit(matrix)
    cmap = matplotlib.colormaps[HEATMAP].with_extremes(bad="#dddddd")
    image = ax.imshow(matrix, cmap=cmap, vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
    _annotate_cells(ax, matrix, limit)
    _index_ticks(ax.xaxis, matrix.shape[1])
    _index_ticks(ax.yaxis, matrix.shape[0])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label=label)


def heads_figure(result: Result) -> Figure:
    """Two layer × head heatmaps side by side: C (left) and DLA (right), each with its own
    symmetric colour scale centred at 0 (red raises the target, blue lowers it)."""
    rows = len(result.layers)
    contribution = _head_matrix(result.heads, rows, "contribution")
    dla = _head_matrix(result.heads, rows, "dla")
    layers, heads = contribution.shape
    per_head = 0.5 if layers * heads <= ANNOTATED_CELLS else 0.2  # room for the values written in cells
    fig = new_figure(2 * min(8.0, max(4.0, 2.2 + per_head * heads)), min(9.0, max(3.4, 1.8 + 0.35 * layers)))
    fig.set_layout_engine("constrained", w_pad=0.15)  # colour bars and titles never overlap
    left, right = fig.subplots(1, 2)
    mean = "mean " if isinstance(result, CorpusAttribution) else ""
    _diverging_heatmap(fig, left, contribution, f"{mean}C per head", mean + C_LABEL)
    _diverging_heatmap(fig, right, dla, f"{mean}DLA per head", mean + _dla_label(result))
    fig.suptitle(_title(result), fontsize=9)
    return fig


def _point_labels(points: Sequence[Any]) -> list[str]:
    """Every point's name up to LABELLED_POINTS points; beyond, L_in_0 and the L_out of every
    few blocks (about ten labels), the other ticks left blank."""
    if len(points) <= LABELLED_POINTS:
        return [p.point for p in points]
    step = math.ceil((len(points) // 2) / 10)
    return [
        p.point if p.stage == "in" or (p.stage == "out" and (p.layer + 1) % step == 0) else "" for p in points
    ]


def _shade_blocks(ax: Axes, points: Sequence[Any]) -> None:
    """Grey behind every other block (from its L_in to its L_out) so the eye groups by layer."""
    starts = [index for index, p in enumerate(points) if p.stage in ("in", "out")]
    for number, (start, stop) in enumerate(itertools.pairwise(starts)):
        if number % 2 == 1:
            ax.axvspan(start, stop, color="#000000", alpha=0.05, linewidth=0)


def trajectory_figure(result: AttributeResult) -> Figure:
    """The target's probability (top) and rank + 1 on a log axis, 1 at the top (bottom) at
    every residual point L_in_0, L_res_0, L_out_0, L_res_1, ...: a rank that climbs while the
    probability stays near 0 is the silent phase, the probability's jump the loud one."""
    points = result.trajectory
    x = np.arange(len(points))
    fig = new_figure(min(MAX_WIDTH, max(6.4, 2.0 + 0.28 * len(points))), 5.6)
    fig.set_layout_engine("constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(x, [p.probability for p in points], "o-", color="tab:green", markersize=4, label="logit lens")
    top.set_ylim(-0.03, 1.03)
    top.set_ylabel("probability of the target")
    ranks = [p.rank + 1 for p in points]
    bottom.plot(x, ranks, "o-", color="tab:purple", markersize=4, label="logit lens")
    tuned = result.tuned_trajectory
    if tuned:
        at = [index for index, p in enumerate(points) if p.stage != "res"]  # the block boundaries
        top.plot(
            at, [p.probability for p in tuned], "s--", color="tab:blue", markersize=4, label="tuned lens"
        )
        bottom.plot(
            at, [p.rank + 1 for p in tuned], "s--", color="tab:blue", markersize=4, label="tuned lens"
        )
        ranks += [p.rank + 1 for p in tuned]
        top.legend(fontsize=8, loc="best")
    bottom.set_yscale("log")
    bottom.set_ylim(max(10.0, 2.0 * max(ranks)), 0.7)  # inverted: climbing towards top-1 goes up
    bottom.axhline(1, color="grey", linestyle=":", linewidth=1)
    bottom.set_ylabel("rank + 1 (log; 1 = top-1)")
    for ax in (top, bottom):
        _shade_blocks(ax, points)
        ax.grid(alpha=0.3)
    first = next((index for index, p in enumerate(points) if p.rank == 0), None)
    if first is not None:
        for ax in (top, bottom):
            ax.axvline(first, color="tab:red", linestyle="--", linewidth=1)
        top.text(first, 0.9, f"top-1 from {points[first].point} ", color="tab:red", fontsize=8, ha="right")
    bottom.set_xticks(x, _point_labels(points), rotation=90, fontsize=7)
    bottom.set_xlabel("residual point (L_in = block input, L_res = after attention, L_out = after MLP)")
    fig.suptitle(_title(result), fontsize=9)
    return fig


def _one_scale(first: Sequence[float], second: Sequence[float]) -> bool:
    """Whether two series span alike (their joint range at most SHARED_SCALE times the
    narrower one's), so that one y scale shows both without flattening either."""
    spans = [max(values) - min(values) for values in (first, second)]
    joint = max(*first, *second) - min(*first, *second)
    return joint <= SHARED_SCALE * min(spans)


def linearity_figure(result: AttributeResult) -> Figure:
    """Against n (the layer's top n neurons by C): C of their summed value vectors (left
    axis) and the sum of their single C (right axis), each axis in its own series' colour.
    The two can differ by orders of magnitude (C of a sum is capped by −log p of the target
    before it, a sum of C is not), so each gets its own scale, unless they span alike: then
    both axes share one, and equal heights are equal values. The cap is drawn on the left
    axis (dotted) when the result carries it."""
    check = result.linearity
    if check is None:
        raise ValueError("the result has no linearity check")
    fig = new_figure(6.4, 4.6)
    fig.set_layout_engine("constrained")
    left = fig.add_subplot()
    right = left.twinx()
    series = (
        (left, check.cumulative, CUMULATIVE_COLOUR, "o-", "C(v_1 + … + v_n): C of the summed vectors"),
        (right, check.summed, SUMMED_COLOUR, "s--", "Σ C(v_i): the sum of the single neurons' C"),
    )
    for ax, values, colour, style, label in series:
        ax.plot(check.counts, values, style, color=colour, markersize=3.5, mfc="none", label=label)
        ax.set_ylabel(label, color=colour)
        ax.tick_params(axis="y", colors=colour)
    if check.ceiling is not None and not _one_scale(check.cumulative, check.summed):
        left.axhline(check.ceiling, color=CUMULATIVE_COLOUR, linestyle=":", linewidth=1)
        left.annotate(
            f"ceiling −log p(target | L_res) = {check.ceiling:.3g}",
            (0.01, check.ceiling),
            xycoords=("axes fraction", "data"),
            va="bottom",
            fontsize=7,
            color=CUMULATIVE_COLOUR,
        )
    shared = _one_scale(check.cumulative, check.summed)
    if shared:
        low, high = zip(left.get_ylim(), right.get_ylim(), strict=True)
        for ax in (left, right):
            ax.set_ylim(min(low), max(high))
    integer_ticks(left.xaxis)
    left.set_xlabel(f"n: the top n neurons of layer {check.layer} by C")
    left.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    scale = "one scale on both axes" if shared else "each axis its own scale"
    fig.suptitle(
        f"{_title(result)}\nlayer {check.layer}: the top n neurons together vs. one by one "
        f"(r = {check.correlation:.3f}; {scale})",
        fontsize=8,
    )
    return fig


def _neuron_label(neuron: NeuronAttribution | NeuronSummary) -> str:
    if isinstance(neuron, NeuronSummary):
        return f"L{neuron.layer}.N{neuron.neuron} (mean m {neuron.mean_coefficient:.2g})"
    return f"L{neuron.layer}.N{neuron.neuron} (m {neuron.coefficient:.2g})"


def neurons_figure(result: Result) -> Figure:
    """The top neurons (at most NEURONS_SHOWN, the largest |C| at the top) as horizontal bars
    of C, red raising the target and blue lowering it, labelled L<layer>.N<neuron> with the
    coefficient m; the tokens each one's value vector promotes most are written beside it."""
    neurons = result.neurons[:NEURONS_SHOWN]
    fig = new_figure(8.4, max(2.6, 1.4 + 0.32 * len(neurons)))
    fig.set_layout_engine("constrained")
    ax = fig.add_subplot()
    values = [_value(n.contribution) for n in neurons]
    errors = np.array([_error(n.contribution) for n in neurons], dtype=float).reshape(-1, 2).T
    drawn = errors if _has_intervals(result) and np.isfinite(errors).any() else None
    colours = [POSITIVE_COLOUR if v >= 0 else NEGATIVE_COLOUR for v in values]
    y = np.arange(len(neurons))
    ax.barh(y, values, color=colours, xerr=drawn, capsize=2 if drawn is not None else 0)
    ax.set_yticks(y, [_neuron_label(n) for n in neurons], fontsize=8, family="monospace")
    ax.set_ylim(len(neurons) - 0.5, -0.5)
    _zero_line(ax, vertical=True)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel(("mean " if isinstance(result, CorpusAttribution) else "") + C_LABEL)
    beside = blended_transform_factory(ax.transAxes, ax.transData)
    ax.text(1.02, -0.9, "promoted tokens", transform=beside, fontsize=8, weight="bold", va="bottom")
    for row, neuron in enumerate(neurons):
        tokens = " ".join(_token(t) for t in neuron.promoted[:PROMOTED_SHOWN])
        ax.text(1.02, row, tokens, transform=beside, fontsize=7.5, va="center", family="monospace")
    if not neurons:
        ax.text(0.5, 0.5, "no neurons", transform=ax.transAxes, ha="center")
    shown = f"top {len(neurons)} of {len(result.neurons)} neurons by |C|"
    fig.suptitle(f"{_title(result)}\n{shown}", fontsize=9)
    return fig


def _single_figures(result: AttributeResult) -> list[tuple[str, Callable[[], Figure]]]:
    figures = [
        ("layers.png", lambda: layers_figure(result)),
        ("heads.png", lambda: heads_figure(result)),
        ("trajectory.png", lambda: trajectory_figure(result)),
    ]
    if result.linearity is not None:
        figures.append(("linearity.png", lambda: linearity_figure(result)))
    if result.neurons:
        figures.append(("neurons.png", lambda: neurons_figure(result)))
    return figures


def plot_attribute(result: Result, directory: Directory) -> list[Path]:
    """Every figure of `result` as a PNG in `directory`; returns the paths written. One text:
    layers, heads, trajectory, linearity (with a check) and neurons; a corpus: layers, heads,
    neurons."""
    if isinstance(result, CorpusAttribution):
        figures = [
            ("layers.png", lambda: layers_figure(result)),
            ("heads.png", lambda: heads_figure(result)),
            ("neurons.png", lambda: neurons_figure(result)),
        ]
    else:
        figures = _single_figures(result)
    return [save_figure(draw(), _path(directory, name)) for name, draw in figures]


# ----------------------------------------------------------------------------------- HTML
#: How to read each figure and table: the page's one-line captions.
CAPTIONS = {
    "layers.png": "Each block's attention (blue) and MLP (orange): top, C = how much adding its output "
    "raised (above 0) or lowered log p(target); bottom, its direct logit attribution (DLA) through the "
    "final norm frozen at the actual final state. Direct effects only.",
    "heads.png": "Every attention head: C (left) and DLA (right); red raises the target, blue lowers it, "
    "white is no effect; each panel has its own symmetric scale.",
    "trajectory.png": "The target's probability (top) and rank (bottom, log axis, top-1 at the top) at every "
    "residual point: the rank can climb while the probability stays near 0 (silent) before the "
    "probability jumps (loud); the dashed line marks where it first becomes top-1. With a tuned lens, its "
    "reading at each block boundary is drawn dashed in blue.",
    "linearity.png": "Is C additive? Against n, the number of the layer's top neurons by C taken together: "
    "C of their summed value vectors (purple, left axis) and the sum of their single C (green, right "
    "axis); the two coincide only if C is additive. The axes have their own scales unless the two "
    "series span alike (the title says which).",
    "neurons.png": "The neurons with the largest |C| (value vector m·W_out[:, k] added after attention), "
    "labelled L<layer>.N<neuron> with their coefficient m, and the tokens each one's value vector promotes "
    "most.",
    "layers": "One row per block: C and DLA of its attention and of its MLP.",
    "heads": "One row per head: C (v = the head's output, x = the block's input) and DLA.",
    "sources": "The attention sources with the largest |C|: what one head moved from one source position.",
    "neurons": "The neurons with the largest |C|: coefficient m, C, DLA and the tokens their value vector "
    "promotes most.",
    "trajectory": "The target at every residual point: probability, rank (0 = top-1) and log-probability.",
    "tuned_trajectory": "The target at every block boundary through the tuned lens (each layer's affine "
    "translator, then the logit lens): probability, rank and log-probability.",
    "query_contributions": "Which lower vectors switch an upper neuron on: its pre-activation = Σ shares + "
    "constant (MLP input norm frozen at the actual stream); the largest shares, residual = the check.",
    "linearity": "The linearity check's numbers: n, C of the sum of the top n neurons, sum of their C.",
}
CORPUS_CAPTIONS = {
    "layers.png": "Each block's attention (blue) and MLP (orange), mean over sequences with 95% intervals: "
    "top, C (the change of log p of each position's next token); bottom, DLA to its logit.",
    "heads.png": "Every attention head's mean C (left) and mean DLA (right); red raises the next token, "
    "blue lowers it; each panel has its own symmetric scale.",
    "neurons.png": "The neurons with the largest mean |C| (95% intervals), with their mean coefficient m "
    "and the tokens their value vector promotes most.",
    "layers": "One row per block: mean C and DLA of attention and MLP; _low and _high bound the 95% "
    "interval over sequences (nan with one sequence).",
    "heads": "One row per head: mean C and DLA with their 95% intervals.",
    "neurons": "The neurons with the largest mean |C|: mean C and DLA (95% intervals), mean coefficient, "
    "promoted tokens.",
}

PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:1150px;margin:1em auto;padding:0 1em;color:#222}"
    "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}"
    ".text{font-family:monospace;line-height:2;word-break:break-all}"
    ".text span{border:1px solid #ddd;padding:1px 2px;margin:0 1px;border-radius:3px}"
    ".text .after{color:#aaa}.text .position{background:#ffe08a;border-color:#c90;font-weight:bold}"
    ".text .target{background:#a1d99b;border-color:#4a4}"
    "table{border-collapse:separate;border-spacing:0;font-size:85%}"
    "td,th{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:pre}"
    "th{background:#f4f4f4;position:sticky;top:0}th.key{text-align:left;position:static}td.text-cell{text-align:left;font-family:monospace}"
    ".scroll{max-height:360px;overflow:auto;display:inline-block;max-width:100%}"
    "figure{margin:1.2em 0}figure img{max-width:100%;border:1px solid #eee}"
    "figcaption,.caption{color:#555;font-size:90%;margin:.3em 0}"
)


def _number(value: float) -> str:
    return f"{value:.4g}"


def _html_cell(value: Any) -> str:
    if isinstance(value, float):
        return f"<td>{_number(value)}</td>"
    if isinstance(value, str):
        return f"<td class='text-cell'>{html.escape(show_token(value))}</td>"
    return f"<td>{html.escape(str(value))}</td>"


def _html_table(table: Table, caption: str) -> str:
    header = "".join(f"<th>{html.escape(column)}</th>" for column in table.columns)
    body = "".join("<tr>" + "".join(_html_cell(v) for v in row) + "</tr>" for row in table.rows)
    return (
        f"<h3>{table.name}.csv</h3><p class='caption'>{html.escape(caption)} ({len(table.rows)} rows)</p>"
        f"<div class='scroll'><table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def _html_figure(path: Path, caption: str) -> str:
    text = f"<strong>{html.escape(path.name)}</strong>: {html.escape(caption)}"
    return figure_html(path.read_bytes(), path.name, text)


def _html_text(result: AttributeResult) -> str:
    """The text as tokens, the scored position marked, later tokens (unseen by the prediction)
    greyed, and the target after it."""
    spans = []
    for index, token in enumerate(result.tokens):
        kind = "position" if index == result.position else "after" if index > result.position else "before"
        spans.append(f'<span class="{kind}">{html.escape(show_token(token))}</span>')
        if index == result.position:
            spans.append(f'→ <span class="target">{html.escape(show_token(result.target))}</span>')
    return f"<p class='text'>{''.join(spans)}</p>"


def _key_values(pairs: Sequence[tuple[str, str]]) -> str:
    rows = "".join(
        f"<tr><th class='key'>{html.escape(k)}</th><td class='text-cell'>{html.escape(v)}</td></tr>"
        for k, v in pairs
    )
    return f"<table>{rows}</table>"


def _prediction(result: AttributeResult) -> str:
    pairs = [
        ("target", f"{show_token(result.target)} (id {result.target_id})"),
        ("probability", probability_text(result.probability)),
        ("log-probability", _number(result.logprob)),
        ("logit (before soft-capping)", _number(result.logit)),
        ("rank (0 = top-1)", str(result.rank)),
    ]
    if result.foil is not None:
        pairs.append(("foil", f"{show_token(result.foil)} (id {result.foil_id})"))
    if result.logit_difference is not None:
        pairs.append(("logit difference target − foil", _number(result.logit_difference)))
    pairs += [
        ("embedding DLA", _number(result.embed_dla)),
        ("bias term of the DLA", _number(result.bias_dla)),
    ]
    return _key_values(pairs)


def _residual(value: float) -> str:
    return f"{value:.2g}"


def _check(check: AttributionCheck) -> str:
    return _key_values(
        [
            ("decomposition: max |Σ components − state|", _residual(check.decomposition_max_abs)),
            ("decomposition: the same / ‖state‖", _residual(check.decomposition_relative)),
            ("DLA: |Σ DLA + bias term − actual logit (difference)|", _residual(check.dla_residual)),
        ]
    )


def _notes(notes: Sequence[str]) -> str:
    if not notes:
        return ""
    return "<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(note)}</li>" for note in notes) + "</ul>"


def _html_head(result: Result) -> str:
    """The page's heading and the part above the figures."""
    if isinstance(result, CorpusAttribution):
        model, dataset, decoder = (
            html.escape(text) for text in (result.model, result.dataset, result.decoder)
        )
        return (
            f"<h1>Who writes the next token: {model} on {dataset}</h1>"
            f"<p>{result.num_seqs} sequences × {result.seq_len} tokens, {result.positions:,} positions "
            f"scored (each position's next token is its target); decoder {decoder}. Means over "
            f"sequences with 95% intervals. Neurons: {html.escape(result.neuron_rule)}.</p>"
            f"<h2>Check</h2>{_check(result.check)}"
        )
    return (
        f"<h1>Who wrote ‘{html.escape(show_token(result.target))}’ after position {result.position}: "
        f"{html.escape(result.model)}</h1>"
        f"<p>decoder {html.escape(result.decoder)}; the marked token is the scored position, the green one "
        "the target predicted after it, grey tokens come later (the prediction does not see them).</p>"
        f"<h2>Text</h2>{_html_text(result)}<h2>Prediction</h2>{_prediction(result)}"
        f"<h2>Check</h2>{_check(result.check)}"
    )


def write_attribute_html(result: Result, directory: Directory, images: Sequence[Path]) -> Path:
    """`attribute.html` in `directory`: the text with the scored position and the prediction
    (one text) or the dataset (corpus), the check residuals, every figure in `images`
    embedded as a data: URI and every table, each with a caption on how to read it. The page
    loads nothing from anywhere; returns its path."""
    captions = CORPUS_CAPTIONS if isinstance(result, CorpusAttribution) else CAPTIONS
    figures = "".join(_html_figure(Path(image), captions.get(Path(image).name, "")) for image in images)
    tables = "".join(_html_table(t, captions.get(t.name, "")) for t in attribute_tables(result))
    page = (
        f"<!doctype html><html lang='en'><meta charset='utf-8'>"
        f"<title>resstream attribute: {html.escape(result.model)}</title><style>{PAGE_STYLE}</style>"
        f"{_html_head(result)}{_notes(result.notes)}<h2>Figures</h2>{figures}"
        f"<h2>Tables</h2><p class='caption'>The same numbers as the CSV files beside this page "
        f"(which keep full precision).</p>{tables}</html>"
    )
    path = _path(directory, HTML_FILE)
    write_text(path, page)
    return path


def write_attribute_report(result: Result, directory: Directory) -> list[Path]:
    """Every file of `result` in `directory`: the CSVs, the PNGs and attribute.html (which
    embeds the PNGs just written); returns the paths written."""
    tables = write_attribute_csvs(result, directory)
    images = plot_attribute(result, directory)
    return [*tables, *images, write_attribute_html(result, directory, images)]


# ------------------------------------------------------------------------------- terminal
def _signed(score: float | Estimate) -> str:
    """+0.123, or for an Estimate +0.123 [+0.1, +0.15] (no brackets for a nan interval)."""
    text = f"{_value(score):+.3g}"
    if isinstance(score, Estimate) and not (math.isnan(score.low) or math.isnan(score.high)):
        text += f" [{score.low:+.3g}, {score.high:+.3g}]"
    return text


def _largest(entries: Sequence[tuple[str, float | Estimate]]) -> str:
    """The TOP entries with the largest |score|, as "name +0.12, ..." (ties in list order)."""
    ranked = sorted(entries, key=lambda entry: -abs(_value(entry[1])))[:TOP]
    return ", ".join(f"{name} {_signed(score)}" for name, score in ranked) or "none"


def _sub_layers(result: Result) -> list[tuple[str, float | Estimate]]:
    entries: list[tuple[str, float | Estimate]] = []
    for entry in result.layers:
        entries += [
            (f"L{entry.layer} attn", entry.attn_contribution),
            (f"L{entry.layer} MLP", entry.mlp_contribution),
        ]
    return entries


def _neuron_entries(result: Result) -> list[tuple[str, float | Estimate, str]]:
    """The TOP neurons by |C|: name, C and their first three promoted tokens."""
    entries = []
    for n in result.neurons:
        promoted = " ".join(show_token(t) for t in n.promoted[:3])
        entries.append((f"L{n.layer}.N{n.neuron}", n.contribution, promoted))
    return sorted(entries, key=lambda entry: -abs(_value(entry[1])))[:TOP]


def _check_line(check: AttributionCheck) -> str:
    return (
        f"check: decomposition max |Σ − h| {_residual(check.decomposition_max_abs)} "
        f"(relative {_residual(check.decomposition_relative)}), DLA residual {_residual(check.dla_residual)}"
    )


def _head_line(result: AttributeResult) -> str:
    after = show_token(result.tokens[result.position])
    return (
        f"{result.model}: target {show_token(result.target)!r} (id {result.target_id}) after position "
        f"{result.position} {after!r}: p {probability_text(result.probability)}, "
        f"log p {result.logprob:.3g}, logit {result.logit:.4g}, rank {result.rank}"
    )


def _corpus_line(result: CorpusAttribution) -> str:
    sequences = f"{result.num_seqs} sequence{'s' if result.num_seqs != 1 else ''}"
    how = "mean over sequences, 95% interval" if result.num_seqs >= 2 else "no interval: 1 sequence"
    return (
        f"{result.model} on {result.dataset}: {sequences} × {result.seq_len} tokens, "
        f"{result.positions:,} positions ({how})"
    )


def terminal_summary(result: Result) -> list[str]:
    """A few lines for the terminal: the prediction (or the corpus), the 5 sub-layers
    (attention or MLP of a block) and heads with the largest |C|, then the 5 neurons with the
    largest |C| one per line with their top promoted tokens, any notes and the check."""
    if isinstance(result, CorpusAttribution):
        lines = [_corpus_line(result)]
    else:
        lines = [_head_line(result)]
        if result.foil is not None:
            difference = (
                "" if result.logit_difference is None else f": logit difference {result.logit_difference:.4g}"
            )
            lines.append(f"foil {show_token(result.foil)!r} (id {result.foil_id}){difference}")
    lines.append(f"top layers by |C|: {_largest(_sub_layers(result))}")
    heads = [(f"L{h.layer}.H{h.head}", h.contribution) for h in result.heads]
    lines.append(f"top heads by |C|: {_largest(heads)}")
    neurons = _neuron_entries(result)
    lines.append("top neurons by |C| (→ promoted tokens):" + ("" if neurons else " none"))
    lines += [f"  {name} {_signed(score)} → {promoted}" for name, score, promoted in neurons]
    lines += [f"note: {note}" for note in result.notes]
    lines.append(_check_line(result.check))
    return lines
