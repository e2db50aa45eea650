"""Making and saving figures: one way for every plot of resstream.

Figures are built on matplotlib's Agg canvas without pyplot (no GUI backend is touched and
no figure stays registered anywhere). `save_figure` lays the figure out, writes a PNG
atomically (an interrupted run never leaves half an image) and then closes (clears) it.
`figure_token` is how every figure writes a token: whitespace visible, "$" literal, and each
character the plot font has no glyph for (Katakana, CJK, most emoji in DejaVu) as its escape
("\\u30a2"), so matplotlib neither warns nor draws a box.
"""

from __future__ import annotations

import functools
import io
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties, findfont
from matplotlib.ft2font import FT2Font
from matplotlib.ticker import MaxNLocator

from resstream.io import atomic_path
from resstream.reporting.text import show_token

DPI = 120

#: Characters a file stem keeps; every run of others becomes one "_".
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")

#: Longest stem kept (the end of a long path, which names the model most specifically).
_STEM_LENGTH = 60

#: The input token and the next token as matplotlib mathtext (a real subscript, not "t_i+1").
INPUT_TOKEN = r"$t_i$"
NEXT_TOKEN = r"$t_{i+1}$"


def new_figure(width: float = 6.4, height: float = 4.2) -> Figure:
    """A figure attached to an Agg canvas."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _render(fig: Figure, target: str | os.PathLike[str] | BinaryIO) -> None:
    """Draw `fig` as PNG into `target` (a path or a binary file), then close (clear) it."""
    try:
        fig.savefig(target, format="png", dpi=DPI, bbox_inches="tight")
    finally:
        fig.clear()


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write `fig` as PNG to `path` atomically, then close (clear) it; return the path."""
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            _render(fig, tmp)
    finally:
        fig.clear()
    return path


def figure_png(fig: Figure) -> bytes:
    """`fig` as the bytes of the PNG `save_figure` would write, then close (clear) it; for
    pages that embed their figures."""
    buffer = io.BytesIO()
    _render(fig, buffer)
    return buffer.getvalue()


@functools.cache
def _glyphs(family: str) -> frozenset[int]:
    """The code points the font matplotlib picks for `family` ("sans-serif", "monospace") has a
    glyph for. Only that first font is read: a fallback font can only add glyphs, so a
    character found here is always drawn without a warning."""
    return frozenset(FT2Font(findfont(FontProperties(family=[family]))).get_charmap())


def drawable(text: str, *, monospace: bool = False) -> str:
    """`text` with every character the plot font cannot draw replaced by its Python escape
    ("ア" → "\\u30a2", "😀" → "\\U0001f600"); `monospace` for text drawn in the monospace font."""
    glyphs = _glyphs("monospace" if monospace else "sans-serif")
    return "".join(
        ch if ord(ch) in glyphs or ch.isspace() else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


def figure_token(text: str, *, limit: int | None = None, monospace: bool = False) -> str:
    """A token as every figure writes it: whitespace visible (`show_token`: "␣the"), cut to
    `limit` characters with "…", characters the font lacks escaped (`drawable`) and "$" made
    literal (matplotlib would read "$...$" as mathtext)."""
    shown = show_token(text)
    if limit is not None and len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return drawable(shown, monospace=monospace).replace("$", r"\$")


def integer_ticks(axis: Axis, *, at_most: int | None = None) -> None:
    """Ticks on whole numbers only (layers, positions, steps): a shallow model's layer axis
    gets 0, 1, 2 instead of 0.25, 0.50, ...; `at_most` caps how many (for a narrow panel)."""
    axis.set_major_locator(MaxNLocator(nbins=at_most or "auto", integer=True))


def model_file_stem(name: str) -> str:
    """A filesystem-safe stem for a model's files, from the last two parts of its name or path:
    "reference" → "reference", "runs/tiny" and "/srv/runs/tiny/" → "runs_tiny",
    "EleutherAI/pythia-70m" → "EleutherAI_pythia-70m". Every run of characters other than
    letters, digits, "." and "-" becomes "_"; leading and trailing "_" and "." are dropped; a
    long stem keeps its last 60 characters; nothing left gives "model"."""
    parts = [part for part in re.split(r"[\\/]+", name) if part not in ("", ".", "..")]
    stem = _UNSAFE.sub("_", "_".join(parts[-2:])).strip("_.")
    return stem[-_STEM_LENGTH:].strip("_.") or "model"


def model_file_stems(names: Sequence[str]) -> list[str]:
    """`model_file_stem` of each name, made unique (also on case-insensitive filesystems): a
    stem seen before gets "_2", "_3", ... in the order of `names`."""
    stems: list[str] = []
    taken: set[str] = set()
    for name in names:
        stem = base = model_file_stem(name)
        number = 1
        while stem.lower() in taken:
            number += 1
            stem = f"{base}_{number}"
        taken.add(stem.lower())
        stems.append(stem)
    return stems
