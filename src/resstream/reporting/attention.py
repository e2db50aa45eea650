"""Heatmaps of mean attention (simulated stacks and trained models), distance profiles, and the
per-layer lines that `simulate` and `recency` print.

`attention_grid_figure` draws the classic figure: one row per configuration or model, one
column per layer, each panel the mean attention matrix (query i down, key j across, integer
positions on both axes, the masked future blank). The rows are there to be compared, so the
whole figure has ONE colour scale and one labelled colour bar. The scale is logarithmic and
covers the scores of earlier keys (j < i) only, from the smallest to the largest any map gives
(the bottom at most a thousandth below the top): attention spreads over keys as 1/(i + 1) and
a bias multiplies that, so on a linear scale everything beyond the first few queries is one
dark colour. The diagonal (each query's attention to itself), which in a LayerNorm stack takes
most of the mass and would saturate any scale that showed the earlier keys' trend, is drawn in
flat grey, its range written on the figure: the trend statistics (ρ, the distance-band ratios)
leave it out too. Scores under a floor that had to be raised (or 0) get the bar's lower arrow.
`distance_figure` draws, per layer, the mean attention δ tokens back beside what uniform
causal attention would give, named in a legend.
`layer_lines` gives per layer the trend line (direction, rank correlation, band ratios, 95%
intervals) and below it the strict all-steps verdict; `trend_table` sets the same in columns.

In a notebook a simulation (`SimulationResult`, `SimulationRun`) shows its trend table and the
attention grid `simulate` writes; a measured one (`RecencyResult`, `RecencyReport`) its trend
table, the grid and the distance plots `recency` writes. Their `to_pandas()` frames hold the
mean attention matrices (`SIMULATION_COLUMNS`, `RECENCY_COLUMNS`).
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.colors import ListedColormap, LogNorm
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from resstream.analysis.recency.measured import RECENCY_COLUMNS, RecencyReport, RecencyResult
from resstream.reporting.figures import integer_ticks, new_figure, save_figure
from resstream.reporting.notebook import (
    NotebookView,
    Picture,
    Table,
    frame_html,
    long_frame,
    register_result,
)
from resstream.simulation import LayerAttention
from resstream.simulation.intervals import Estimate
from resstream.simulation.results import (
    NEGLIGIBLE_RATIO,
    SIMULATION_COLUMNS,
    AttentionTrend,
    BandRatio,
    SimulationResult,
    SimulationRun,
    TrendVerdict,
    configuration_label,
)

if TYPE_CHECKING:
    import pandas

Matrix = Sequence[Sequence[float]]

#: The label of the one colour bar of an attention grid.
COLOUR_BAR_LABEL = "mean attention to earlier keys j < i\n(log scale, one for all rows)"

#: The lowest bottom of the colour scale as a fraction of its top (`shared_scale`).
COLOUR_FLOOR = 1e-3

#: The flat colour of the diagonal (self-attention), which is off the colour scale.
DIAGONAL_COLOUR = "0.72"

#: The legend entry of the no-bias reference in distance plots.
UNIFORM_LABEL = "uniform causal attention"

#: |z| beyond which a z-score is shown as a bound: so large only when the standard error is
#: (nearly) zero, e.g. float rounding around a deterministic pattern, where z says nothing.
Z_DISPLAY_LIMIT = 1000.0


def _masked(matrix: Matrix) -> np.ndarray:
    """A copy of the matrix with the future (key > query) as NaN, so it is drawn blank."""
    array = np.array(matrix, dtype=float)
    array[np.triu_indices(array.shape[0], k=1)] = np.nan
    return array


def _earlier(matrix: Matrix) -> np.ndarray:
    """The scores of earlier keys (j < i): the future and the diagonal as NaN."""
    earlier = _masked(matrix)
    np.fill_diagonal(earlier, np.nan)
    return earlier


def _diagonal(matrix: Matrix) -> np.ndarray:
    """The diagonal (self-attention) alone, everything else NaN."""
    array = np.asarray(matrix, dtype=float)
    diagonal = np.full_like(array, np.nan)
    np.fill_diagonal(diagonal, np.diagonal(array))
    return diagonal


def _earlier_scores(rows: Sequence[Sequence[Matrix]]) -> np.ndarray:
    """Every finite score to an earlier key (j < i) of every map of every row, flat."""
    scores = [_earlier(matrix) for maps in rows for matrix in maps]
    return np.concatenate([m[np.isfinite(m)] for m in scores]) if scores else np.empty(0)


def shared_scale(rows: Sequence[Sequence[Matrix]]) -> tuple[float, float]:
    """The one colour scale (bottom, top): top = the largest score to an earlier token (self
    excluded) over every map of every row, 1.0 when there is none; bottom = the smallest
    positive such score, raised to top × `COLOUR_FLOOR` when it is lower."""
    return _scale_of(_earlier_scores(rows))


def _scale_of(scores: np.ndarray) -> tuple[float, float]:
    """`shared_scale` of the earlier keys' scores, flat."""
    positive = scores[scores > 0]
    if not positive.size:
        return COLOUR_FLOOR, 1.0
    top = float(positive.max())
    return max(float(positive.min()), top * COLOUR_FLOOR), top


def diagonal_note(rows: Sequence[Sequence[Matrix]]) -> str:
    """The figure's line on the diagonal: drawn grey, off the scale, and its range."""
    values = np.concatenate(
        [np.diagonal(np.asarray(matrix, dtype=float)) for maps in rows for matrix in maps]
    )
    values = values[np.isfinite(values)]
    span = f" ({values.min():.3g}–{values.max():.3g} here)" if values.size else ""
    return (
        f"grey diagonal: each query's attention to itself{span}, left off the colour scale, "
        "as the trend's ρ and distance ratios leave it out"
    )


def attention_grid_figure(
    rows: Sequence[tuple[str, Sequence[Matrix]]], *, title: str = "mean attention"
) -> Figure:
    """Rows = (label, one matrix per layer); columns = layers 1..L; one colour scale for the
    earlier keys, the diagonal in flat grey (module docstring)."""
    if not rows or not all(maps for _, maps in rows):
        raise ValueError("an attention grid needs at least one row with at least one layer")
    columns = max(len(maps) for _, maps in rows)
    fig = new_figure(width=1.8 * columns + 2.4, height=max(3.4, 1.8 * len(rows) + 0.9))
    axes = fig.subplots(len(rows), columns, squeeze=False)
    all_maps = [maps for _, maps in rows]
    scores = _earlier_scores(all_maps)
    vmin, vmax = _scale_of(scores)
    clipped = bool((scores < vmin).any())  # shown at the lower arrow
    norm = LogNorm(vmin=vmin, vmax=vmax, clip=False)
    grey = ListedColormap([DIAGONAL_COLOUR])
    image: AxesImage | None = None
    for r, (label, maps) in enumerate(rows):
        for c, ax in enumerate(axes[r]):
            if c >= len(maps):
                ax.axis("off")
                continue
            image = ax.imshow(_earlier(maps[c]), cmap="viridis", norm=norm, interpolation="nearest")
            ax.imshow(_diagonal(maps[c]), cmap=grey, interpolation="nearest")
            _position_axes(ax, first_column=c == 0, last_row=r == len(rows) - 1 or c >= len(rows[r + 1][1]))
            if r == 0 or c >= len(rows[r - 1][1]):  # the top panel of each column
                ax.set_title(f"layer {c + 1}", fontsize=9)
        axes[r][0].annotate(
            label,
            xy=(0, 0.5),
            xycoords="axes fraction",
            xytext=(-34, 0),
            textcoords="offset points",
            ha="right",
            va="center",
            fontsize=8,
        )
    assert image is not None  # every row has at least one map (checked above)
    # as long as the grid is tall: the bar's length is `aspect` times its width
    bar = fig.colorbar(
        image,
        ax=list(axes.ravel()),
        fraction=0.02,
        pad=0.015,
        extend="min" if clipped else "neither",
        aspect=20 * len(rows),
    )
    bar.set_label(COLOUR_BAR_LABEL, fontsize=8)
    bar.ax.tick_params(which="both", labelsize=7)
    fig.suptitle(f"{title}\n{diagonal_note(all_maps)}", fontsize=9)
    return fig


def _position_axes(ax, *, first_column: bool, last_row: bool) -> None:
    """Integer query / key positions on a heatmap panel; axis names on the outer panels."""
    for axis in (ax.xaxis, ax.yaxis):
        integer_ticks(axis)
    ax.locator_params(nbins=6)
    ax.tick_params(labelsize=6, length=2, pad=1)
    if first_column:
        ax.set_ylabel("query i", fontsize=7, labelpad=1)
    if last_row:
        ax.set_xlabel("key j", fontsize=7, labelpad=1)


def plot_attention_grid(
    rows: Sequence[tuple[str, Sequence[Matrix]]],
    path: str | os.PathLike[str],
    *,
    title: str = "mean attention",
) -> Path:
    """`attention_grid_figure` written as a PNG to `path`."""
    return save_figure(attention_grid_figure(rows, title=title), path)


def uniform_profile(tokens: int) -> list[float]:
    """The distance profile of uniform causal attention (query i gives 1/(i+1) to each key):
    it falls with δ too, because long distances exist only for late queries with many keys."""
    return [sum(1.0 / (i + 1) for i in range(delta, tokens)) / (tokens - delta) for delta in range(tokens)]


def distance_figure(
    profiles: Sequence[Sequence[float]],
    *,
    head_profiles: Sequence[Sequence[Sequence[float]]] | None = None,
    title: str = "attention by distance",
) -> Figure:
    """Per layer (one panel each), mean attention δ tokens back (δ = 0: the token itself);
    thin grey lines for single heads when `head_profiles` is given, a dotted line for uniform
    causal attention (`uniform_profile`), the no-bias reference; a legend names the three. Log
    scale, integer distances."""
    layers = len(profiles)
    fig = new_figure(width=min(2.2 * layers, 13.0) + 0.6, height=2.9)
    axes = fig.subplots(1, layers, squeeze=False, sharey=True)[0]
    for layer, ax in enumerate(axes):
        distances = range(len(profiles[layer]))
        if head_profiles is not None:
            for h, head in enumerate(head_profiles[layer]):
                ax.plot(distances, head, color="0.7", linewidth=0.6, label="single heads" if h == 0 else None)
        ax.plot(distances, profiles[layer], color="tab:blue", linewidth=1.6, label="heads averaged")
        uniform = uniform_profile(len(profiles[layer]))
        ax.plot(distances, uniform, color="black", linestyle=":", linewidth=1.0, label=UNIFORM_LABEL)
        ax.set_yscale("log")
        integer_ticks(ax.xaxis)
        ax.locator_params(axis="x", nbins=4)  # narrow panels: a few whole distances
        ax.set_title(f"layer {layer + 1}", fontsize=9)
        ax.set_xlabel("distance δ = i − j", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean attention", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, frameon=False)
    fig.suptitle(title, fontsize=10, y=1.04)
    return fig


def plot_distance_profiles(
    profiles: Sequence[Sequence[float]],
    path: str | os.PathLike[str],
    *,
    head_profiles: Sequence[Sequence[Sequence[float]]] | None = None,
    title: str = "attention by distance",
) -> Path:
    """`distance_figure` written as a PNG to `path`."""
    return save_figure(distance_figure(profiles, head_profiles=head_profiles, title=title), path)


# --------------------------------------------------------------------------- printed lines


def format_z(z: float) -> str:
    """A z-score for the terminal: "+3.2"; beyond ±`Z_DISPLAY_LIMIT` a bound ("> 1000"), as
    such values come from a (near-)zero standard error and their digits mean nothing; "∞" for
    an exact nonzero step; "n/a" without a standard error."""
    if math.isnan(z):
        return "n/a"
    if math.isinf(z):
        return "+∞" if z > 0 else "-∞"
    if abs(z) >= Z_DISPLAY_LIMIT:
        return f"> {Z_DISPLAY_LIMIT:.0f}" if z > 0 else f"< -{Z_DISPLAY_LIMIT:.0f}"
    return f"{z:+.1f}"


def _interval(estimate: Estimate, fmt: str) -> str:
    """ "value [low, high]" in `fmt`, "n/a" for nan ends."""

    def show(value: float) -> str:
        return "n/a" if math.isnan(value) else format(value, fmt)

    if math.isnan(estimate.low):
        return f"{show(estimate.value)} [no interval]"
    return f"{show(estimate.value)} [{show(estimate.low)}, {show(estimate.high)}]"


def _band_text(band: BandRatio) -> str:
    return f"{band.label} ×{_interval(band.ratio, '#.3g')}"


def rho_text(trend: AttentionTrend) -> str:
    """Spearman's ρ of the trend with its 95% interval: "+0.412 [+0.300, +0.520]"."""
    return _interval(trend.spearman, "+.3f")


def bands_text(trend: AttentionTrend) -> str:
    """The near and far band ratios to uniform causal attention with their 95% intervals
    ("δ 1–3 ×1.21 [1.10, 1.33], δ 8–9 ×0.8 [...]"); empty with fewer than 2 tokens."""
    return ", ".join(_band_text(band) for band in (trend.near, trend.far) if band is not None)


def trend_line(trend: AttentionTrend) -> str:
    """The direction of the trend, Spearman's ρ and the near and far band ratios to uniform
    causal attention, each with its 95% interval."""
    parts = [f"{trend.direction}: ρ {rho_text(trend)}"]
    bands = bands_text(trend)
    if bands:
        parts.append(f"vs uniform {bands}")
    return "; ".join(parts)


def _verdict_text(verdict: TrendVerdict) -> str:
    testable = len(verdict.rows) - len(verdict.untestable_rows)
    state = "holds" if verdict.holds else f"{len(verdict.holding_rows)}/{testable} rows"
    margins = [row.min_margin for row in verdict.rows if row.testable]
    weakest = min(margins) if margins and not any(math.isnan(m) for m in margins) else math.nan
    step = "n/a" if math.isnan(weakest) else f"{weakest:+.2g}"
    return f"{verdict.direction} {state} (smallest step {step}, min z {format_z(verdict.min_z)})"


def verdict_text(verdict: TrendVerdict) -> str:
    """One strict verdict: the direction, "holds" or the rows that hold, and the weakest
    step's size and z-score ("recency 3/4 rows (smallest step +0.012, min z +2.1)")."""
    return _verdict_text(verdict)


def strict_line(layer: LayerAttention) -> str:
    """The strict all-steps verdicts of a layer (`resstream.simulation.results`): rows that
    hold, and the weakest step's size and z-score in each direction."""
    return f"strict, every step: {verdict_text(layer.recency)}; {verdict_text(layer.primacy)}"


#: What the printed lines mean, printed once after them by `simulate` and `recency` (the
#: backticked parameter name as its flag there: `resstream.cli.flags.cli_message`); the second
#: line is the rule of the direction word (`AttentionTrend.direction`).
LEGEND = (
    "trend: ρ = rank correlation of attention with key position among earlier keys, averaged over "
    "rows (> 0: recency, < 0: primacy), ×r = attention on distances δ = i − j relative to uniform "
    "causal attention, both with 95% intervals; strict: rows whose every step "
    "A[i][j+1] − A[i][j] is ≥ `threshold` standard errors in one direction\n"
    "direction: recency (primacy) when ρ's 95% interval lies above (below) 0 and some distance band "
    f"δ ≥ 1 (not only the two shown) is at least {NEGLIGIBLE_RATIO:.0%} off uniform (×r ≤ "
    f"{1 - NEGLIGIBLE_RATIO:.2f} or ≥ {1 + NEGLIGIBLE_RATIO:.2f}); otherwise none, however large |ρ| "
    "(ρ ranks, so a tilt of a fraction of a percent can give |ρ| ≈ 0.5)"
)


def layer_lines(layers: Sequence[LayerAttention]) -> list[str]:
    """Per layer two lines: "layer N: <trend line>" and, indented, its strict verdicts."""
    lines = []
    for layer in layers:
        lines.append(f"layer {layer.layer}: {trend_line(layer.trend)}")
        lines.append(f"  {strict_line(layer)}")
    return lines


def heads_line(trends: Sequence[AttentionTrend]) -> str:
    """How many heads of a layer show each direction, and every head's ρ in head order."""
    counts = dict.fromkeys(("recency", "primacy", "none", "untestable"), 0)
    for trend in trends:
        counts[trend.direction] += 1
    shown = ", ".join(f"{direction} {count}" for direction, count in counts.items() if count)
    values = " ".join(f"{trend.spearman.value:+.2f}" for trend in trends)
    return f"heads: {shown} (ρ by head {values})"


# --------------------------------------------------------------------------- the commands' figures


def simulation_rows(items: Sequence[tuple[str, SimulationResult]]) -> list[tuple[str, tuple[Matrix, ...]]]:
    """The rows of simulate.png: (label, the mean attention of every layer) per configuration."""
    return [(label, result.mean_attention) for label, result in items]


def simulation_title(results: Sequence[SimulationResult]) -> str:
    """The title of simulate.png: how many simulations (when the configurations agree)."""
    counts = {result.config.simulations for result in results}
    return f"mean attention over {counts.pop():,} simulations" if len(counts) == 1 else "mean attention"


def recency_rows(results: Sequence[RecencyResult]) -> list[tuple[str, tuple[Matrix, ...]]]:
    """The rows of recency.png: (model, its heads' average attention of every layer) per model."""
    return [(result.model, result.mean_attention) for result in results]


def recency_title(results: Sequence[RecencyResult]) -> str:
    """The title of recency.png: the sequences the means are over."""
    first = results[0]
    return f"mean attention over {first.num_sequences} sequences of {first.seq_len} tokens, heads averaged"


def recency_profiles(
    result: RecencyResult,
) -> tuple[list[tuple[float, ...]], list[tuple[tuple[float, ...], ...]]]:
    """What a model's distance plot draws: per layer the heads' average profile, and every head's."""
    return [layer.by_distance for layer in result.layers], [
        layer.head_by_distance() for layer in result.layers
    ]


def distance_title(result: RecencyResult) -> str:
    """The title of a model's distance plot (distance_<model>.png)."""
    return f"{result.model}: attention δ tokens back"


def recency_distance_figure(result: RecencyResult) -> Figure:
    """A model's distance plot (`distance_figure` of `recency_profiles`), unsaved."""
    profiles, heads = recency_profiles(result)
    return distance_figure(profiles, head_profiles=heads, title=distance_title(result))


# --------------------------------------------------------------------------- notebook

#: The columns of `trend_table` after its label column: the printed lines, in columns.
TREND_COLUMNS = (
    "layer",
    "direction",
    "ρ [95% interval]",
    "vs uniform [95% interval]",
    "strict recency",
    "strict primacy",
)


def trend_table(labelled: Sequence[tuple[str, Sequence[LayerAttention]]], label: str) -> pandas.DataFrame:
    """`layer_lines` as a table: per labelled stack (column `label`) and layer, the trend's
    direction, ρ and band ratios with their 95% intervals, and the strict verdicts."""
    rows = [
        [
            name,
            layer.layer,
            layer.trend.direction,
            rho_text(layer.trend),
            bands_text(layer.trend),
            verdict_text(layer.recency),
            verdict_text(layer.primacy),
        ]
        for name, layers in labelled
        for layer in layers
    ]
    return long_frame((label, *TREND_COLUMNS), rows)


def _trend_view_table(frame: pandas.DataFrame) -> Table:
    """The trend table with the legend the commands print below their lines."""
    legend = html.escape(LEGEND).replace("\n", "<br>")
    shown = frame_html(frame, shown=max(len(frame), 1))
    return Table("trend by layer", f"{shown}<p style='font-size:90%;color:#555'>{legend}</p>")


def _attention_block(layer: LayerAttention) -> dict[str, object]:
    """One layer's mean attention as columns: layer, query, key, distance, value, stderr, one
    entry per pair key <= query."""
    mean, stderr = np.asarray(layer.mean, dtype=np.float64), np.asarray(layer.stderr, dtype=np.float64)
    query, key = np.tril_indices(len(mean))
    return {
        "layer": layer.layer,
        "query": query,
        "key": key,
        "distance": query - key,
        "value": mean[query, key],
        "stderr": stderr[query, key],
    }


def _frame_of(blocks: list[dict[str, object]], columns: Sequence[str]) -> pandas.DataFrame:
    """The blocks (dicts of columns, scalars repeated) one after the other, in `columns`."""
    import pandas

    if not blocks:
        return long_frame(columns, [])
    frame = pandas.concat([pandas.DataFrame(block) for block in blocks], ignore_index=True)
    return frame[list(columns)]


def simulation_frame(items: Sequence[tuple[str, SimulationResult]]) -> pandas.DataFrame:
    """`SimulationRun.to_pandas()` of (label, result) pairs (`SIMULATION_COLUMNS`)."""
    blocks = [
        {"configuration": label, **_attention_block(layer)}
        for label, result in items
        for layer in result.layers
    ]
    return _frame_of(blocks, SIMULATION_COLUMNS)


def recency_frame(results: Sequence[RecencyResult]) -> pandas.DataFrame:
    """`RecencyReport.to_pandas()` of the models' results (`RECENCY_COLUMNS`): per layer the
    heads' average (head NA), then every head."""
    blocks = [
        {"model": result.model, "head": head, **_attention_block(attention)}
        for result in results
        for layer in result.layers
        for head, attention in [(None, layer.average), *enumerate(layer.heads)]
    ]
    return _frame_of(blocks, RECENCY_COLUMNS).astype({"head": "Int64"})


def _simulation_view(items: Sequence[tuple[str, SimulationResult]]) -> NotebookView:
    """The trend table and simulate.png of (label, result) pairs."""
    table = trend_table([(label, result.layers) for label, result in items], "configuration")
    figure = attention_grid_figure(simulation_rows(items), title=simulation_title([r for _, r in items]))
    caption = "simulate.png: mean attention of every layer (columns), one row per configuration"
    return NotebookView(tables=[_trend_view_table(table)], pictures=[Picture(figure, caption)])


def _recency_view(results: Sequence[RecencyResult]) -> NotebookView:
    """The trend table (with every layer's heads), recency.png and each model's distance plot."""
    table = trend_table(
        [(result.model, [layer.average for layer in result.layers]) for result in results], "model"
    )
    table["heads"] = [  # the column names what the printed line's "heads: " prefix says
        heads_line([head.trend for head in layer.heads]).removeprefix("heads: ")
        for result in results
        for layer in result.layers
    ]
    grid = Picture(
        attention_grid_figure(recency_rows(results), title=recency_title(results)),
        "recency.png: mean attention of every layer (columns), heads averaged, one row per model",
    )
    distances = [
        Picture(
            recency_distance_figure(result), f"distance plot of {result.model}: mean attention δ tokens back"
        )
        for result in results
    ]
    return NotebookView(tables=[_trend_view_table(table)], pictures=[grid, *distances])


def _labelled(result: SimulationResult) -> list[tuple[str, SimulationResult]]:
    """One simulation result as a run's (label, result) pairs, labelled by its configuration."""
    return [(configuration_label(result.config), result)]


register_result(SimulationRun, lambda r: simulation_frame(r.results), lambda r: _simulation_view(r.results))
register_result(
    SimulationResult, lambda r: simulation_frame(_labelled(r)), lambda r: _simulation_view(_labelled(r))
)
register_result(RecencyReport, lambda r: recency_frame(r.results), lambda r: _recency_view(r.results))
register_result(RecencyResult, lambda r: recency_frame([r]), lambda r: _recency_view([r]))
