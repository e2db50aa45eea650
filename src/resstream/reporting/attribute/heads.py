"""heads.png: every attention head as two layer × head heatmaps, DLA (left) and C (right; the
other way round for a result ranked by C),
each centred at 0 on its own symmetric colour scale (red raises the target, blue lowers it),
with the cell values written in when the grid is small."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure

from resstream.analysis.attribution.results import SCORE_FIELDS, SCORE_NAMES, HeadAttribution, HeadSummary
from resstream.reporting.attribute.common import Result, score_value
from resstream.reporting.attribute.drawing import figure_title, mean_prefix, rankings, score_label
from resstream.reporting.figures import integer_ticks, new_figure

__all__ = ["diverging_heatmap", "heads_figure"]

ANNOTATED_CELLS = 256  # heads.png writes each cell's value when the grid has at most this many
INDEX_TICKS = 16  # heads.png labels every layer and head up to this many
HEATMAP = "RdBu_r"


def _head_matrix(heads: Sequence[HeadAttribution | HeadSummary], rows: int, name: str) -> np.ndarray:
    """Layers × heads of one score (`name`: contribution or dla); nan where no head is listed."""
    columns = max((head.head for head in heads), default=-1) + 1
    rows = max(rows, max((head.layer for head in heads), default=-1) + 1)
    matrix = np.full((rows, columns), np.nan)
    for head in heads:
        matrix[head.layer, head.head] = score_value(getattr(head, name))
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


def diverging_heatmap(fig: Figure, ax: Axes, matrix: np.ndarray, title: str, label: str) -> None:
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
    """Two layer × head heatmaps side by side: DLA (left) and C (right; C left for a result
    ranked by C), each with its own symmetric colour scale centred at 0 (red raises the
    target, blue lowers it); DLA alone where no head's C was computed."""
    rows = len(result.layers)
    order = rankings(result)
    matrices = [_head_matrix(result.heads, rows, SCORE_FIELDS[rank]) for rank in order]
    kept = [
        (rank, matrix) for rank, matrix in zip(order, matrices, strict=True) if not np.isnan(matrix).all()
    ]
    layers, heads = matrices[0].shape
    per_head = 0.5 if layers * heads <= ANNOTATED_CELLS else 0.2  # room for the values written in cells
    width = len(kept) * min(8.0, max(4.0, 2.2 + per_head * heads))
    fig = new_figure(width, min(9.0, max(3.4, 1.8 + 0.35 * layers)))
    fig.set_layout_engine("constrained", w_pad=0.15)  # colour bars and titles never overlap
    mean = mean_prefix(result)
    axes = fig.subplots(1, len(kept), squeeze=False)[0]
    for ax, (rank, matrix) in zip(axes, kept, strict=True):
        title = f"{mean}{SCORE_NAMES[rank]} per head"
        diverging_heatmap(fig, ax, matrix, title, score_label(result, rank))
    fig.suptitle(figure_title(result), fontsize=9)
    return fig
