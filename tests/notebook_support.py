"""Checks every result object's notebook display and DataFrame pass: `_repr_html_` is a
self-contained fragment with the expected table headers and a figure, and `to_pandas()` has
exactly the documented columns."""

from __future__ import annotations

import re
from collections.abc import Sequence

#: Every src/href attribute and CSS url(...) of a fragment, with its value.
_LINKS = re.compile(r"""\b(?:src|href)\s*=\s*(['"]?)([^'"\s>]*)\1|url\(\s*['"]?([^'")\s]*)""", re.IGNORECASE)


def fetched(fragment: str) -> list[str]:
    """What `fragment` would fetch: every link that is not a data: URI or an in-page anchor,
    and any CSS @import."""
    values = [match.group(2) or match.group(3) or "" for match in _LINKS.finditer(fragment)]
    outside = [value for value in values if not value.startswith(("data:", "#"))]
    return outside + (["@import"] if "@import" in fragment.lower() else [])


def assert_displays(result: object, headers: Sequence[str], *, figure: bool = True) -> str:
    """`result._repr_html_()` names every one of `headers` (escaped as HTML would), holds an
    <img or <svg when `figure`, fetches nothing and starts with the short repr; the HTML."""
    fragment = result._repr_html_()  # type: ignore[attr-defined]
    assert isinstance(fragment, str)
    assert not fetched(fragment), fetched(fragment)
    assert "<script" not in fragment.lower()
    missing = [header for header in headers if header not in fragment]
    assert not missing, f"headers not shown: {missing}"
    if figure:
        assert "<img" in fragment or "<svg" in fragment
    first_line = repr(result).splitlines()[0]
    assert first_line.split("(")[0] in fragment
    return fragment


def assert_frame_columns(result: object, columns: Sequence[str]) -> object:
    """`result.to_pandas()` has exactly `columns`, in order; the frame."""
    frame = result.to_pandas()  # type: ignore[attr-defined]
    assert list(frame.columns) == list(columns)
    return frame
