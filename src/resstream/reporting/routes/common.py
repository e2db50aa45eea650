"""What several of `routes`' outputs share: the files' names, how many rows the terminal and
the tables list, the route's counts by kind and the corpus intervals' note."""

from __future__ import annotations

from resstream.analysis.routes.results import CorpusRoutes, RoutesResult

__all__ = [
    "CSV_FILE",
    "HTML_FILE",
    "PNG_FILE",
    "TABLE_SHOWN",
    "TOP_SHOWN",
    "heads_through",
    "interval_note",
    "mlps_through",
]

CSV_FILE, PNG_FILE, HTML_FILE = "routes.csv", "routes.png", "routes.html"

#: Lines the terminal and the tables list.
TOP_SHOWN = 5
TABLE_SHOWN = 12


def heads_through(result: RoutesResult) -> int:
    """How many of the route's edges pass through a head."""
    return sum(1 for edge in result.edges if edge.kind == "head")


def mlps_through(result: RoutesResult) -> int:
    """How many of the route's edges pass through an MLP."""
    return sum(1 for edge in result.edges if edge.kind == "mlp")


def interval_note(result: CorpusRoutes) -> str:
    """What the corpus figure's and lines' intervals are (none for one sequence)."""
    return "95% intervals over sequences" if result.num_seqs > 1 else "no interval: 1 sequence"
