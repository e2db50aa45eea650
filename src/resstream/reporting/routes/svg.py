"""The graph of routes.html as inline SVG (`route_svg`): the layout of routes.png
(`geometry`) in pixels, each edge a hoverable group and each node a focusable circle, every
text from the result escaped."""

from __future__ import annotations

import html
from dataclasses import dataclass

from resstream.analysis.routes.results import RoutesResult
from resstream.reporting.routes.geometry import (
    TOKEN_CHARACTERS,
    Curve,
    Point,
    draw_order,
    edge_colour,
    edge_curves,
    edge_width,
    row_label,
)
from resstream.reporting.text import probability_text, show_token

__all__ = ["route_svg"]


@dataclass(frozen=True)
class _Canvas:
    """The page's SVG geometry: pixels per position and row, and the margins."""

    positions: int
    rows: int
    dx: float
    dy: float
    left: float = 76.0
    top: float = 44.0
    bottom: float = 118.0
    right: float = 24.0

    @classmethod
    def of(cls, result: RoutesResult) -> _Canvas:
        positions, rows = len(result.tokens), 2 * result.n_layers + 1
        return cls(
            positions, rows, max(34.0, min(58.0, 1100.0 / positions)), max(18.0, min(32.0, 680.0 / rows))
        )

    @property
    def width(self) -> float:
        return self.left + self.dx * self.positions + self.right

    @property
    def height(self) -> float:
        return self.top + self.dy * self.rows + self.bottom

    def xy(self, point: Point) -> tuple[float, float]:
        """Pixels of a point in graph units (x = position, y = residual point)."""
        return self.left + self.dx * (point[0] + 0.5), self.top + self.dy * (self.rows - 0.5 - point[1])


def _svg_path(canvas: _Canvas, curve: Curve) -> str:
    (x0, y0), (cx, cy), (x1, y1) = (canvas.xy(p) for p in (curve.start, curve.control, curve.end))
    return f"M{x0:.1f} {y0:.1f}Q{cx:.1f} {cy:.1f} {x1:.1f} {y1:.1f}"


def _attribute(value: str) -> str:
    return html.escape(value, quote=True)


def _svg_edges(result: RoutesResult, canvas: _Canvas) -> list[str]:
    """The edges in `draw_order` (residual, MLP, then head edges; a wide one below a narrow one)."""
    curves = edge_curves(result.edges)
    return [_svg_edge(result, index, _svg_path(canvas, curves[index])) for index in draw_order(result.edges)]


def _svg_edge(result: RoutesResult, index: int, path: str) -> str:
    """Edge `index` along `path`: a wide transparent stroke to hover and the visible line."""
    edge = result.edges[index]
    width = 1.3 * edge_width(edge.importance)  # points to pixels
    return (
        f'<g class="edge {edge.kind}" data-edge="{index}" data-label="{_attribute(edge.label)}">'
        f'<path class="hit" d="{path}" stroke-width="{max(9.0, width + 6):.1f}"/>'
        f'<path class="line" d="{path}" stroke="{edge_colour(edge, result.n_layers)}" '
        f'stroke-width="{width:.2f}"/></g>'
    )


def _svg_nodes(result: RoutesResult, canvas: _Canvas) -> list[str]:
    """The nodes, the predicted one larger."""
    return [_svg_node(result, index, canvas) for index in range(len(result.nodes))]


def _svg_node(result: RoutesResult, index: int, canvas: _Canvas) -> str:
    """Node `index`, focusable, named for screen readers."""
    node = result.nodes[index]
    x, y = canvas.xy((node.position, node.point))
    predicted = node.point == 2 * result.n_layers and node.position == result.position
    name = f"{node.name} at position {node.position} ‘{show_token(result.tokens[node.position])}’"
    return (
        f'<circle class="node{" prediction" if predicted else ""}" data-node="{index}" '
        f'cx="{x:.1f}" cy="{y:.1f}" r="{7 if predicted else 3.5}" tabindex="0" role="button" '
        f'aria-label="{_attribute(name)}"/>'
    )


def _svg_frame(result: RoutesResult, canvas: _Canvas) -> list[str]:
    """The shaded layers, the rows' labels, the positions' lines and tokens."""
    parts = []
    for layer in range(1, result.n_layers, 2):
        _, y_top = canvas.xy((0, 2 * layer + 2.5))
        parts.append(
            f'<rect class="band" x="{canvas.left}" y="{y_top:.1f}" '
            f'width="{canvas.dx * canvas.positions:.1f}" height="{2 * canvas.dy:.1f}"/>'
        )
    for point in range(canvas.rows):
        _, y = canvas.xy((0, point))
        parts.append(f'<text class="row" x="{canvas.left - 8}" y="{y + 4:.1f}">{row_label(point)}</text>')
    bottom = canvas.top + canvas.dy * canvas.rows
    for position, token in enumerate(result.tokens):
        x, _ = canvas.xy((position, 0))
        shown = html.escape(_cut(show_token(token)) + f" {position}")
        later = " later" if position > result.position else ""
        parts.append(f'<line class="column" x1="{x:.1f}" x2="{x:.1f}" y1="{canvas.top}" y2="{bottom:.1f}"/>')
        parts.append(
            f'<text class="token{later}" transform="translate({x + 4:.1f} {bottom + 10:.1f}) rotate(-55)">'
            f"{shown}</text>"
        )
    return parts


def _svg_prediction(result: RoutesResult, canvas: _Canvas) -> str:
    x, y = canvas.xy((result.position, 2 * result.n_layers))
    anchor = "end" if result.position > len(result.tokens) / 2 else "start"
    text = f"→ ‘{show_token(result.prediction)}’ p {probability_text(result.probability)}"
    return (
        f'<text class="predicted" x="{x:.1f}" y="{y - 14:.1f}" text-anchor="{anchor}">'
        f"{html.escape(text)}</text>"
    )


def _cut(text: str) -> str:
    return text if len(text) <= TOKEN_CHARACTERS else text[: TOKEN_CHARACTERS - 1] + "…"


def route_svg(result: RoutesResult) -> str:
    """The graph as inline SVG (no namespace link, nothing fetched): the same layout as
    routes.png; each edge a `g.edge` (`data-edge`: its index in `result.edges`), each node a
    focusable `circle.node` (`data-node`: its index in `result.nodes`)."""
    canvas = _Canvas.of(result)
    body = [*_svg_frame(result, canvas), *_svg_edges(result, canvas), *_svg_nodes(result, canvas)]
    body.append(_svg_prediction(result, canvas))
    return (
        f'<svg id="graph" width="{canvas.width:.0f}" height="{canvas.height:.0f}" '
        f'viewBox="0 0 {canvas.width:.0f} {canvas.height:.0f}" aria-label="route graph">{"".join(body)}</svg>'
    )
