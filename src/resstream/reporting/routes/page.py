"""routes.html (`route_page`): the graph (`svg`), interactive and self-contained (no request
leaves the page: the SVG is drawn here, the result is embedded as JSON, the script is inline,
`page_assets`). Hover an edge: its head, importance and tokens; click a node (or Tab to it,
Enter): what the logit lens reads there, its largest terms and neurons, its kept edges."""

from __future__ import annotations

import html

from resstream.analysis.routes.results import RoutesResult
from resstream.io import strict_json
from resstream.reporting.attribute.page import key_values_html
from resstream.reporting.notebook import frame_html
from resstream.reporting.routes.common import TABLE_SHOWN, heads_through, mlps_through
from resstream.reporting.routes.frames import flow_frame
from resstream.reporting.routes.geometry import MLP_COLOUR, RESIDUAL_COLOUR, layer_colours, row_label
from resstream.reporting.routes.page_assets import ROUTES_SCRIPT, ROUTES_STYLE
from resstream.reporting.routes.svg import route_svg
from resstream.reporting.text import probability_text, show_token

__all__ = ["FLOW_CAPTION", "HOW_TO_READ", "route_page", "script_json", "summary_html"]


def _point_text(point: int, n_layers: int) -> str:
    """What the state at `point` is, for the page's panel."""
    if point == 0:
        return "the embedding (input of block 0)"
    layer, stage = divmod(point - 1, 2)
    if stage == 0:
        return f"block {layer} after its attention"
    return f"output of block {layer}" + (
        " (the final state, before the final norm)" if layer == n_layers - 1 else ""
    )


def script_json(value: object) -> str:
    """`value` as strict JSON safe inside a <script> element: every "<", ">" and "&" (so no
    "</script" or "<!--" can occur) and the line separators U+2028/9 as \\u escapes."""
    text = strict_json(value)
    for character in ("<", ">", "&", "\u2028", "\u2029"):
        text = text.replace(character, f"\\u{ord(character):04x}")
    return text


def _page_data(result: RoutesResult) -> dict[str, object]:
    """What the page's script reads: `to_dict()` and the texts as shown (tokens with visible
    whitespace, rows, what each point is, each node's lens tokens with their probabilities)."""
    rows = range(2 * result.n_layers + 1)
    return {
        "result": result.to_dict(),
        "shown": {
            "tokens": [show_token(token) for token in result.tokens],
            "rows": [row_label(point) for point in rows],
            "points": [_point_text(point, result.n_layers) for point in rows],
            "lens": [
                [(show_token(scored.name), probability_text(scored.score)) for scored in node.lens]
                for node in result.nodes
            ],
        },
    }


def summary_html(result: RoutesResult) -> str:
    """The page's header table: the model, the prediction, its position, τ, the route's size."""
    kinds = f"{heads_through(result)} through heads, {mlps_through(result)} through MLPs"
    pairs = [
        ("model", f"{result.model} ({result.family}, {result.n_layers} layers × {result.n_heads} heads)"),
        ("prediction", f"‘{show_token(result.prediction)}’ p {probability_text(result.probability)}"),
        ("at position", f"{result.position} ‘{show_token(result.tokens[result.position])}’"),
        ("threshold τ", f"{result.threshold:g}"),
        ("route", f"{len(result.nodes)} nodes, {len(result.edges)} edges ({kinds})"),
    ]
    if result.degenerate:
        pairs.append(("degenerate nodes", f"{result.degenerate} (every term had proximity 0)"))
    return key_values_html(pairs)


def _legend_html(n_layers: int) -> str:
    colours = layer_colours(n_layers)
    gradient = f"linear-gradient(to right,{','.join(colours * (2 if n_layers == 1 else 1))})"
    return (
        "<p class='legend caption'>"
        f"<span class='swatch' style='background:{RESIDUAL_COLOUR}'></span>residual"
        f"<span class='swatch' style='background:{MLP_COLOUR}'></span>MLP"
        f"<span class='swatch' style='width:6em;background:{gradient}'></span>heads by layer, "
        f"L0 → L{n_layers - 1}; width grows with importance</p>"
    )


#: The page's "how to read" line.
HOW_TO_READ = (
    "How to read: positions run left to right (their tokens below), residual states bottom (the "
    "embedding) to top (the last block's output); every line is a kept edge (importance ≥ τ) into "
    "the state above it, from the state it was computed from: a head reads an earlier position. "
    "Hover an edge for its head, importance and tokens; click a node (or Tab to it and press "
    "Enter) to see what the logit lens reads there, its largest terms and neurons and its edges."
)


def route_page(result: RoutesResult) -> str:
    """routes.html: a header (model, prediction, threshold, counts), how to read it, the graph
    (`route_svg`) with the node panel, the largest flows; interactive by an inline script over
    the embedded `to_dict()` (`script_json`); loads nothing from anywhere."""
    title = f"Route of ‘{show_token(result.prediction)}’ at position {result.position}: {result.model}"
    flows = frame_html(flow_frame(result), TABLE_SHOWN)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>resstream routes: {html.escape(result.model)}</title><style>{ROUTES_STYLE}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{summary_html(result)}"
        f"<p class='caption'>{html.escape(HOW_TO_READ)}</p>{_legend_html(result.n_layers)}"
        f"<div class='layout'><div class='graph'>{route_svg(result)}</div>"
        "<aside id='panel' aria-live='polite'><p>Click a node.</p></aside></div>"
        "<div id='tip' role='tooltip' hidden></div>"
        f"<h2>The largest flows</h2><p class='caption'>{html.escape(FLOW_CAPTION)}</p>{flows}"
        f"<script type='application/json' id='routes-data'>{script_json(_page_data(result))}</script>"
        f"<script>{ROUTES_SCRIPT}</script></body></html>"
    )


FLOW_CAPTION = (
    "The share of the prediction's state that flows through each head and MLP along all paths "
    "(no threshold), largest first."
)
