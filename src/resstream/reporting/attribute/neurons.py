"""neurons.png: the neurons with the largest |C| as horizontal bars (red raises the target,
blue lowers it; a corpus's means with their 95% intervals), labelled L<layer>.N<neuron> with
their coefficient m, and beside each bar the tokens its value vector promotes most."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from resstream.analysis.attribution.results import CorpusAttribution, NeuronAttribution, NeuronSummary
from resstream.reporting.attribute.common import Result, score_value
from resstream.reporting.attribute.drawing import (
    C_LABEL,
    figure_title,
    mean_prefix,
    score_error,
    token_label,
    zero_line,
)
from resstream.reporting.figures import new_figure
from resstream.reporting.neurons import COEFFICIENT_NOTE

__all__ = ["coefficient_note", "neurons_figure", "selection_line"]

NEURONS_SHOWN = 30  # bars in neurons.png (the CSV and the page's table have all)
PROMOTED_SHOWN = 5  # promoted tokens beside a neuron's bar
POSITIVE_COLOUR = "#d6604d"  # the red end of RdBu_r: raises the target
NEGATIVE_COLOUR = "#4393c3"  # the blue end: lowers it


def _has_intervals(result: Result) -> bool:
    return isinstance(result, CorpusAttribution) and result.num_seqs >= 2


def _neuron_label(neuron: NeuronAttribution | NeuronSummary) -> str:
    if isinstance(neuron, NeuronSummary):
        return f"L{neuron.layer}.N{neuron.neuron} (mean m {neuron.mean_coefficient:.2g})"
    return f"{neuron.name} (m {neuron.coefficient:.2g})"


def neurons_figure(result: Result) -> Figure:
    """The top neurons (at most NEURONS_SHOWN, the largest |C| at the top) as horizontal bars
    of C, red raising the target and blue lowering it, labelled L<layer>.N<neuron> with the
    coefficient m; the tokens each one's value vector promotes most are written beside it."""
    neurons: Sequence[NeuronAttribution | NeuronSummary] = result.neurons[:NEURONS_SHOWN]
    fig = new_figure(8.4, max(2.6, 1.4 + 0.32 * len(neurons)))
    fig.set_layout_engine("constrained")
    ax = fig.add_subplot()
    values = [score_value(n.contribution) for n in neurons]
    errors = np.array([score_error(n.contribution) for n in neurons], dtype=float).reshape(-1, 2).T
    drawn = errors if _has_intervals(result) and np.isfinite(errors).any() else None
    colours = [POSITIVE_COLOUR if v >= 0 else NEGATIVE_COLOUR for v in values]
    y = np.arange(len(neurons))
    ax.barh(y, values, color=colours, xerr=drawn, capsize=2 if drawn is not None else 0)
    ax.set_yticks(y, [_neuron_label(n) for n in neurons], fontsize=8, family="monospace")
    ax.set_ylim(len(neurons) - 0.5, -0.5)
    zero_line(ax, vertical=True)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel(mean_prefix(result) + C_LABEL)
    beside = blended_transform_factory(ax.transAxes, ax.transData)
    ax.text(1.02, -0.9, "promoted tokens", transform=beside, fontsize=8, weight="bold", va="bottom")
    for row, neuron in enumerate(neurons):
        tokens = " ".join(token_label(t, monospace=True) for t in neuron.promoted[:PROMOTED_SHOWN])
        ax.text(1.02, row, tokens, transform=beside, fontsize=7.5, va="center", family="monospace")
    if not neurons:
        ax.text(0.5, 0.5, "no neurons", transform=ax.transAxes, ha="center")
    fig.suptitle(f"{figure_title(result)}\n{selection_line(result, len(neurons))}", fontsize=9)
    fig.supxlabel(coefficient_note(result), fontsize=7.5, color="0.3")
    return fig


def selection_line(result: Result, shown: int) -> str:
    """Which neurons the bars are: the `shown` ones with the largest |C|, out of what."""
    plural = "s" if shown != 1 else ""
    if isinstance(result, CorpusAttribution):
        chosen = f"the {shown} neuron{plural} with the largest |mean C| of those scored exactly"
    else:
        chosen = f"the {shown} neuron{plural} with the largest |C| of all neurons in every layer"
    listed = len(result.neurons)
    if shown < listed:
        chosen += f" (the first {shown} of the {listed} in neurons.csv)"
    return chosen


def coefficient_note(result: Result) -> str:
    """What the m in the bar labels is (`COEFFICIENT_NOTE`): at the attributed position, or its
    mean over the scored positions of a corpus."""
    if isinstance(result, CorpusAttribution):
        return f"mean m = the mean over the scored positions of {COEFFICIENT_NOTE}"
    return f"m (at the attributed position) = {COEFFICIENT_NOTE}"
