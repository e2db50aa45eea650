"""trajectory.png (one text only): the target's probability and rank at every residual point
L_in_0, L_res_0, L_out_0, L_res_1, ..., through the logit lens and, when one was given, a
tuned lens at each block boundary; every other block shaded, the first top-1 point marked."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from resstream.analysis.attribution.results import AttributeResult, TrajectoryPoint
from resstream.reporting.attribute.drawing import MAX_WIDTH, figure_title
from resstream.reporting.figures import new_figure

__all__ = ["trajectory_figure"]

LABELLED_POINTS = 41  # trajectory.png names every point up to this many (20 blocks), else every few


def _point_labels(points: Sequence[TrajectoryPoint]) -> list[str]:
    """Every point's name up to LABELLED_POINTS points; beyond, L_in_0 and the L_out of every
    few blocks (about ten labels), the other ticks left blank."""
    if len(points) <= LABELLED_POINTS:
        return [p.point for p in points]
    step = math.ceil((len(points) // 2) / 10)
    return [
        p.point if p.stage == "in" or (p.stage == "out" and (p.layer + 1) % step == 0) else "" for p in points
    ]


def _shade_blocks(ax: Axes, points: Sequence[TrajectoryPoint]) -> None:
    """Grey behind every other block (from its L_in to its L_out) so the eye groups by layer."""
    starts = [index for index, p in enumerate(points) if p.stage in ("in", "out")]
    for number, (start, stop) in enumerate(itertools.pairwise(starts)):
        if number % 2 == 1:
            ax.axvspan(start, stop, color="#000000", alpha=0.05, linewidth=0)


def trajectory_figure(result: AttributeResult) -> Figure:
    """The target's probability (top) and rank + 1 on a log axis, 1 at the top (bottom) at
    every residual point L_in_0, L_res_0, L_out_0, L_res_1, ...: a rank that climbs while the
    probability stays near 0 is the silent phase, the probability's jump the loud one."""
    points = result.trajectory
    x = np.arange(len(points))
    fig = new_figure(min(MAX_WIDTH, max(6.4, 2.0 + 0.28 * len(points))), 5.6)
    fig.set_layout_engine("constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(x, [p.probability for p in points], "o-", color="tab:green", markersize=4, label="logit lens")
    top.set_ylim(-0.03, 1.03)
    top.set_ylabel("probability of the target")
    ranks = [p.rank + 1 for p in points]
    bottom.plot(x, ranks, "o-", color="tab:purple", markersize=4, label="logit lens")
    tuned = result.tuned_trajectory
    if tuned:
        at = [index for index, p in enumerate(points) if p.stage != "res"]  # the block boundaries
        top.plot(
            at, [p.probability for p in tuned], "s--", color="tab:blue", markersize=4, label="tuned lens"
        )
        bottom.plot(
            at, [p.rank + 1 for p in tuned], "s--", color="tab:blue", markersize=4, label="tuned lens"
        )
        ranks += [p.rank + 1 for p in tuned]
        top.legend(fontsize=8, loc="best")
    bottom.set_yscale("log")
    bottom.set_ylim(max(10.0, 2.0 * max(ranks)), 0.7)  # inverted: climbing towards top-1 goes up
    bottom.axhline(1, color="grey", linestyle=":", linewidth=1)
    bottom.set_ylabel("rank + 1 (log; 1 = top-1)")
    for ax in (top, bottom):
        _shade_blocks(ax, points)
        ax.grid(alpha=0.3)
    first = next((index for index, p in enumerate(points) if p.rank == 0), None)
    if first is not None:
        for ax in (top, bottom):
            ax.axvline(first, color="tab:red", linestyle="--", linewidth=1)
        top.text(first, 0.9, f"top-1 from {points[first].point} ", color="tab:red", fontsize=8, ha="right")
    bottom.set_xticks(x, _point_labels(points), rotation=90, fontsize=7)
    bottom.set_xlabel("residual point (L_in = block input, L_res = after attention, L_out = after MLP)")
    fig.suptitle(figure_title(result), fontsize=9)
    return fig
