"""neurons.png: the listed neurons (the largest |DLA|, or |C| for a result ranked by C) as
horizontal bars of the leading score (left panel) and of the other one (right panel; red
raises the target, blue lowers it; a corpus's means with their 95% intervals), labelled
L<layer>.N<neuron> with their coefficient m, and beside each row the tokens its value vector
promotes most."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from resstream.analysis.attribution.results import (
    SCORE_NAMES,
    CorpusAttribution,
    NeuronAttribution,
    NeuronSummary,
    RankBy,
    other_ranking,
    ranked_score,
)
from resstream.reporting.attribute.common import Result, score_value
from resstream.reporting.attribute.drawing import (
    figure_title,
    rankings,
    score_error,
    score_label,
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
        return f"{neuron.name} (mean m {neuron.mean_coefficient:.2g})"
    return f"{neuron.name} (m {neuron.coefficient:.2g})"


def _bars(
    ax: Axes, result: Result, neurons: Sequence[NeuronAttribution | NeuronSummary], rank: RankBy
) -> None:
    """One panel: every neuron's score `rank` as a horizontal bar, the first at the top."""
    scores = [ranked_score(n, rank) for n in neurons]
    values = [score_value(score) for score in scores]
    errors = np.array([score_error(score) for score in scores], dtype=float).reshape(-1, 2).T
    drawn = errors if _has_intervals(result) and np.isfinite(errors).any() else None
    colours = [POSITIVE_COLOUR if v >= 0 else NEGATIVE_COLOUR for v in values]
    y = np.arange(len(neurons))
    ax.barh(y, values, color=colours, xerr=drawn, capsize=2 if drawn is not None else 0)
    ax.set_ylim(len(neurons) - 0.5, -0.5)
    zero_line(ax, vertical=True)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel(score_label(result, rank), fontsize=8)


def neurons_figure(result: Result) -> Figure:
    """The listed neurons (at most NEURONS_SHOWN, in the result's order: the largest |DLA| at
    the top, or |C| for a result ranked by C) as horizontal bars of the leading score (left)
    and of the other one (right), red raising the target and blue lowering it, labelled
    L<layer>.N<neuron> with the coefficient m; the tokens each one's value vector promotes
    most are written beside the row."""
    neurons: Sequence[NeuronAttribution | NeuronSummary] = result.neurons[:NEURONS_SHOWN]
    fig = new_figure(10.4, max(2.6, 1.6 + 0.32 * len(neurons)))
    fig.set_layout_engine("constrained")
    lead, beside = fig.subplots(1, 2, sharey=True)
    for ax, rank in zip((lead, beside), rankings(result), strict=True):
        _bars(ax, result, neurons, rank)
    lead.set_yticks(
        np.arange(len(neurons)), [_neuron_label(n) for n in neurons], fontsize=8, family="monospace"
    )
    lead.set_title(f"ranked by {SCORE_NAMES[result.rank_by]}", fontsize=8.5)
    beside.set_title(f"{SCORE_NAMES[other_ranking(result.rank_by)]} beside it", fontsize=8.5)
    side = blended_transform_factory(beside.transAxes, beside.transData)
    beside.text(1.04, -0.9, "promoted tokens", transform=side, fontsize=8, weight="bold", va="bottom")
    for row, neuron in enumerate(neurons):
        tokens = " ".join(token_label(t, monospace=True) for t in neuron.promoted[:PROMOTED_SHOWN])
        beside.text(1.04, row, tokens, transform=side, fontsize=7.5, va="center", family="monospace")
    if not neurons:
        lead.text(0.5, 0.5, "no neurons", transform=lead.transAxes, ha="center")
    other = other_ranking(result.rank_by)
    if neurons and all(np.isnan(score_value(ranked_score(n, other))) for n in neurons):
        beside.text(
            0.5,
            0.5,
            f"{SCORE_NAMES[other]} not computed (DLA only)",
            transform=beside.transAxes,
            ha="center",
            va="center",
            fontsize=9,
            color="0.35",
        )
        beside.set_xticks([])
    fig.suptitle(f"{figure_title(result)}\n{selection_line(result, len(neurons))}", fontsize=9)
    fig.supxlabel(coefficient_note(result), fontsize=7.5, color="0.3")
    return fig


def selection_line(result: Result, shown: int) -> str:
    """Which neurons the bars are: the `shown` ones with the largest |DLA| (|C| for a result
    ranked by C), out of what."""
    plural = "s" if shown != 1 else ""
    score = SCORE_NAMES[result.rank_by]
    if isinstance(result, CorpusAttribution):
        among = "of all neurons" if result.rank_by == "dla" else "of those scored exactly"
        chosen = f"the {shown} neuron{plural} with the largest |mean {score}| {among}"
    else:
        chosen = f"the {shown} neuron{plural} with the largest |{score}| of all neurons in every layer"
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
