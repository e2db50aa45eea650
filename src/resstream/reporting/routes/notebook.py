"""`routes`' results in a notebook: each class's `to_pandas()` frame (`frames`) and the view
`_repr_html_()` shows, registered when this module is imported (the package imports it). One
prediction: the page's header table, the largest flows, the edges and routes.png; a corpus:
where head edges read from, the heads and MLPs on the route and the corpus figure."""

from __future__ import annotations

from resstream.analysis.routes.results import CorpusRoutes, RoutesResult
from resstream.reporting.notebook import NotebookView, Picture, Table, frame_table, register_result
from resstream.reporting.routes.common import PNG_FILE, TABLE_SHOWN, interval_note
from resstream.reporting.routes.corpus import corpus_routes_figure
from resstream.reporting.routes.figure import route_figure
from resstream.reporting.routes.frames import corpus_frame, flow_frame, routes_frame, shares_frame
from resstream.reporting.routes.page import summary_html

__all__ = ["corpus_routes_view", "routes_view"]


def routes_view(result: RoutesResult) -> NotebookView:
    """What one prediction shows in a notebook: the page's header table, the largest flows, the
    edges (routes.csv) and routes.png."""
    tables = [
        Table("the route", summary_html(result)),
        frame_table("the largest flows", flow_frame(result), TABLE_SHOWN),
        frame_table("edges (routes.csv)", routes_frame(result)),
    ]
    caption = f"{PNG_FILE}: the route of the prediction (routes.html has it interactive)"
    return NotebookView(tables=tables, pictures=[Picture(route_figure(result), caption)])


def corpus_routes_view(result: CorpusRoutes) -> NotebookView:
    """What a corpus shows in a notebook: where route head edges read from, the heads and MLPs
    on the route (routes.csv) and the corpus figure."""
    tables = [
        frame_table("where route head edges read from", shares_frame(result)),
        frame_table("heads and MLPs on the route (routes.csv)", corpus_frame(result)),
    ]
    caption = (
        f"{PNG_FILE}: heads on the route, per layer, and where head edges read ({interval_note(result)})"
    )
    return NotebookView(tables=tables, pictures=[Picture(corpus_routes_figure(result), caption)])


register_result(RoutesResult, routes_frame, routes_view)
register_result(CorpusRoutes, corpus_frame, corpus_routes_view)
