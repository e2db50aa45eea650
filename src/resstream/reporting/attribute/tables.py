"""`attribute`'s tables: every list of a result as rows, and one CSV per list.

One text (`AttributeResult`): layers, heads, sources, neurons, trajectory,
query_contributions (one row per share), linearity (with a linearity check) and
tuned_trajectory (with a tuned lens). A corpus (`CorpusAttribution`): layers, heads, neurons,
with value / low / high columns for every 95% interval.

Every table comes from the result's own fields, so the CSVs and the HTML page's tables
(`page`) cannot drift apart from the result types. CSVs hold raw token text and floats at
full precision (Python's shortest exact form).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from resstream.analysis.attribution.results import (
    AttributeResult,
    CorpusAttribution,
    HeadAttribution,
    HeadSummary,
    LayerAttribution,
    LayerSummary,
    NeuronAttribution,
    NeuronSummary,
    SourceAttribution,
    TrajectoryPoint,
)
from resstream.io import write_text
from resstream.reporting.attribute.common import Directory, Result, output_path
from resstream.reporting.csvs import csv_text
from resstream.simulation.intervals import Estimate

__all__ = ["Table", "attribute_tables", "write_attribute_csvs"]

#: The columns of query_contributions.csv: the neuron's, then one share's.
QUERY_COLUMNS = (
    "layer",
    "neuron",
    "projection",
    "preactivation",
    "constant",
    "residual",
    "component",
    "component_layer",
    "kind",
    "share",
)


@dataclass(frozen=True)
class Table:
    """One list of a result as rows: `name` is the file stem (layers → layers.csv)."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def _cells(item: Any, promoted_width: int) -> list[tuple[str, Any]]:
    """A result item's fields as (column, value): an Estimate becomes three columns (name,
    name_low, name_high), `promoted` becomes promoted_1..promoted_<width> (blank when
    shorter), None a blank."""
    cells: list[tuple[str, Any]] = []
    for f in fields(item):
        value = getattr(item, f.name)
        if isinstance(value, Estimate):
            cells += [(f.name, value.value), (f"{f.name}_low", value.low), (f"{f.name}_high", value.high)]
        elif f.name == "promoted":
            padded = list(value) + [""] * (promoted_width - len(value))
            cells += [(f"promoted_{i + 1}", token) for i, token in enumerate(padded)]
        else:
            cells.append((f.name, "" if value is None else value))
    return cells


def _table(name: str, items: Sequence[Any], columns: tuple[str, ...]) -> Table:
    """The table of `items` (dataclasses); `columns` names the header of an empty list."""
    width = max((len(getattr(item, "promoted", ())) for item in items), default=0)
    rows = [_cells(item, width) for item in items]
    header = tuple(column for column, _ in rows[0]) if rows else columns
    return Table(name, header, tuple(tuple(value for _, value in row) for row in rows))


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name != "promoted")


def _query_table(result: AttributeResult) -> Table:
    """query_contributions: one row per share, after its neuron's pre-activation and constant."""
    rows = []
    for query in result.query_contributions:
        head = (
            query.layer,
            query.neuron,
            query.projection,
            query.preactivation,
            query.constant,
            query.residual,
        )
        for share in query.shares:
            layer = "" if share.layer is None else share.layer
            rows.append((*head, share.component, layer, share.kind, share.share))
    return Table("query_contributions", QUERY_COLUMNS, tuple(rows))


def _linearity_table(result: AttributeResult) -> list[Table]:
    check = result.linearity
    if check is None:
        return []
    rows = tuple(zip(check.counts, check.cumulative, check.summed, strict=True))
    return [Table("linearity", ("count", "cumulative", "summed"), rows)]


def _tuned_table(result: AttributeResult) -> list[Table]:
    """The target through a tuned lens at each block boundary, when one was given."""
    if not result.tuned_trajectory:
        return []
    return [_table("tuned_trajectory", result.tuned_trajectory, _field_names(TrajectoryPoint))]


def attribute_tables(result: Result) -> list[Table]:
    """Every list of `result` as a table, in the order of its files: for one text layers,
    heads, sources, neurons, trajectory, query_contributions (and linearity with a check);
    for a corpus layers, heads, neurons."""
    if isinstance(result, CorpusAttribution):
        return [
            _table("layers", result.layers, _field_names(LayerSummary)),
            _table("heads", result.heads, _field_names(HeadSummary)),
            _table("neurons", result.neurons, _field_names(NeuronSummary)),
        ]
    return [
        _table("layers", result.layers, _field_names(LayerAttribution)),
        _table("heads", result.heads, _field_names(HeadAttribution)),
        _table("sources", result.sources, _field_names(SourceAttribution)),
        _table("neurons", result.neurons, _field_names(NeuronAttribution)),
        _table("trajectory", result.trajectory, _field_names(TrajectoryPoint)),
        _query_table(result),
        *_linearity_table(result),
        *_tuned_table(result),
    ]


def write_attribute_csvs(result: Result, directory: Directory) -> list[Path]:
    """One CSV per list of `result` (see `attribute_tables`); returns the paths written.
    Header, then one row per item; floats as Python writes them (shortest exact form)."""
    paths = []
    for table in attribute_tables(result):
        path = output_path(directory, f"{table.name}.csv")
        write_text(path, csv_text(table.columns, table.rows))
        paths.append(path)
    return paths
