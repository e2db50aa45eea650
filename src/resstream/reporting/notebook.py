"""Result objects in a notebook: the registries behind `Displayable._repr_html_` and
`Displayable.to_pandas`, and the HTML fragment a notebook shows.

Each result class registers two functions, beside the renderers of its command's files, with
`register_result(Class, frame_function, view_function)`: the long-format DataFrame
(`tidy_frame`; the command's CSV is written from the same frame with `frame_csv`) and the
tables and figures to show (`notebook_view`, made by the command's own table and figure
functions). The class is named in the call: `singledispatch` would otherwise evaluate the
return annotation, and pandas is imported only where a frame is made. A class of the analysis, training or
simulation layers names its registering `resstream.reporting` module in its class statement
(`Displayable`'s `renderer=`); a class of `resstream.api` registers in its own module.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import singledispatch
from typing import TYPE_CHECKING, Any

from resstream.reporting.html import figure_html

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure

#: The rows a frame shown as a table keeps (the first and last half); `to_pandas()` has all.
SHOWN_ROWS = 20


#: The fragment's own style, scoped to its class: figures never wider than the notebook's cell.
_STYLE = ".resstream-result img{max-width:100%;height:auto}"


@dataclass(frozen=True)
class Table:
    """A titled table of a notebook view: HTML made by a table renderer, shown as is."""

    title: str
    html: str


@dataclass(frozen=True)
class Picture:
    """A figure of a notebook view, from the command's figure function, with its caption
    (plain text)."""

    figure: Figure
    caption: str


@dataclass(frozen=True)
class NotebookView:
    """What a result shows below its summary: tables, then figures (either may be empty)."""

    tables: Sequence[Table] = ()
    pictures: Sequence[Picture] = ()


@singledispatch
def notebook_view(result: object) -> NotebookView:
    """The tables and figures `result` shows in a notebook (registered per class)."""
    raise TypeError(f"{type(result).__name__} has no notebook view registered")


@singledispatch
def tidy_frame(result: object) -> pandas.DataFrame:
    """`result` as a long-format DataFrame (registered per class)."""
    raise TypeError(f"{type(result).__name__} has no DataFrame registered")


def register_result(
    cls: type, frame: Callable[[Any], pandas.DataFrame], view: Callable[[Any], NotebookView]
) -> None:
    """Register how instances of `cls` show: `frame` makes their `to_pandas()` (`tidy_frame`),
    `view` the tables and figures of their `_repr_html_()` (`notebook_view`)."""
    tidy_frame.register(cls, frame)
    notebook_view.register(cls, view)


def result_html(result: object) -> str:
    """The notebook fragment of `result`: its plain summary, then its view."""
    view = notebook_view(result)
    parts = [f"<pre class='resstream-summary'>{html.escape(repr(result))}</pre>"]
    parts += [f"<h4>{html.escape(table.title)}</h4>{table.html}" for table in view.tables]
    parts += [_picture_html(picture) for picture in view.pictures]
    return f"<div class='resstream-result'><style>{_STYLE}</style>{''.join(parts)}</div>"


def frame_html(frame: pandas.DataFrame, shown: int = SHOWN_ROWS) -> str:
    """`frame` as an HTML table without its index; a long frame shows its first and last rows
    and says how many there are."""
    shown_frame = _blank_missing_integers(frame)
    table = shown_frame.to_html(index=False, max_rows=shown, border=0, na_rep="", float_format=_number)
    if len(frame) <= shown:
        return table
    return f"{table}<p>{len(frame):,} rows; <code>to_pandas()</code> has them all.</p>"


def frame_table(title: str, frame: pandas.DataFrame, shown: int = SHOWN_ROWS) -> Table:
    """A titled table of `frame` (`frame_html`)."""
    return Table(title, frame_html(frame, shown))


def frame_csv(frame: pandas.DataFrame) -> str:
    """The CSV text a command writes from `frame`: a header line, one line per row, "\\n" line
    ends, floats as Python writes them (the shortest form that reads back exactly), missing
    values empty."""
    return str(frame.to_csv(index=False, lineterminator="\n"))


def long_frame(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    integers: Iterable[str] = (),
    floats: Iterable[str] = (),
) -> pandas.DataFrame:
    """A DataFrame of `rows` with exactly `columns` (also when there are no rows); the columns
    named in `integers` hold nullable integers (a missing count stays missing, a present one
    prints as `3`, not `3.0`) and those in `floats` floats (also when every value is missing).
    Names that are not among `columns` are ignored, so one list can serve several frames."""
    import pandas

    frame = pandas.DataFrame(list(rows), columns=list(columns))
    types = {**dict.fromkeys(integers, "Int64"), **dict.fromkeys(floats, "float64")}
    return frame.astype({name: kind for name, kind in types.items() if name in frame.columns})


def _picture_html(picture: Picture) -> str:
    """The figure as an embedded PNG (the figure is closed after)."""
    from resstream.reporting.figures import figure_png  # matplotlib: only when a figure is drawn

    caption = html.escape(picture.caption)
    return figure_html(figure_png(picture.figure), picture.caption, caption)


def _blank_missing_integers(frame: pandas.DataFrame) -> pandas.DataFrame:
    """`frame` with each nullable-integer column that misses a value as objects, the missing
    ones "" (`to_html` writes pandas.NA as "<NA>" whatever `na_rep` says)."""
    import pandas

    def gaps(column: str) -> bool:
        return pandas.api.types.is_integer_dtype(frame[column].dtype) and bool(frame[column].isna().any())

    blanks = [column for column in frame.columns if gaps(column)]
    if not blanks:
        return frame
    return frame.astype(dict.fromkeys(blanks, object)).fillna(dict.fromkeys(blanks, ""))


def _number(value: float) -> str:
    """Floats in a shown table: four significant digits (the frame keeps every digit)."""
    return f"{value:.4g}"


__all__ = [
    "SHOWN_ROWS",
    "NotebookView",
    "Picture",
    "Table",
    "frame_csv",
    "frame_html",
    "frame_table",
    "long_frame",
    "notebook_view",
    "register_result",
    "result_html",
    "tidy_frame",
]
