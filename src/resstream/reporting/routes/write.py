"""Every file of one `routes` result at once (`write_routes_report`): routes.csv, routes.png
and, for one prediction, routes.html."""

from __future__ import annotations

from pathlib import Path

from resstream.analysis.routes.results import CorpusRoutes, RoutesResult
from resstream.io import write_text
from resstream.reporting.attribute.common import Directory, output_path
from resstream.reporting.figures import save_figure
from resstream.reporting.notebook import frame_csv
from resstream.reporting.routes.common import CSV_FILE, HTML_FILE, PNG_FILE
from resstream.reporting.routes.corpus import corpus_routes_figure
from resstream.reporting.routes.figure import route_figure
from resstream.reporting.routes.frames import corpus_frame, routes_frame
from resstream.reporting.routes.page import route_page

__all__ = ["write_routes_report"]


def write_routes_report(result: RoutesResult | CorpusRoutes, directory: Directory) -> list[Path]:
    """routes.csv (the `to_pandas()` frame) and routes.png in `directory` (a folder or an output
    set), and for one prediction routes.html, each written atomically; returns their paths."""
    csv_path = output_path(directory, CSV_FILE)
    if isinstance(result, CorpusRoutes):
        write_text(csv_path, frame_csv(corpus_frame(result)))
        return [csv_path, save_figure(corpus_routes_figure(result), output_path(directory, PNG_FILE))]
    write_text(csv_path, frame_csv(routes_frame(result)))
    image = save_figure(route_figure(result), output_path(directory, PNG_FILE))
    page = output_path(directory, HTML_FILE)
    write_text(page, route_page(result))
    return [csv_path, image, page]
