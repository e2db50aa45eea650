"""`attribute`'s results in a notebook: `to_pandas()` (`attribute_frame`,
`corpus_attribution_frame`) and the view `_repr_html_()` shows — the tables and figures of
attribute.html, by the page's own renderers: the ranking line (`ranking_html`); for one text
the prediction, then the check, any notes, every CSV's table with its caption, and every
figure (`attribute_figures`) with its caption; for a corpus the check, notes, tables and
figures."""

from __future__ import annotations

from resstream.analysis.attribution.results import AttributeResult, CorpusAttribution
from resstream.reporting.attribute.common import Result
from resstream.reporting.attribute.frames import attribute_frame, corpus_attribution_frame
from resstream.reporting.attribute.page import (
    captions_of,
    check_html,
    notes_html,
    prediction_html,
    ranking_html,
    table_html,
)
from resstream.reporting.attribute.plots import attribute_figures
from resstream.reporting.attribute.tables import attribute_tables
from resstream.reporting.notebook import NotebookView, Picture, Table, register_result

__all__ = ["attribute_view"]


def _summary_tables(result: Result) -> list[Table]:
    """The tables above the page's figures: the ranking, the prediction (one text), the check,
    the notes."""
    tables = [Table("ranking", ranking_html(result))]
    if isinstance(result, AttributeResult):
        tables.append(Table("prediction", prediction_html(result)))
    tables.append(Table("check", check_html(result.check)))
    if result.notes:
        tables.append(Table("notes", notes_html(result.notes)))
    return tables


def attribute_view(result: Result) -> NotebookView:
    """What `result` shows in a notebook: the prediction (one text), the check and notes,
    every CSV's table as attribute.html shows it, and every figure with its caption."""
    captions = captions_of(result)
    tables = _summary_tables(result) + [
        Table(f"{table.name}.csv", table_html(table, captions.get(table.name, "")))
        for table in attribute_tables(result)
    ]
    pictures = [
        Picture(draw(), f"{name}: {captions.get(name, '')}") for name, draw in attribute_figures(result)
    ]
    return NotebookView(tables=tables, pictures=pictures)


register_result(AttributeResult, attribute_frame, attribute_view)
register_result(CorpusAttribution, corpus_attribution_frame, attribute_view)
