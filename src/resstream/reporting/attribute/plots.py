"""Which figures a result gets, saved as PNGs: one text gets layers, heads, trajectory,
linearity (with a linearity check) and neurons (when it lists any); a corpus gets layers,
heads and neurons."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from matplotlib.figure import Figure

from resstream.analysis.attribution.results import AttributeResult, CorpusAttribution
from resstream.reporting.attribute.common import Directory, Result, output_path
from resstream.reporting.attribute.heads import heads_figure
from resstream.reporting.attribute.layers import layers_figure
from resstream.reporting.attribute.linearity import linearity_figure
from resstream.reporting.attribute.neurons import neurons_figure
from resstream.reporting.attribute.trajectory import trajectory_figure
from resstream.reporting.figures import save_figure

__all__ = ["Drawing", "attribute_figures", "plot_attribute"]

#: A figure's file name and how to draw it.
Drawing = tuple[str, Callable[[], Figure]]


def _corpus_figures(result: CorpusAttribution) -> list[Drawing]:
    return [
        ("layers.png", lambda: layers_figure(result)),
        ("heads.png", lambda: heads_figure(result)),
        ("neurons.png", lambda: neurons_figure(result)),
    ]


def _single_figures(result: AttributeResult) -> list[Drawing]:
    figures: list[Drawing] = [
        ("layers.png", lambda: layers_figure(result)),
        ("heads.png", lambda: heads_figure(result)),
        ("trajectory.png", lambda: trajectory_figure(result)),
    ]
    if result.linearity is not None:
        figures.append(("linearity.png", lambda: linearity_figure(result)))
    if result.neurons:
        figures.append(("neurons.png", lambda: neurons_figure(result)))
    return figures


def attribute_figures(result: Result) -> list[Drawing]:
    """Every figure of `result` as (PNG file name, how to draw it), in the order of the page.
    One text: layers, heads, trajectory, linearity (with a check) and neurons (when it lists
    any); a corpus: layers, heads, neurons."""
    return _corpus_figures(result) if isinstance(result, CorpusAttribution) else _single_figures(result)


def plot_attribute(result: Result, directory: Directory) -> list[Path]:
    """Every figure of `result` (`attribute_figures`) as a PNG in `directory`; returns the
    paths written."""
    return [save_figure(draw(), output_path(directory, name)) for name, draw in attribute_figures(result)]
