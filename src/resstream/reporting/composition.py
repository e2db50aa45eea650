"""Head composition rendered: one heatmap per kind and the one-row-per-score CSV.

`plot_composition` draws, for one kind (Q, K or V), every earlier head (columns, grouped by
layer 0..L−2) against every later head (rows, grouped by layer 1..L−1, top to bottom): a
cell is the score of the column's head into the row's head, and cells where the row's layer
is not later than the column's are blank. Lines separate the layers, the axes label heads by
their names, `L1.H3` (every head where the cells are large enough, else each layer's first head with
a minor tick per head), and the colour bar marks the random baseline with a line (also stated
in the title, with the convention).

In a notebook a `CompositionResult` shows the scores by kind, the strongest pairs of each kind
and the three heatmaps; `to_pandas()` is the frame composition.csv is written from
(`COMPOSITION_COLUMNS`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

from resstream.analysis.memories.composition import (
    COMPOSITION_COLUMNS,
    KIND_NAMES,
    KINDS,
    CompositionResult,
    Kind,
)
from resstream.analysis.names import head_name
from resstream.reporting.figures import new_figure, save_figure
from resstream.reporting.notebook import (
    NotebookView,
    Picture,
    frame_csv,
    frame_table,
    long_frame,
    register_result,
)

if TYPE_CHECKING:
    import pandas

#: The columns of composition.csv: those of `CompositionResult.to_pandas()`.
CSV_COLUMNS = COMPOSITION_COLUMNS

#: Strongest pairs of each kind a notebook shows (the command's default `--top`).
SHOWN_PAIRS = 10


def composition_csv(result: CompositionResult) -> str:
    """composition.csv: `composition_frame` as CSV, one row per score."""
    return frame_csv(composition_frame(result))


def composition_frame(result: CompositionResult) -> pandas.DataFrame:
    """`CompositionResult.to_pandas()`: one row per kind and pair of heads (`COMPOSITION_COLUMNS`,
    documented by the class), kind by kind (q, k, v), the pairs in `result.pairs()` order."""
    import pandas

    pairs = np.array(result.pairs(), dtype=np.int64).reshape(-1, 4)
    parts = []
    for kind in KINDS:
        scores = result.scores(kind).numpy()[tuple(pairs.T)]
        columns = [np.full(len(pairs), kind, dtype=object), *pairs.T, scores.astype(np.float64)]
        parts.append(pandas.DataFrame(dict(zip(COMPOSITION_COLUMNS, columns, strict=False))))
    frame = pandas.concat(parts, ignore_index=True)
    frame["baseline"] = result.baseline.mean
    return frame[list(COMPOSITION_COLUMNS)]


def top_pairs_frame(result: CompositionResult, n: int = SHOWN_PAIRS) -> pandas.DataFrame:
    """The `n` strongest pairs of each kind (`CompositionResult.top`, as composition.json and
    the printed lines list them), in the columns of `composition_frame`."""
    rows = [
        [kind, pair.layer_a, pair.head_a, pair.layer_b, pair.head_b, pair.score, result.baseline.mean]
        for kind in KINDS
        for pair in result.top(kind, n)
    ]
    return long_frame(COMPOSITION_COLUMNS, rows)


def kinds_frame(result: CompositionResult) -> pandas.DataFrame:
    """Per kind, its mean and largest score and the share of pairs above the baseline (as
    composition.json's `summary`)."""
    rows = []
    for kind in KINDS:
        summary = result.kind_summary(kind)
        rows.append([kind, summary["mean"], summary["max"], summary["above_baseline"], result.baseline.mean])
    return long_frame(("kind", "mean", "max", "above_baseline", "baseline"), rows)


def heatmap_matrix(result: CompositionResult, kind: Kind) -> np.ndarray:
    """The ((L−1)·H, (L−1)·H) matrix drawn: row (l2−1)·H + h2 (later head, layers 1..L−1),
    column l1·H + h1 (earlier head, layers 0..L−2); NaN where l2 <= l1."""
    L, H = result.n_layers, result.n_heads
    scores = result.scores(kind).numpy()  # [l1, h1, l2, h2]
    later_by_earlier = scores.transpose(2, 3, 0, 1)[1:, :, : L - 1, :]  # [l2, h2, l1, h1]
    return later_by_earlier.reshape((L - 1) * H, (L - 1) * H)


def heatmap_size(cells: int) -> float:
    """The heatmap's height in inches for `cells` rows (its width adds the colour bar)."""
    return min(9.0, max(4.5, 0.12 * cells + 3.0))


def plot_composition(result: CompositionResult, kind: Kind, path: str | os.PathLike[str]) -> Path:
    """The heatmap of one kind (`composition_figure`), saved as PNG to `path`."""
    return save_figure(composition_figure(result, kind), path)


def composition_figure(result: CompositionResult, kind: Kind) -> Figure:
    """The heatmap of one kind (module docstring): composition_{kind}.png unsaved."""
    L, H = result.n_layers, result.n_heads
    matrix = heatmap_matrix(result, kind)
    size = heatmap_size(matrix.shape[0])
    fig = new_figure(size + 1.4, size)
    ax = fig.add_subplot()
    top = max(float(np.nanmax(matrix)), result.baseline.mean * 2)
    cmap = _colour_map()
    image = ax.imshow(matrix, cmap=cmap, vmin=0.0, vmax=top, interpolation="nearest", aspect="equal")
    _layer_grid(ax, L, H, size)
    baseline = result.baseline
    ax.set_title(
        f"{KIND_NAMES[kind]}: {result.model} (convention {result.convention})\n"
        f"random baseline {baseline.mean:.3f} (mean of {baseline.samples} Gaussian draws; "
        f"1/√d = {baseline.rms_analytic:.3f})",
        fontsize=9,
    )
    ax.set_xlabel("earlier head (writes)")
    ax.set_ylabel("later head (reads)")
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label(f"{KIND_NAMES[kind]} score (dashed: random baseline)")
    bar.ax.axhline(baseline.mean, color="white", linewidth=2.5)
    bar.ax.axhline(baseline.mean, color="black", linewidth=1.0, linestyle="--")
    return fig


def _colour_map():
    """viridis with blank (white) NaN cells: the invalid triangle."""
    from matplotlib import colormaps

    return colormaps["viridis"].with_extremes(bad="white")


#: Tick labels' font size (points), and the smallest cell (points) that gets a label per head.
_TICK_FONT = 6.5
_CELL_PER_LABEL = 7.5


@dataclass(frozen=True)
class HeadTicks:
    """Where a heatmap's axes are labelled: `positions` (cell indices) with their `columns`
    labels (earlier heads) and `rows` labels (later heads), `minor` ticks, and whether every
    head is labelled (`every_head`)."""

    positions: list[int]
    columns: list[str]
    rows: list[str]
    minor: list[int]
    every_head: bool


def head_ticks(n_layers: int, n_heads: int, size: float) -> HeadTicks:
    """Head names `L1.H3` (columns: layers 0..L−2, rows: 1..L−1) for a `size`-inch heatmap:
    every head where a cell is tall enough for a label, else each layer's first head (at most
    ~16) with a minor tick per head (none where cells are under 2 points)."""
    groups = n_layers - 1
    cells = groups * n_heads
    cell_points = 0.65 * size * 72 / cells  # the axes take about 65% of the figure's height
    every_head = cell_points >= _CELL_PER_LABEL
    if every_head:
        shown = [(g, h) for g in range(groups) for h in range(n_heads)]
        minor: list[int] = []
    else:
        step = max(1, groups // 16)
        shown = [(g, 0) for g in range(0, groups, step)]
        minor = list(range(cells)) if cell_points >= 2 else []
    return HeadTicks(
        positions=[g * n_heads + h for g, h in shown],
        columns=[head_name(g, h) for g, h in shown],
        rows=[head_name(g + 1, h) for g, h in shown],
        minor=minor,
        every_head=every_head,
    )


def _layer_grid(ax, n_layers: int, n_heads: int, size: float) -> None:
    """Separators between layers (across the drawn cells) and the head labels of `head_ticks`."""
    groups = n_layers - 1
    bottom = groups * n_heads - 0.5
    for g in range(1, groups):  # only across the drawn cells, not the blank triangle
        edge = g * n_heads - 0.5
        ax.vlines(edge, (g - 1) * n_heads - 0.5, bottom, color="0.35", linewidth=0.8)
        ax.hlines(edge, -0.5, (g + 1) * n_heads - 0.5, color="0.35", linewidth=0.8)
    ticks = head_ticks(n_layers, n_heads, size)
    font = _TICK_FONT if ticks.every_head else _TICK_FONT + 1
    ax.set_xticks(ticks.positions, ticks.columns, rotation=90 if ticks.every_head else 0, fontsize=font)
    ax.set_yticks(ticks.positions, ticks.rows, fontsize=font)
    ax.set_xticks(ticks.minor, minor=True)
    ax.set_yticks(ticks.minor, minor=True)
    ax.tick_params(which="major", length=3, width=0.6)
    ax.tick_params(which="minor", length=1.5, width=0.4)


def top_lines(result: CompositionResult, n: int) -> list[str]:
    """The lines `composition` prints: the baseline, then per kind its `n` strongest pairs."""
    baseline = result.baseline
    lines = [
        f"{result.model}: {result.n_layers} layers × {result.n_heads} heads; random baseline "
        f"{baseline.mean:.4f} ± {baseline.stderr:.4f} (mean of {baseline.samples} Gaussian draws; "
        f"1/√d_model = {baseline.rms_analytic:.4f}); convention {result.convention}"
    ]
    for kind in KINDS:
        pairs = result.top(kind, n)
        lines.append(f"{KIND_NAMES[kind]}, top {len(pairs)} (earlier head -> later head):")
        lines += [
            f"  {pair.name}  {pair.score:.4f}  ({pair.score / baseline.mean:.1f}× baseline)" for pair in pairs
        ]
    return lines


# --------------------------------------------------------------------------- notebook


def _composition_view(result: CompositionResult) -> NotebookView:
    """The scores by kind, the strongest pairs of each kind, and the three heatmaps."""
    baseline = result.baseline
    tables = [
        frame_table(
            f"scores by kind (random baseline {baseline.mean:.4f} ± {baseline.stderr:.4f})",
            kinds_frame(result),
        ),
        frame_table(
            f"strongest pairs, top {SHOWN_PAIRS} of each kind (writer: earlier head, reader: later head)",
            top_pairs_frame(result),
            shown=3 * SHOWN_PAIRS,
        ),
    ]
    pictures = [
        Picture(
            composition_figure(result, kind),
            f"composition_{kind}.png: {KIND_NAMES[kind]}, later heads (rows) reading earlier heads (columns)",
        )
        for kind in KINDS
    ]
    return NotebookView(tables=tables, pictures=pictures)


register_result(CompositionResult, composition_frame, _composition_view)

__all__ = [
    "CSV_COLUMNS",
    "SHOWN_PAIRS",
    "HeadTicks",
    "composition_csv",
    "composition_figure",
    "composition_frame",
    "head_ticks",
    "heatmap_matrix",
    "heatmap_size",
    "kinds_frame",
    "plot_composition",
    "top_lines",
    "top_pairs_frame",
]
