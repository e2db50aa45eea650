"""linearity.png (one text with a linearity check): is C additive? Against n, the number of a
layer's top neurons by C taken together, C of their summed value vectors and the sum of their
single C, each on its own axis unless the two series span alike."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from resstream.analysis.attribution.results import AttributeResult
from resstream.reporting.attribute.drawing import figure_title
from resstream.reporting.figures import integer_ticks, new_figure

__all__ = ["linearity_figure"]

CUMULATIVE_COLOUR = "#762a83"  # linearity.png: C of the summed vectors (purple)
SUMMED_COLOUR = "#1b7837"  # the sum of single C (green)
SHARED_SCALE = 2.0  # linearity.png puts both series on one scale when they span alike (_one_scale)


def _one_scale(first: Sequence[float], second: Sequence[float]) -> bool:
    """Whether two series span alike (their joint range at most SHARED_SCALE times the
    narrower one's), so that one y scale shows both without flattening either."""
    spans = [max(values) - min(values) for values in (first, second)]
    joint = max(*first, *second) - min(*first, *second)
    return joint <= SHARED_SCALE * min(spans)


def linearity_figure(result: AttributeResult) -> Figure:
    """Against n (the layer's top n neurons by C): C of their summed value vectors (left
    axis) and the sum of their single C (right axis), each axis in its own series' colour.
    The two can differ by orders of magnitude (C of a sum is capped by −log p of the target
    before it, a sum of C is not), so each gets its own scale, unless they span alike: then
    both axes share one, and equal heights are equal values. The cap is drawn on the left
    axis (dotted) when the result carries it."""
    check = result.linearity
    if check is None:
        raise ValueError("the result has no linearity check")
    fig = new_figure(6.4, 4.6)
    fig.set_layout_engine("constrained")
    left = fig.add_subplot()
    right = left.twinx()
    series = (
        (left, check.cumulative, CUMULATIVE_COLOUR, "o-", "C(v_1 + … + v_n): C of the summed vectors"),
        (right, check.summed, SUMMED_COLOUR, "s--", "Σ C(v_i): the sum of the single neurons' C"),
    )
    for ax, values, colour, style, label in series:
        ax.plot(check.counts, values, style, color=colour, markersize=3.5, mfc="none", label=label)
        ax.set_ylabel(label, color=colour)
        ax.tick_params(axis="y", colors=colour)
    if check.ceiling is not None and not _one_scale(check.cumulative, check.summed):
        left.axhline(check.ceiling, color=CUMULATIVE_COLOUR, linestyle=":", linewidth=1)
        left.annotate(
            f"ceiling −log p(target | L_res) = {check.ceiling:.3g}",
            (0.01, check.ceiling),
            xycoords=("axes fraction", "data"),
            va="bottom",
            fontsize=7,
            color=CUMULATIVE_COLOUR,
        )
    shared = _one_scale(check.cumulative, check.summed)
    if shared:
        low, high = zip(left.get_ylim(), right.get_ylim(), strict=True)
        for ax in (left, right):
            ax.set_ylim(min(low), max(high))
    integer_ticks(left.xaxis)
    left.set_xlabel(f"n: the top n neurons of layer {check.layer} by C")
    left.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    scale = "one scale on both axes" if shared else "each axis its own scale"
    fig.suptitle(
        f"{figure_title(result)}\nlayer {check.layer}: the top n neurons together vs. one by one "
        f"(r = {check.correlation:.3f}; {scale})",
        fontsize=8,
    )
    return fig
