"""The one way reporting writes a CSV file's text: a header line, then one line per row."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """CSV text ("\\n" line ends) of `header` and `rows`; floats as Python writes them (the
    shortest form that reads back exactly)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()
