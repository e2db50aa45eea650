"""`attribute`'s tables: every CSV of a result as rows for attribute.html, and the CSVs.

Each table is a frame of `frames` (`attribute_frames`): for one text layers, heads, sources,
neurons (rows of one level of `to_pandas()`), trajectory, query_contributions (one row per
share), linearity (with a linearity check) and tuned_trajectory (with a tuned lens); for a
corpus layers, heads, neurons, one row per metric with its 95% interval. The CSV is
`frame_csv` of the frame and the page's table its rows, so the two cannot drift apart. CSVs
hold raw token text and floats at full precision (Python's shortest exact form); a value that
does not apply is empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resstream.io import write_text
from resstream.reporting.attribute.common import Directory, Result, output_path
from resstream.reporting.attribute.frames import attribute_frames
from resstream.reporting.notebook import frame_csv

if TYPE_CHECKING:
    import pandas

__all__ = ["Table", "attribute_tables", "table_of", "write_attribute_csvs"]


@dataclass(frozen=True)
class Table:
    """One CSV of a result as rows: `name` is the file stem (layers → layers.csv); a cell is
    a Python int, float or str ("" where the frame has no value)."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def _cell(value: Any) -> Any:
    """A frame's value as a Python one: a missing integer or text becomes "", a NumPy number
    a Python one (a float nan stays nan)."""
    import numpy
    import pandas

    if isinstance(value, numpy.generic):
        return value.item()
    if not isinstance(value, float) and pandas.isna(value):
        return ""
    return value


def table_of(name: str, frame: pandas.DataFrame) -> Table:
    """The rows of `frame` as the table `name`."""
    rows = tuple(tuple(_cell(v) for v in row) for row in frame.itertuples(index=False, name=None))
    return Table(name, tuple(str(c) for c in frame.columns), rows)


def attribute_tables(result: Result) -> list[Table]:
    """Every CSV of `result` as a table, in the order of its files (`attribute_frames`)."""
    return [table_of(name, frame) for name, frame in attribute_frames(result)]


def write_attribute_csvs(result: Result, directory: Directory) -> list[Path]:
    """One CSV per frame of `result` (`attribute_frames`), each `frame_csv` of it; returns the
    paths written."""
    paths = []
    for name, frame in attribute_frames(result):
        path = output_path(directory, f"{name}.csv")
        write_text(path, frame_csv(frame))
        paths.append(path)
    return paths
