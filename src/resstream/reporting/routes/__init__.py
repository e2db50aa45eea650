"""What `resstream routes` writes and shows: the renderers of `RoutesResult` (the route of one
prediction) and `CorpusRoutes` (routes over a corpus sample). They lay the numbers out and
compute nothing new.

* `route_figure` (routes.png): positions left to right (their tokens below), residual states
  bottom (the embedding) to top (the last block's output), one dot per node on the route and
  one line per kept edge, its width growing with the importance: grey the residual, red an MLP,
  a head coloured by its layer. The same drawing, as inline SVG, is the graph of `route_page`.
* `route_page` (routes.html): the graph, interactive and self-contained (no request leaves the
  page: the SVG is drawn here, the result is embedded as JSON, the script is inline). Hover an
  edge: its head, importance and tokens; click a node (or Tab to it, Enter): what the logit
  lens reads there, its largest terms and neurons, its kept edges.
* `corpus_routes_figure` (routes.png in corpus mode): how often each head is on the route
  (layer × head), per layer the attention's and the MLP's rate, and where head edges come from.
* `routes_lines` (the terminal), `write_routes_report` (routes.csv, routes.png, routes.html),
  and each class's `to_pandas()` frame and notebook view.

One module per output:

- `common`: the file names, how many rows are listed, counts and notes several outputs share.
- `geometry`: the layout routes.png and routes.html share: rows, colours, widths, each edge's
  curve (`edge_curves`) and the drawing order.
- `figure`: routes.png (`route_figure`).
- `svg`, `page`, `page_assets`: routes.html (`route_svg`, `route_page`; the page's style and
  script).
- `corpus`: routes.png in corpus mode (`corpus_routes_figure`).
- `frames`: the long-format frames (`to_pandas()`, routes.csv) and the tables cut from them.
- `terminal`: the lines printed after a run (`routes_lines`).
- `write`: every file at once (`write_routes_report`).
- `notebook`: what a result shows in a notebook; importing this package registers each class's
  `to_pandas()` frame and notebook view (the classes name it as their renderer).
"""

from resstream.reporting.routes.corpus import corpus_routes_figure
from resstream.reporting.routes.figure import route_figure
from resstream.reporting.routes.frames import CORPUS_COLUMNS, EDGE_COLUMNS, corpus_frame, routes_frame
from resstream.reporting.routes.geometry import (
    SIDE_BOW,
    Curve,
    edge_colour,
    edge_curves,
    edge_width,
    row_label,
)
from resstream.reporting.routes.notebook import corpus_routes_view, routes_view
from resstream.reporting.routes.page import route_page, script_json
from resstream.reporting.routes.svg import route_svg
from resstream.reporting.routes.terminal import routes_lines
from resstream.reporting.routes.write import write_routes_report

__all__ = [
    "CORPUS_COLUMNS",
    "EDGE_COLUMNS",
    "SIDE_BOW",
    "Curve",
    "corpus_frame",
    "corpus_routes_figure",
    "corpus_routes_view",
    "edge_colour",
    "edge_curves",
    "edge_width",
    "route_figure",
    "route_page",
    "route_svg",
    "routes_frame",
    "routes_lines",
    "routes_view",
    "row_label",
    "script_json",
    "write_routes_report",
]
