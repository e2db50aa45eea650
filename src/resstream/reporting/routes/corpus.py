"""routes.png in corpus mode (`corpus_routes_figure`): how often each head is on the route
(layer × head), per layer the attention's and the MLP's rate, and where head edges come from."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from resstream.analysis.routes.results import CorpusRoutes, Rate
from resstream.reporting.attribute.drawing import literal
from resstream.reporting.figures import integer_ticks, new_figure
from resstream.reporting.routes.common import interval_note
from resstream.reporting.routes.geometry import MLP_COLOUR

__all__ = ["SHARE_LABELS", "corpus_routes_figure"]


def _errors(rates: Sequence[Rate]) -> np.ndarray:
    """(2, n): the distances from each value down to its low end and up to its high end (0
    where the interval is nan)."""
    errors = np.array([(rate.value - rate.low, rate.high - rate.value) for rate in rates], dtype=float).T
    return np.clip(np.nan_to_num(errors, nan=0.0), 0.0, None).reshape(2, len(rates))


def corpus_routes_figure(result: CorpusRoutes) -> Figure:
    """routes.png in corpus mode: the share of predictions whose route passes through each head
    (layer × head heatmap), per layer through any head and through the MLP (with 95%
    intervals), and the share of route head edges from the first, the previous and the same
    position."""
    layers, heads = result.n_layers, result.n_heads
    fig = new_figure(min(18.0, 7.6 + 0.42 * heads), min(10.0, max(4.2, 1.9 + 0.32 * layers)))
    fig.set_layout_engine("constrained")
    grid = fig.add_gridspec(1, 3, width_ratios=[max(2.4, 0.42 * heads), 2.6, 2.0])
    heat = fig.add_subplot(grid[0])
    _on_route_heatmap(fig, heat, result)
    _layer_profile(fig.add_subplot(grid[1], sharey=heat), result)
    _edge_share_bars(fig.add_subplot(grid[2]), result)
    fig.suptitle(
        f"{literal(result.model)} on {literal(result.dataset)}: routes of {result.positions:,} next-token "
        f"predictions ({result.num_seqs} × {result.seq_len} tokens), τ = {result.threshold:g}; "
        f"{interval_note(result)}",
        fontsize=9,
    )
    return fig


def _on_route_heatmap(fig: Figure, ax: Axes, result: CorpusRoutes) -> None:
    matrix = np.array([[rate.value for rate in row] for row in result.head_on_route], dtype=float)
    matrix = matrix.reshape(result.n_layers, result.n_heads)
    image = ax.imshow(
        matrix, origin="lower", aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest"
    )
    if matrix.size <= 256:
        for (layer, head), value in np.ndenumerate(matrix):
            colour = "black" if value > 0.6 else "white"
            ax.text(head, layer, f"{value:.0%}", ha="center", va="center", fontsize=6.5, color=colour)
    integer_ticks(ax.xaxis, at_most=16)
    integer_ticks(ax.yaxis, at_most=16)
    ax.set_xlabel("head")
    ax.set_ylabel("layer (block)")
    ax.set_title("heads on the route", fontsize=9)
    # below the heatmap, not between it and the layer profile, whose axis its label would seem to name
    bar = fig.colorbar(image, ax=ax, location="bottom", fraction=0.05, pad=0.02, aspect=30)
    bar.set_label("share of predictions with the head on the route", fontsize=8)
    bar.ax.tick_params(labelsize=7)


def _layer_profile(ax: Axes, result: CorpusRoutes) -> None:
    layers = np.arange(result.n_layers, dtype=float)
    series = (
        ("attention (any head)", result.attention_on_route, "tab:blue", 0.12),
        ("MLP", result.mlp_on_route, MLP_COLOUR, -0.12),
    )
    for label, rates, colour, offset in series:
        values = [rate.value for rate in rates]
        ax.errorbar(
            values,
            layers + offset,
            xerr=_errors(rates),
            color=colour,
            marker="o",
            markersize=4,
            capsize=2,
            linewidth=0.8,
            elinewidth=1.0,
            label=f"{label} on the route",
        )
    ax.set_xlim(-0.03, 1.03)
    ax.set_xlabel("share of predictions, per layer")
    ax.grid(axis="x", alpha=0.3)
    ax.set_ylabel("layer (block)")  # its tick labels shown: the panel reads on its own
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)


#: What each edge share is called on the bar chart.
SHARE_LABELS = {"first": "first token", "previous": "previous\nposition", "same": "same\nposition"}


def _edge_share_bars(ax: Axes, result: CorpusRoutes) -> None:
    names = list(result.edge_shares)
    rates = [result.edge_shares[name] for name in names]
    ax.bar(
        range(len(names)),
        [rate.value for rate in rates],
        yerr=_errors(rates),
        capsize=4,
        color="#6a8fb3",
        error_kw={"elinewidth": 1},
    )
    ax.set_xticks(range(len(names)), [SHARE_LABELS.get(name, name) for name in names], fontsize=8)
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel("share of route head edges")
    ax.set_title("where head edges read\n(overlap at positions 0 and 1)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
