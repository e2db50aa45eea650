"""Every file of one `attribute` result at once: the CSVs, then the PNGs, then attribute.html,
which embeds the PNGs just written."""

from __future__ import annotations

from pathlib import Path

from resstream.reporting.attribute.common import Directory, Result
from resstream.reporting.attribute.page import write_attribute_html
from resstream.reporting.attribute.plots import plot_attribute
from resstream.reporting.attribute.tables import write_attribute_csvs

__all__ = ["write_attribute_report"]


def write_attribute_report(result: Result, directory: Directory) -> list[Path]:
    """Every file of `result` in `directory`: the CSVs, the PNGs and attribute.html (which
    embeds the PNGs just written); returns the paths written."""
    tables = write_attribute_csvs(result, directory)
    images = plot_attribute(result, directory)
    return [*tables, *images, write_attribute_html(result, directory, images)]
