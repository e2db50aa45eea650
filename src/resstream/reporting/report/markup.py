"""The HTML pieces every section of report.html shares: escaping text from data, counts with
thousands separators, the notation of captions (t_i, t_i+1, W_E, W_U) and the caption itself
(what a figure or table shows, its scale, what it does not show)."""

from __future__ import annotations

import html
from collections.abc import Sequence

__all__ = ["T_IN", "T_NEXT", "W_E", "W_U", "caption_html", "count_text", "escape"]


def escape(text: object) -> str:
    """Text from data, escaped for HTML (quotes included)."""
    return html.escape(str(text), quote=True)


def count_text(value: int) -> str:
    """A count with thousands separators (12,345)."""
    return f"{value:,}"


#: Notation in captions (HTML).
T_IN, T_NEXT = "t<sub>i</sub>", "t<sub>i+1</sub>"
W_E, W_U = "W<sub>E</sub>", "W<sub>U</sub>"


def caption_html(label: str, shows: str, scale: Sequence[str], not_shown: str) -> str:
    """A caption: the label in bold, what it shows, the scale, what it does not show.
    `label` and the `scale` sentences are plain text (escaped here); `shows` and `not_shown`
    are HTML, in which the caller escapes every text from data."""
    scale_text = " ".join(escape(part) for part in scale)
    return (
        f"<strong>{escape(label)}</strong> {shows} <em>Scale:</em> {scale_text} "
        f"<em>Not shown:</em> {not_shown}"
    )
