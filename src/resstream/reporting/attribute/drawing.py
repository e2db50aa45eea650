"""What every `attribute` figure shares: its title (model and target, or dataset and
sequences), token labels (`resstream.reporting.figures.figure_token`: visible whitespace,
literal "$", characters the font lacks escaped), the DLA
axis label, a corpus mean's error bar, the zero line and the sizes and labels several
figures use. Draws no figure of its own."""

from __future__ import annotations

from matplotlib.axes import Axes

from resstream.analysis.attribution.results import AttributeResult, CorpusAttribution, RankBy, other_ranking
from resstream.reporting.attribute.common import Result
from resstream.reporting.figures import figure_token
from resstream.reporting.text import probability_text
from resstream.simulation.intervals import Estimate

__all__ = [
    "C_LABEL",
    "MAX_WIDTH",
    "TOKEN_CHARACTERS",
    "dla_label",
    "figure_title",
    "literal",
    "mean_prefix",
    "rankings",
    "score_error",
    "score_label",
    "token_label",
    "zero_line",
]

TOKEN_CHARACTERS = 14  # a token in a figure is cut to this many characters
MAX_WIDTH = 14.0  # inches: a deep model's bars and points get narrower, not the figure wider
C_LABEL = "C: additive log-probability share (nats)"


def literal(text: str) -> str:
    """Text for a figure with every "$" literal (matplotlib reads $...$ as mathtext)."""
    return text.replace("$", r"\$")


def token_label(text: str, *, monospace: bool = False) -> str:
    """A token for a figure (`figure_token`), quoted and cut to TOKEN_CHARACTERS; `monospace`
    when it is drawn in the monospace font."""
    return "‘" + figure_token(text, limit=TOKEN_CHARACTERS, monospace=monospace) + "’"


def score_error(score: float | Estimate) -> tuple[float, float]:
    """The distances from a mean down to its interval's low end and up to its high end (nan
    when there is no interval); 0 for a plain number."""
    if not isinstance(score, Estimate):
        return (0.0, 0.0)
    return (score.value - score.low, score.high - score.value)


def mean_prefix(result: Result) -> str:
    """ "mean " before an axis label of a corpus result (its scores are means), else ""."""
    return "mean " if isinstance(result, CorpusAttribution) else ""


def figure_title(result: Result) -> str:
    """The figures' title: model and target token and position, or dataset and sequences."""
    if isinstance(result, CorpusAttribution):
        sequences = f"{result.num_seqs} sequence{'s' if result.num_seqs != 1 else ''}"
        title = (
            f"{result.model} on {result.dataset}: {sequences} × {result.seq_len} tokens "
            f"({result.positions:,} positions, each one's next token the target)"
        )
        if result.num_seqs < 2:
            title += "\nno interval: 1 sequence"
        else:
            title += "\nmeans over sequences with 95% intervals"
        return literal(title)
    after = token_label(result.tokens[result.position]) if 0 <= result.position < len(result.tokens) else ""
    title = (
        f"{literal(result.model)}: target {token_label(result.target)} after position {result.position} "
        f"{after} (p {probability_text(result.probability)}, rank {result.rank})"
    )
    if result.foil is not None:
        title += f", foil {token_label(result.foil)}"
    return title


def dla_label(result: Result) -> str:
    """The DLA axis label: the target's logit, or the logit difference with a foil."""
    if isinstance(result, AttributeResult) and result.foil is not None:
        return "DLA (logit difference target − foil)"
    return "DLA (logit of the target)"


def rankings(result: Result) -> tuple[RankBy, RankBy]:
    """The leading score and the one beside it: ("dla", "c") by default, ("c", "dla") for a
    result ranked by C. Figures draw the leading one first (top, left)."""
    return result.rank_by, other_ranking(result.rank_by)


def score_label(result: Result, rank: RankBy) -> str:
    """The axis label of score `rank` ("dla" or "c"), "mean " before it for a corpus."""
    return mean_prefix(result) + (C_LABEL if rank == "c" else dla_label(result))


def zero_line(ax: Axes, *, vertical: bool = False) -> None:
    """A thin black line at 0 (across the axes, or up them with `vertical`)."""
    if vertical:
        ax.axvline(0, color="black", linewidth=0.8)
    else:
        ax.axhline(0, color="black", linewidth=0.8)
