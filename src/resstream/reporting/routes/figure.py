"""routes.png for one prediction (`route_figure`): positions left to right (their tokens
below), residual states bottom (the embedding) to top (the last block's output), one dot per
node on the route and one line per kept edge, its width growing with the importance: grey the
residual, red an MLP, a head coloured by its layer. routes.html draws the same layout as SVG
(`svg`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import PathPatch
from matplotlib.path import Path as CurvePath

from resstream.analysis.routes.results import RoutesResult
from resstream.reporting.attribute.drawing import literal, token_label
from resstream.reporting.figures import figure_token, integer_ticks, new_figure
from resstream.reporting.routes.common import heads_through, mlps_through
from resstream.reporting.routes.geometry import (
    MLP_COLOUR,
    NODE_COLOUR,
    RESIDUAL_COLOUR,
    TOKEN_CHARACTERS,
    draw_order,
    edge_colour,
    edge_curves,
    edge_width,
    layer_colours,
    row_label,
)
from resstream.reporting.text import probability_text

__all__ = ["route_figure"]


def _position_label(tokens: Sequence[str], position: int) -> str:
    """An x-axis label: the token and its position."""
    return f"{figure_token(tokens[position], limit=TOKEN_CHARACTERS)} {position}"


def _route_title(result: RoutesResult) -> str:
    after = token_label(result.tokens[result.position])
    return (
        f"{literal(result.model)}: route of {token_label(result.prediction)} "
        f"(p {probability_text(result.probability)}) predicted at position {result.position} {after}\n"
        f"τ = {result.threshold:g}: {len(result.nodes)} nodes, {len(result.edges)} edges "
        f"({heads_through(result)} through heads, {mlps_through(result)} through MLPs); "
        "line width grows with importance"
    )


def route_figure(result: RoutesResult) -> Figure:
    """routes.png: the route of the prediction (module docstring), the prediction's node
    marked and labelled with the predicted token."""
    positions, rows = len(result.tokens), 2 * result.n_layers + 1
    fig = new_figure(min(18.0, max(6.4, 2.2 + 0.5 * positions)), min(11.0, max(4.2, 2.2 + 0.3 * rows)))
    fig.set_layout_engine("constrained")
    ax = fig.add_subplot()
    _draw_backdrop(ax, positions, result.n_layers)
    curves = edge_curves(result.edges)
    for index in draw_order(result.edges):
        edge, curve = result.edges[index], curves[index]
        path = CurvePath(
            [curve.start, curve.control, curve.end], [CurvePath.MOVETO, CurvePath.CURVE3, CurvePath.CURVE3]
        )
        colour = edge_colour(edge, result.n_layers)
        ax.add_patch(
            PathPatch(
                path,
                facecolor="none",
                edgecolor=colour,
                linewidth=edge_width(edge.importance),
                capstyle="round",
                alpha=0.85 if edge.kind == "head" else 1.0,
            )
        )
    _draw_nodes(ax, result)
    _route_axes(ax, result)
    _layer_bar(fig, ax, result.n_layers)
    _route_legend(ax)
    fig.suptitle(_route_title(result), fontsize=9)
    return fig


def _draw_backdrop(ax: Axes, positions: int, n_layers: int) -> None:
    """Every other layer's two rows shaded, a faint line up each position."""
    for layer in range(1, n_layers, 2):
        ax.axhspan(2 * layer + 0.5, 2 * layer + 2.5, color="#f2f2f2", zorder=0, linewidth=0)
    for position in range(positions):
        ax.axvline(position, color="#e4e4e4", linewidth=0.6, zorder=0)


def _draw_nodes(ax: Axes, result: RoutesResult) -> None:
    """A dot per node; the prediction's node larger, ringed, labelled with the prediction."""
    xs = [node.position for node in result.nodes]
    ys = [node.point for node in result.nodes]
    ax.scatter(xs, ys, s=14, color=NODE_COLOUR, zorder=4, linewidths=0)
    top = 2 * result.n_layers
    ax.scatter(
        [result.position], [top], s=110, facecolor="#ffd84d", edgecolor=MLP_COLOUR, linewidths=1.6, zorder=5
    )
    ax.annotate(
        f"→ {token_label(result.prediction)} p {probability_text(result.probability)}",
        xy=(result.position, top),
        xytext=(0, 11),
        textcoords="offset points",
        ha="right" if result.position > len(result.tokens) / 2 else "left",
        va="bottom",
        fontsize=9,
        fontweight="bold",
        color=MLP_COLOUR,
        annotation_clip=False,
        zorder=6,
    )


def _route_axes(ax: Axes, result: RoutesResult) -> None:
    """Tokens along x (rotated when they would crowd; later tokens grey), rows along y."""
    positions, rows = len(result.tokens), 2 * result.n_layers + 1
    labels = [_position_label(result.tokens, p) for p in range(positions)]
    crowded = positions > 8 or max(len(label) for label in labels) > 7
    ax.set_xticks(
        range(positions),
        labels,
        fontsize=8 if positions <= 64 else 6,  # the figure stops growing at 18 inches
        rotation=55 if crowded else 0,
        ha="right" if crowded else "center",
        rotation_mode="anchor",
    )
    for position, tick in enumerate(ax.get_xticklabels()):
        if position > result.position:
            tick.set_color("#aaaaaa")
    ax.set_yticks(range(rows), [row_label(point) for point in range(rows)], fontsize=7 if rows > 13 else 8)
    ax.set_xlim(-0.7, positions - 0.3)
    ax.set_ylim(-0.6, rows - 0.1)
    ax.tick_params(length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("position (token); grey tokens come after the prediction", fontsize=8)
    ax.set_ylabel("residual state (bottom: embedding)", fontsize=8)


def _layer_bar(fig: Figure, ax: Axes, n_layers: int) -> None:
    """The colour bar of the heads' layers."""
    colours = ListedColormap(layer_colours(n_layers))
    norm = BoundaryNorm(np.arange(n_layers + 1) - 0.5, n_layers)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=colours), ax=ax, fraction=0.025, pad=0.01, shrink=0.7)
    bar.set_label("head edges: layer", fontsize=8)
    integer_ticks(bar.ax.yaxis, at_most=min(n_layers, 12))
    bar.ax.tick_params(labelsize=7)


def _route_legend(ax: Axes) -> None:
    handles = [
        Line2D([], [], color=RESIDUAL_COLOUR, linewidth=2.5, label="residual"),
        Line2D([], [], color=layer_colours(3)[1], linewidth=2.5, label="head (colour: layer)"),
        Line2D([], [], color=MLP_COLOUR, linewidth=2.5, label="MLP"),
        Line2D(
            [], [], color=NODE_COLOUR, marker="o", linestyle="none", markersize=4, label="state on the route"
        ),
        Line2D(
            [],
            [],
            markerfacecolor="#ffd84d",
            markeredgecolor=MLP_COLOUR,
            marker="o",
            linestyle="none",
            markersize=8,
            label="prediction",
        ),
    ]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=5, frameon=False, fontsize=8)
