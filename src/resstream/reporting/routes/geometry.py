"""The layout routes.png and routes.html share: positions left to right, residual states
bottom (the embedding, row 0) to top (the last block's output), each edge a curve between its
nodes (`edge_curves`) coloured by its kind (`edge_colour`) and as wide as it is important
(`edge_width`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib import colormaps
from matplotlib.colors import to_hex

from resstream.analysis.names import EMBEDDING, sublayer_name
from resstream.analysis.routes.results import RouteEdge

__all__ = [
    "HEAD_COLOURS",
    "HEAD_COLOURS_TOP",
    "MLP_COLOUR",
    "NODE_COLOUR",
    "RESIDUAL_COLOUR",
    "SIDE_BOW",
    "SPREAD",
    "TOKEN_CHARACTERS",
    "WIDTH_BASE",
    "WIDTH_SCALE",
    "Curve",
    "Point",
    "draw_order",
    "edge_colour",
    "edge_curves",
    "edge_width",
    "layer_colours",
    "row_label",
]

RESIDUAL_COLOUR = "#b3b3b3"
MLP_COLOUR = "#d62728"
NODE_COLOUR = "#333333"
#: Heads are coloured by layer along this map, up to `HEAD_COLOURS_TOP` (its top is too pale).
HEAD_COLOURS, HEAD_COLOURS_TOP = "viridis", 0.85
#: The line width (points) of an edge of importance 0 and what importance 1 adds.
WIDTH_BASE, WIDTH_SCALE = 0.6, 4.4
#: How far an MLP edge and a head edge from the same position bow out of the vertical (in
#: positions), and how far parallel head edges between the same two nodes are spread apart.
SIDE_BOW, SPREAD = 0.22, 0.09
#: Characters a token keeps in figure labels and on the page's axis.
TOKEN_CHARACTERS = 12


def row_label(point: int) -> str:
    """The row of residual point `point`, named by what was added last (`analysis.names`):
    "emb" (L_in_0), "L3.attn" (L_res_3, after block 3's attention), "L3.mlp" (L_out_3, after
    its MLP)."""
    if point == 0:
        return EMBEDDING
    layer, stage = divmod(point - 1, 2)
    return sublayer_name(layer, "attn" if stage == 0 else "mlp")


def edge_colour(edge: RouteEdge, n_layers: int) -> str:
    """An edge's colour: grey the residual, red an MLP, a head its layer's on `HEAD_COLOURS`."""
    if edge.kind == "residual":
        return RESIDUAL_COLOUR
    if edge.kind == "mlp":
        return MLP_COLOUR
    return layer_colours(n_layers)[edge.layer]


def layer_colours(n_layers: int) -> list[str]:
    """The colour of each layer's heads."""
    cmap = colormaps[HEAD_COLOURS]
    return [to_hex(cmap(HEAD_COLOURS_TOP * layer / max(1, n_layers - 1))) for layer in range(n_layers)]


def edge_width(importance: float) -> float:
    """An edge's line width in points: `WIDTH_BASE` + `WIDTH_SCALE` × importance."""
    return WIDTH_BASE + WIDTH_SCALE * max(0.0, importance)


Point = tuple[float, float]


@dataclass(frozen=True)
class Curve:
    """An edge's path in graph units (x = position, y = residual point): a quadratic Bézier
    curve from `start` to `end` pulled towards `control` (straight when it is the midpoint)."""

    start: Point
    control: Point
    end: Point


def _bow(edge: RouteEdge, rank: int, parallel: int) -> float:
    """How far the middle of the edge leaves the straight line (positions, + to the right of
    its direction): residual edges straight, MLP edges bowing right, a head edge within one
    position bowing left, parallel head edges spread apart."""
    if edge.kind == "residual":
        return 0.0
    if edge.kind == "mlp":
        return SIDE_BOW
    if edge.source == edge.target:
        return -(SIDE_BOW + SPREAD * rank)
    return SPREAD * (rank - (parallel - 1) / 2)


def edge_curves(edges: Sequence[RouteEdge]) -> list[Curve]:
    """Each edge's curve (`Curve`), in the order of `edges`."""
    groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for index, edge in enumerate(edges):
        groups[(edge.kind, edge.from_point, edge.source, edge.to_point, edge.target)].append(index)
    rank = {index: (k, len(members)) for members in groups.values() for k, index in enumerate(members)}
    curves = []
    for index, edge in enumerate(edges):
        start, end = (float(edge.source), float(edge.from_point)), (float(edge.target), float(edge.to_point))
        dx, dy = end[0] - start[0], end[1] - start[1]
        length = math.hypot(dx, dy) or 1.0
        bow = 2 * _bow(edge, *rank[index])  # a quadratic curve's middle is half-way to its control
        middle = ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
        control = (middle[0] + bow * dy / length, middle[1] - bow * dx / length)
        curves.append(Curve(start, control, end))
    return curves


def draw_order(edges: Sequence[RouteEdge]) -> list[int]:
    """Residual edges first, then MLPs, then heads; wide edges below narrow ones."""
    kinds = {"residual": 0, "mlp": 1, "head": 2}
    return sorted(range(len(edges)), key=lambda i: (kinds.get(edges[i].kind, 3), -edges[i].importance))
