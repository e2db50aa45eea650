"""layers.png: each block's attention and MLP, their DLA (top panel) and C (bottom panel) as
grouped bars (C on top for a result ranked by C); a corpus's means get their 95% intervals as
error bars."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from resstream.analysis.attribution.results import AttributeResult, ranked_score
from resstream.reporting.attribute.common import Result, score_value
from resstream.reporting.attribute.drawing import (
    MAX_WIDTH,
    figure_title,
    rankings,
    score_error,
    score_label,
    zero_line,
)
from resstream.reporting.figures import new_figure
from resstream.simulation.intervals import Estimate

__all__ = ["layers_figure"]

ATTN_COLOUR = "tab:blue"
MLP_COLOUR = "tab:orange"

#: One series of grouped bars: (label, colour, one score per layer).
Series = tuple[str, str, Sequence[float | Estimate]]


def _grouped_bars(ax: Axes, layers: Sequence[int], series: Sequence[Series]) -> None:
    """Bars side by side per layer: series = (label, colour, scores); an Estimate score gets an
    error bar from its interval (none where the interval is nan)."""
    width = 0.8 / len(series)
    x = np.arange(len(layers), dtype=float)
    for index, (label, colour, scores) in enumerate(series):
        offset = (index - (len(series) - 1) / 2) * width
        values = [score_value(s) for s in scores]
        errors = np.array([score_error(s) for s in scores], dtype=float).T
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
    zero_line(ax)
    ax.set_xticks(x, [str(layer) for layer in layers])
    ax.grid(axis="y", alpha=0.3)


def layers_figure(result: Result) -> Figure:
    """Per block: the attention's and the MLP's DLA (top panel) and C (bottom panel; the other
    way round for a result ranked by C) as grouped bars, with a zero line; corpus means get
    their 95% intervals as error bars."""
    layers = [entry.layer for entry in result.layers]
    fig = new_figure(min(MAX_WIDTH, max(6.4, 2.0 + 0.55 * len(layers))), 6.2)
    fig.set_layout_engine("constrained")
    panels = fig.subplots(2, 1, sharex=True)
    for ax, rank in zip(panels, rankings(result), strict=True):
        attn = [ranked_score(entry, rank, "attn_") for entry in result.layers]
        mlp = [ranked_score(entry, rank, "mlp_") for entry in result.layers]
        _grouped_bars(ax, layers, [("attention", ATTN_COLOUR, attn), ("MLP", MLP_COLOUR, mlp)])
        ax.set_ylabel(score_label(result, rank))
    panels[0].legend(fontsize=8)
    label = "layer (block)"
    if isinstance(result, AttributeResult):
        label += f"; not drawn: embedding DLA {result.embed_dla:+.3g}, bias term {result.bias_dla:+.3g}"
    panels[1].set_xlabel(label)
    fig.suptitle(figure_title(result), fontsize=9)
    return fig
