"""Render a tuned lens's evaluation (`LensEvaluation`) and training curve: CSV and plots.

`plot_bits_per_layer` draws what the tuned-lens paper's "bits per layer" figure draws: per layer,
the KL divergence (bits) from the model's final distribution of the logit lens and of the tuned
lens on held-out text, and beside it their cross-entropy against the next token.

The same numbers as a long-format frame (`evaluation_frame`, the evaluation's `to_pandas()`;
evaluation.csv is its CSV) and, in a notebook, the evaluation's view (`evaluation_view`): its
values per layer and the bits-per-layer figure, with the training curve where there is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from resstream.analysis.decoding.lens_training import EVALUATION_COLUMNS, LensEvaluation
from resstream.reporting.figures import integer_ticks, new_figure, save_figure
from resstream.reporting.notebook import (
    NotebookView,
    Picture,
    frame_csv,
    frame_table,
    long_frame,
    register_result,
)

if TYPE_CHECKING:
    import pandas

#: Log-axis tick labels as plain numbers rather than powers of ten.
PLAIN = FuncFormatter(lambda value, _: f"{value:g}")

#: The lenses and metrics of the evaluation frame, in the order of its rows at each layer.
LENSES = ("logit", "tuned")
METRICS = ("kl_bits", "ce_bits")


def evaluation_frame(evaluation: LensEvaluation) -> pandas.DataFrame:
    """`evaluation` as a long-format frame (`EVALUATION_COLUMNS`, documented by
    `LensEvaluation`): per layer, one row per metric and lens."""
    ev = evaluation
    series = {
        ("kl_bits", "logit"): ev.logit_kl,
        ("kl_bits", "tuned"): ev.tuned_kl,
        ("ce_bits", "logit"): ev.logit_ce,
        ("ce_bits", "tuned"): ev.tuned_ce,
    }
    rows = [
        (ev.model, layer, lens, metric, series[metric, lens][index])
        for index, layer in enumerate(ev.layers)
        for metric in METRICS
        for lens in LENSES
    ]
    return long_frame(EVALUATION_COLUMNS, rows)


def evaluation_csv(evaluation: LensEvaluation) -> str:
    """evaluation.csv: the CSV of `evaluation_frame(evaluation)`."""
    return frame_csv(evaluation_frame(evaluation))


def layer_values(evaluation: LensEvaluation) -> pandas.DataFrame:
    """The evaluation frame with one row per layer and one column per metric and lens
    ("kl_bits (logit)", ...)."""
    frame = evaluation_frame(evaluation)
    wide = frame.pivot(index="layer", columns=["metric", "lens"], values="value")
    wide = wide.reindex(columns=[(metric, lens) for metric in METRICS for lens in LENSES])
    wide.columns = [f"{metric} ({lens})" for metric, lens in wide.columns]
    return wide.reset_index()


def evaluation_view(evaluation: LensEvaluation, history: Sequence[float] = ()) -> NotebookView:
    """What an evaluation shows in a notebook: its values per layer, bits_per_layer.png and,
    given a training curve (`history`), training.png."""
    title = "per layer, held out: KL to the final distribution and cross-entropy, bits"
    pictures = [Picture(bits_per_layer_figure(evaluation), "bits per layer (bits_per_layer.png)")]
    if history:
        pictures.append(Picture(training_figure(history, evaluation.model), "training curve (training.png)"))
    return NotebookView(tables=[frame_table(title, layer_values(evaluation), shown=60)], pictures=pictures)


register_result(LensEvaluation, evaluation_frame, evaluation_view)


def plot_bits_per_layer(evaluation: LensEvaluation, path: str | Path) -> Path:
    """KL to the final distribution and cross-entropy against the next token, per layer, of
    the logit lens and the tuned lens (held-out positions), on log axes (the KL is 0 at layer
    L, where both lenses are the model, so that panel stops at L−1)."""
    return save_figure(bits_per_layer_figure(evaluation), path)


def bits_per_layer_figure(evaluation: LensEvaluation) -> Figure:
    """The figure of `plot_bits_per_layer`, unsaved."""
    ev = evaluation
    fig = new_figure(10.0, 4.0)
    inner = len(ev.layers) - 1
    panels = (
        ("KL(final ‖ lens), bits", ev.layers[:inner], ev.logit_kl[:inner], ev.tuned_kl[:inner]),
        ("cross-entropy vs the next token, bits", ev.layers, ev.logit_ce, ev.tuned_ce),
    )
    for index, (label, layers, logit, tuned) in enumerate(panels, start=1):
        ax = fig.add_subplot(1, 2, index)
        ax.plot(layers, logit, "o-", color="tab:orange", label="logit lens")
        ax.plot(layers, tuned, "s-", color="tab:blue", label="tuned lens")
        ax.set_xlabel("layer (0 = embedding, L = the model's output)")
        ax.set_ylabel(label)
        integer_ticks(ax.xaxis)
        ax.set_yscale("log")
        low, high = min(*logit, *tuned), max(*logit, *tuned)
        subs = (1.0, 2.0, 5.0) if high > 10 * low else tuple(float(k) for k in range(1, 10))
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
        ax.yaxis.set_major_formatter(PLAIN)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{ev.model}: bits per layer on {ev.num_tokens:,} held-out positions "
        "(log axes; the KL is 0 at layer L, where both lenses are the model)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def plot_training(history: Sequence[float], model: str, path: str | Path) -> Path:
    """The training loss (mean KL over layers 0..L−1, bits) against the optimiser step."""
    return save_figure(training_figure(history, model), path)


def training_figure(history: Sequence[float], model: str) -> Figure:
    """The figure of `plot_training`, unsaved."""
    fig = new_figure(6.4, 3.6)
    ax = fig.add_subplot()
    ax.plot(range(1, len(history) + 1), history, color="tab:blue")
    ax.set_xlabel("optimiser step")
    integer_ticks(ax.xaxis)
    ax.set_ylabel("training KL, bits (mean over layers)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{model}: tuned-lens training", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
