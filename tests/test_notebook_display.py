"""The notebook machinery every result shares: the fragment, shown tables, CSV text, errors."""

from __future__ import annotations

from dataclasses import dataclass

import pandas
import pytest

from resstream.display import Displayable
from resstream.reporting.figures import new_figure
from resstream.reporting.notebook import (
    SHOWN_ROWS,
    NotebookView,
    Picture,
    frame_csv,
    frame_html,
    frame_table,
    long_frame,
    register_result,
)
from tests.notebook_support import assert_displays, assert_frame_columns, fetched


@dataclass(frozen=True)
class Toy(Displayable, renderer="resstream.reporting.notebook"):
    """A result with two rows and one figure."""

    values: tuple[float, ...]


@dataclass(frozen=True)
class Unregistered(Displayable):
    """A result nobody registered."""


def _toy_frame(toy: Toy) -> pandas.DataFrame:
    return long_frame(["index", "value"], [[i, v] for i, v in enumerate(toy.values)])


def _toy_view(toy: Toy) -> NotebookView:
    fig = new_figure(2, 2)
    fig.add_subplot().plot(toy.values)
    table = frame_table("toy <table>", toy.to_pandas())
    return NotebookView(tables=[table], pictures=[Picture(fig, "a & b")])


register_result(Toy, _toy_frame, _toy_view)


def test_the_fragment_holds_summary_tables_and_an_embedded_figure() -> None:
    fragment = assert_displays(Toy((0.5, 1.5)), ["index", "value", "toy &lt;table&gt;", "a &amp; b"])
    assert fragment.startswith("<div class='resstream-result'>")
    assert "data:image/png;base64," in fragment
    assert "<pre class='resstream-summary'>Toy(values=(0.5, 1.5))</pre>" in fragment


def test_the_frame_is_the_registered_one() -> None:
    frame = assert_frame_columns(Toy((0.5, 1.5)), ["index", "value"])
    assert frame["value"].tolist() == [0.5, 1.5]


def test_an_unregistered_result_says_so() -> None:
    with pytest.raises(TypeError, match="Unregistered has no DataFrame registered"):
        Unregistered().to_pandas()
    with pytest.raises(TypeError, match="Unregistered has no notebook view registered"):
        Unregistered()._repr_html_()


def test_a_long_frame_shows_its_ends_and_counts_its_rows() -> None:
    frame = long_frame(["i"], [[i] for i in range(SHOWN_ROWS + 5)])
    shown = frame_html(frame)
    assert f"{SHOWN_ROWS + 5:,} rows" in shown
    assert "<td>0</td>" in shown and f"<td>{SHOWN_ROWS + 4}</td>" in shown
    assert "rows;" not in frame_html(frame.head(SHOWN_ROWS))


def test_missing_values_are_blank_in_a_shown_table() -> None:
    frame = pandas.DataFrame({"a": pandas.array([1, None], dtype="Int64"), "b": [0.25, None]})
    shown = frame_html(frame)
    assert "<NA>" not in shown and "NaN" not in shown and "<td>1</td>" in shown


def test_csv_text_keeps_every_digit_and_leaves_missing_values_empty() -> None:
    frame = long_frame(["x", "y"], [[0.1 + 0.2, None], [1 / 3, 2]])
    assert frame_csv(frame) == "x,y\n0.30000000000000004,\n0.3333333333333333,2.0\n"


def test_an_empty_frame_keeps_its_columns() -> None:
    assert list(long_frame(["a", "b"], []).columns) == ["a", "b"]


def test_the_fetch_check_finds_every_kind_of_outside_link() -> None:
    inline = "<img src='data:image/png;base64,AA'><a href='#top'>x</a>"
    inline += "<style>a{background:url(data:x)}</style>"
    assert fetched(inline) == []
    for outside in (
        "<img src='https://host/x.png'>",
        "<img src=//host/x.png>",
        '<img src="figure.png">',
        "<style>a{background:url('x.png')}</style>",
        "<style>@import 'x.css';</style>",
        "<link href=style.css>",
    ):
        assert fetched(outside), outside


def test_a_long_frame_types_the_columns_it_is_told_and_ignores_absent_names() -> None:
    frame = long_frame(["n", "x"], [[3, None], [None, None]], integers=("n", "absent"), floats=("x",))
    assert str(frame["n"].dtype) == "Int64" and frame["n"].tolist()[0] == 3 and frame["n"].isna().tolist()[1]
    assert frame["x"].dtype == "float64" and frame["x"].isna().all()
