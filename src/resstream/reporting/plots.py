"""Plots of training runs and sweeps: a run's loss curve and gate, a sweep's validation loss
against cut layer and its learned gate over training, and a comparison of sweeps.

The `*_figure` functions return the figure unsaved, so callers and tests can inspect what is
drawn; the `plot_*` functions save it (`resstream.reporting.figures.save_figure`).
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from resstream.reporting.figures import integer_ticks, new_figure, save_figure
from resstream.reporting.tables import make_stat
from resstream.training.records import (
    GATED,
    GateHistory,
    RunRecord,
    SweepResult,
    TrainingCurve,
    gate_history,
    training_curve,
)

if TYPE_CHECKING:
    from resstream.reporting.tables import CompareRow, CompareTable


def gate_matrix(history: GateHistory) -> np.ndarray:
    """The gate distribution as a (layers × steps) array: column j is p at `history.steps[j]`."""
    return np.asarray(history.p, dtype=float).T


# ---------------------------------------------------------------------- val loss vs cut
def _draw_reference(ax: Axes, runs: list[RunRecord], label: str, style: str, color: str) -> None:
    stat = make_stat(r.val_loss for r in runs)
    if stat is None:
        return
    mean, std = stat.mean, stat.std
    spread = f" ± {std:.3f}" if std is not None else ""
    ax.axhline(mean, linestyle=style, color=color, linewidth=1.6, label=f"{label}: {mean:.3f}{spread}")
    if std is not None:
        ax.axhspan(mean - std, mean + std, color=color, alpha=0.08, linewidth=0)


def _cut_layer(run: RunRecord) -> int:
    """The layer a fixed-cut run scaled (every such run records one)."""
    if run.cut_layer is None:
        raise ValueError(f"the fixed-cut run {run.name!r} records no cut layer")
    return int(run.cut_layer)


def _draw_fixed(ax: Axes, result: SweepResult) -> None:
    fixed = [r for r in result.runs if r.gate == "fixed" and np.isfinite(r.val_loss)]
    layers = sorted({_cut_layer(r) for r in fixed})
    seeds = sorted({r.seed for r in fixed})
    for i, seed in enumerate(seeds):
        mine = sorted((r for r in fixed if r.seed == seed), key=_cut_layer)
        ax.plot(
            [_cut_layer(r) for r in mine],
            [r.val_loss for r in mine],
            marker="o",
            linestyle="none" if len(seeds) > 1 else "-",
            color=f"C{i % 10}",
            alpha=0.55 if len(seeds) > 1 else 1.0,
            label=f"fixed cut, seed {seed}",
        )
    if len(seeds) > 1:
        stats = [make_stat(r.val_loss for r in fixed if r.cut_layer == k) for k in layers]
        ax.errorbar(
            layers,
            [stat.mean if stat else np.nan for stat in stats],
            yerr=[(stat.std or 0.0) if stat else 0.0 for stat in stats],
            color="black",
            marker="s",
            capsize=4,
            label=f"fixed cut, mean ± std ({len(seeds)} seeds)",
        )
    integer_ticks(ax.xaxis)


def sweep_val_loss_figure(result: SweepResult) -> Figure:
    """Validation loss (y) against the fixed cut layer (x), baseline dotted, learned gate dashed."""
    fig = new_figure()
    ax = fig.add_subplot()
    _draw_fixed(ax, result)
    _draw_reference(ax, [r for r in result.runs if r.gate == "none"], "baseline (no cut)", ":", "tab:gray")
    _draw_reference(ax, [r for r in result.runs if r.gate == "learned"], "learned gate", "--", "tab:red")
    ax.set_xlim(-0.5, result.n_layer - 0.5)
    ax.set_xlabel(f"cut layer k (identity path scaled by α = {result.alpha:g} at layer k)")
    ax.set_ylabel("validation loss")
    ax.set_title(f"Residual attenuation sweep ({len(result.seeds)} seed{'s' * (len(result.seeds) > 1)})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def plot_sweep_val_loss(result: SweepResult, path: str | os.PathLike[str]) -> Path:
    """Write sweep_val_loss.png."""
    return save_figure(sweep_val_loss_figure(result), path)


# -------------------------------------------------------------------------- gate heatmap
def gate_heatmap_figure(histories: Mapping[int, GateHistory]) -> Figure:
    """One heatmap per seed of the learned p: rows = layers, columns = training steps."""
    shown = {seed: h for seed, h in sorted(histories.items()) if h.steps}
    if not shown:
        raise ValueError("no gate records to plot")
    matrices = {seed: gate_matrix(h) for seed, h in shown.items()}
    low, high = _colour_range(matrices.values())
    fig = new_figure(width=max(6.4, 4.2 * len(shown)), height=3.6)
    axes = fig.subplots(1, len(shown), squeeze=False)[0]
    image: AxesImage | None = None
    for ax, (seed, history) in zip(axes, shown.items(), strict=True):
        image = _draw_heatmap(ax, history, matrices[seed], low, high)
        ax.set_title(f"learned gate p, seed {seed}")
    assert image is not None  # `shown` holds at least one seed (checked above)
    fig.colorbar(image, ax=list(axes), label="gate probability $p_l$")
    return fig


def _colour_range(matrices: Iterable[np.ndarray]) -> tuple[float, float]:
    """The colour scale shared by gate heatmaps: their smallest and largest p, widened to
    ± 0.001 when all p are equal (a gate that has not moved) so the scale is not empty."""
    matrices = list(matrices)
    low = min(float(m.min()) for m in matrices)
    high = max(float(m.max()) for m in matrices)
    if high - low < 1e-9:
        low, high = low - 1e-3, high + 1e-3
    return low, high


def _draw_heatmap(ax: Axes, history: GateHistory, matrix: np.ndarray, low: float, high: float) -> AxesImage:
    steps = history.steps
    width = (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else 1.0
    extent = (steps[0] - width / 2, steps[-1] + width / 2, matrix.shape[0] - 0.5, -0.5)
    image = ax.imshow(
        matrix, aspect="auto", interpolation="nearest", cmap="viridis", vmin=low, vmax=high, extent=extent
    )
    ax.set_yticks(range(matrix.shape[0]))
    integer_ticks(ax.xaxis, at_most=4)  # one panel per seed side by side: room for a few labels
    ax.set_xlabel("training step")
    ax.set_ylabel("layer")
    return image


def plot_gate_heatmap(histories: Mapping[int, GateHistory], path: str | os.PathLike[str]) -> Path:
    """Write learned_gate_heatmap.png."""
    return save_figure(gate_heatmap_figure(histories), path)


# ------------------------------------------------------------------------ one training run
def loss_curve_figure(curve: TrainingCurve, title: str = "training") -> Figure:
    """Training loss (every logged step) and validation loss (each evaluation) against step."""
    fig = new_figure()
    ax = fig.add_subplot()
    if curve.steps:
        ax.plot(curve.steps, curve.loss, color="tab:blue", linewidth=1.2, label="training loss (batch)")
    if curve.val_steps:
        ax.plot(curve.val_steps, curve.val_loss, color="tab:orange", marker="o", label="validation loss")
    integer_ticks(ax.xaxis)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def run_gate_figure(history: GateHistory, gate: str) -> Figure:
    """A gated run's distribution p over layers: over training (heatmap) and at the end (bars)."""
    if not history.steps:
        raise ValueError("no gate records to plot")
    matrix = gate_matrix(history)
    low, high = _colour_range([matrix])
    fig = new_figure(width=9.6, height=3.8)
    over_time, final = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    image = _draw_heatmap(over_time, history, matrix, low, high)
    over_time.set_title(f"{gate} gate p over training")
    fig.colorbar(image, ax=over_time, label="gate probability $p_l$")
    layers = np.arange(matrix.shape[0])
    final.barh(layers, matrix[:, -1], color="tab:red")
    final.axvline(1.0 / len(layers), color="black", linestyle=":")
    final.set_yticks(layers)
    final.invert_yaxis()  # layer 0 on top, as in the heatmap
    final.set_xlabel("$p_l$ (dotted: uniform 1/L)")
    final.set_ylabel("layer")
    final.set_title(f"final p (step {history.steps[-1]})")
    return fig


#: The figures of one run (`run_figures`), by file name: what `resstream train` writes.
RUN_FIGURES = ("loss_curve.png", "gate.png")


def run_figures(curve: TrainingCurve, history: GateHistory | None, gate: str, name: str) -> dict[str, Figure]:
    """A run's figures by file name: loss_curve.png (titled with the run's `name`) and, for a
    learned or router `gate` whose `history` logged its distribution, gate.png."""
    loss_file, gate_file = RUN_FIGURES
    figures = {loss_file: loss_curve_figure(curve, title=f"training {name}")}
    if gate in GATED and history is not None and history.steps:
        figures[gate_file] = run_gate_figure(history, gate)
    return figures


def write_run_figures(run_dir: str | os.PathLike[str], gate: str) -> list[Path]:
    """Write `run_figures` of the run in `run_dir` (read from its metrics.jsonl) into it."""
    run_dir = Path(run_dir)
    history = gate_history(run_dir) if gate in GATED else None
    figures = run_figures(training_curve(run_dir), history, gate, run_dir.name)
    return [save_figure(figure, run_dir / name) for name, figure in figures.items()]


# ------------------------------------------------------------------------------ compare
#: Colours of the comparison's rows, the same in every panel.
ROW_COLORS = {"baseline": "tab:gray", "fixed": "tab:blue", "learned": "tab:red"}

#: Colours of further rows (e.g. pretrained models beside a sweep), in order.
EXTRA_COLORS = ("tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:orange")

#: Rows up to which the labels under the points stay horizontal (wrapped); more are slanted.
UPRIGHT_ROWS = 3

#: Characters per line of an upright label under a point.
LABEL_WIDTH = 10

#: Widest compare.png (inches): more panels go on further lines.
COMPARE_WIDTH = 16.0


#: The least height of a compare.png panel, as a share of its values' size (|mean|): a
#: difference of 0.003 nats on a loss of 6.43 is drawn as the 0.05 % it is, not full height.
MIN_RELATIVE_SPAN = 0.02


def compare_figure(table: CompareTable) -> Figure:
    """The comparison table drawn: one panel per metric (validation loss, each benchmark's
    perplexity), one point per row at its mean over seeds, error bars ± the sample std where a
    row has two seeds or more (one seed: a point alone, and the title says so). Each panel's
    y-range spans at least `MIN_RELATIVE_SPAN` of its values, so that a tiny difference is not
    stretched to full height. Each point is named under it (`row_tick_label`), upright and
    wrapped for a few rows, slanted for more; the legend below gives each row's full name and
    seed count."""
    columns = table.panels()
    panel_width = max(2.6, 0.45 * len(table.rows) + 1.2)
    down = math.ceil(len(columns) / max(1, int(COMPARE_WIDTH // panel_width)))
    across = math.ceil(len(columns) / down)  # lines of panels as even as they can be
    fig = new_figure(width=max(6.4, panel_width * across), height=3.4 * down + 0.6)
    fig.set_layout_engine("constrained")  # room for every panel's tick labels
    grid = fig.subplots(down, across, squeeze=False).ravel()
    for unused in grid[len(columns) :]:
        unused.remove()
    axes = grid[: len(columns)]
    colors = _row_colors(table)
    for ax, column in zip(axes, columns, strict=True):
        for i, row in enumerate(table.rows):
            stat = row.cells.get(column.key)
            if stat is None:
                continue
            style = {"fmt": "o", "capsize": 5, "color": colors[i], "label": f"{row.label} (n={stat.n})"}
            if stat.std is None:  # one seed: no spread to show
                ax.errorbar([i], [stat.mean], **style)
            else:
                ax.errorbar([i], [stat.mean], yerr=[stat.std], **style)
        _name_rows(ax, table)
        _honest_span(ax)
        ax.set_title(column.label)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 3), fontsize="small")
    fig.suptitle(compare_title(table))
    return fig


def seed_counts(table: CompareTable) -> set[int]:
    """The numbers of seeds the table's cells are over."""
    return {stat.n for row in table.rows for stat in row.cells.values() if stat is not None}


def compare_title(table: CompareTable) -> str:
    """compare.png's title: what a point and its bar are, for the seed counts the table has."""
    counts = seed_counts(table)
    if counts and max(counts) < 2:
        return "one seed per row: each point is that run's value, no spread shown (lower is better)"
    if 1 in counts:
        return "mean ± sample std over seeds; rows of one seed: the value alone (lower is better)"
    return "mean ± sample std over seeds (lower is better)"


def _honest_span(ax: Axes) -> None:
    """Widen the panel's y-range, about its middle, to at least `MIN_RELATIVE_SPAN` of the
    values' size, and show the ticks as plain values (no offset that hides the scale)."""
    low, high = ax.get_ylim()
    middle = (low + high) / 2
    least = MIN_RELATIVE_SPAN * abs(middle)
    if high - low < least:
        ax.set_ylim(middle - least / 2, middle + least / 2)
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")


def _row_colors(table: CompareTable) -> list[str]:
    """Each row's colour: its kind's (`ROW_COLORS`), else the next of `EXTRA_COLORS`."""
    extra = iter(EXTRA_COLORS * (1 + len(table.rows) // len(EXTRA_COLORS)))
    return [ROW_COLORS.get(row.key) or next(extra) for row in table.rows]


def _name_rows(ax: Axes, table: CompareTable) -> None:
    """The rows' names under their points: upright and wrapped for up to UPRIGHT_ROWS rows,
    slanted (ending under the point) for more."""
    labels = [row_tick_label(row) for row in table.rows]
    positions = range(len(labels))
    if len(labels) <= UPRIGHT_ROWS:
        ax.set_xticks(positions, [textwrap.fill(label, LABEL_WIDTH) for label in labels], fontsize=8)
    else:
        ax.set_xticks(positions, labels, fontsize=8, rotation=40, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(labels) - 0.4)


def row_tick_label(row: CompareRow) -> str:
    """A row's name under its point: baseline, fixed k=<k>, learned, or its own label (another
    kind of row, e.g. a pretrained model)."""
    if row.key == "fixed":
        return f"fixed k={row.cut_layer}"
    return row.key if row.key in ROW_COLORS else row.label


def plot_compare(table: CompareTable, path: str | os.PathLike[str]) -> Path:
    """Write compare.png."""
    return save_figure(compare_figure(table), path)
