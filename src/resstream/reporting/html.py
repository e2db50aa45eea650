"""The pieces every self-contained HTML page of resstream shares (`attribute.html`,
`report.html`): figures embedded as data: URIs, so a page loads nothing from anywhere."""

from __future__ import annotations

import base64
import html
from pathlib import Path


def png_data_uri(png: bytes) -> str:
    """The PNG bytes as a data: URI an <img> can show without fetching anything."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def figure_html(png: bytes, alt: str, caption: str) -> str:
    """A <figure> with the PNG embedded and `caption` below it; `alt` is plain text (escaped
    here), `caption` is HTML (its caller escapes the data it holds)."""
    return (
        f"<figure><img alt='{html.escape(alt, quote=True)}' src='{png_data_uri(png)}'>"
        f"<figcaption>{caption}</figcaption></figure>"
    )


def file_figure_html(path: str | Path, caption: str) -> str:
    """The PNG a command wrote at `path`, embedded, with its file name (bold) and `caption`
    (plain text, escaped here) below it."""
    path = Path(path)
    text = f"<strong>{html.escape(path.name)}</strong>: {html.escape(caption)}"
    return figure_html(path.read_bytes(), path.name, text)
