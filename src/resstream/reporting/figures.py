"""Making and saving figures: one way for every plot of resstream.

Figures are built on matplotlib's Agg canvas without pyplot (no GUI backend is touched and
no figure stays registered anywhere). `save_figure` lays the figure out, writes a PNG
atomically (an interrupted run never leaves half an image) and then closes (clears) it.
"""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from resstream.io import atomic_path

DPI = 120

#: The input token and the next token as matplotlib mathtext (a real subscript, not "t_i+1").
INPUT_TOKEN = r"$t_i$"
NEXT_TOKEN = r"$t_{i+1}$"


def new_figure(width: float = 6.4, height: float = 4.2) -> Figure:
    """A figure attached to an Agg canvas."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write `fig` as PNG to `path` atomically, then close (clear) it; return the path."""
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    finally:
        fig.clear()
    return path


def integer_ticks(axis: Axis) -> None:
    """Ticks on whole numbers only (layers, positions, steps): a shallow model's layer axis
    gets 0, 1, 2 instead of 0.25, 0.50, ..."""
    axis.set_major_locator(MaxNLocator(integer=True))
