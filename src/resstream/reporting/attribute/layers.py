"""layers.png: each block's attention and MLP, their C (top panel) and DLA (bottom panel) as
grouped bars; a corpus's means get their 95% intervals as error bars."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from resstream.analysis.attribution.results import AttributeResult
from resstream.reporting.attribute.common import Result, score_value
from resstream.reporting.attribute.drawing import (
    C_LABEL,
    MAX_WIDTH,
    dla_label,
    figure_title,
    mean_prefix,
    score_error,
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
    """Per block: the attention's and the MLP's C (top panel) and DLA (bottom panel) as
    grouped bars, with a zero line; corpus means get their 95% intervals as error bars."""
    layers = [entry.layer for entry in result.layers]
    fig = new_figure(min(MAX_WIDTH, max(6.4, 2.0 + 0.55 * len(layers))), 6.2)
    fig.set_layout_engine("constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    attn_c = [entry.attn_contribution for entry in result.layers]
    mlp_c = [entry.mlp_contribution for entry in result.layers]
    _grouped_bars(top, layers, [("attention", ATTN_COLOUR, attn_c), ("MLP", MLP_COLOUR, mlp_c)])
    top.set_ylabel(mean_prefix(result) + C_LABEL)
    top.legend(fontsize=8)
    attn_d = [entry.attn_dla for entry in result.layers]
    mlp_d = [entry.mlp_dla for entry in result.layers]
    _grouped_bars(bottom, layers, [("attention", ATTN_COLOUR, attn_d), ("MLP", MLP_COLOUR, mlp_d)])
    bottom.set_ylabel(mean_prefix(result) + dla_label(result))
    label = "layer (block)"
    if isinstance(result, AttributeResult):
        label += f"; not drawn: embedding DLA {result.embed_dla:+.3g}, bias term {result.bias_dla:+.3g}"
    bottom.set_xlabel(label)
    fig.suptitle(figure_title(result), fontsize=9)
    return fig
