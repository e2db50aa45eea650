"""Render a tuned lens's evaluation (`LensEvaluation`) and training curve: CSV and plots.

`plot_bits_per_layer` draws what the tuned-lens paper's "bits per layer" figure draws: per layer,
the KL divergence (bits) from the model's final distribution of the logit lens and of the tuned
lens on held-out text, and beside it their cross-entropy against the next token.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from resstream.analysis.decoding.lens_training import LensEvaluation
from resstream.reporting.csvs import csv_text
from resstream.reporting.figures import integer_ticks, new_figure, save_figure

#: Log-axis tick labels as plain numbers rather than powers of ten.
PLAIN = FuncFormatter(lambda value, _: f"{value:g}")

CSV_COLUMNS = (
    "layer",
    "logit_lens_kl_bits",
    "tuned_lens_kl_bits",
    "logit_lens_ce_bits",
    "tuned_lens_ce_bits",
)


def evaluation_csv(evaluation: LensEvaluation) -> str:
    """One row per layer 0..L."""
    ev = evaluation
    return csv_text(
        CSV_COLUMNS, zip(ev.layers, ev.logit_kl, ev.tuned_kl, ev.logit_ce, ev.tuned_ce, strict=True)
    )


def plot_bits_per_layer(evaluation: LensEvaluation, path: str | Path) -> Path:
    """KL to the final distribution and cross-entropy against the next token, per layer, of
    the logit lens and the tuned lens (held-out positions), on log axes (the KL is 0 at layer
    L, where both lenses are the model, so that panel stops at L−1)."""
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
    return save_figure(fig, path)


def plot_training(history: Sequence[float], model: str, path: str | Path) -> Path:
    """The training loss (mean KL over layers 0..L−1, bits) against the optimiser step."""
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
    return save_figure(fig, path)
