"""The notebook views and DataFrames of the training experiments: one run (`TrainResult`,
`resstream train`), a comparison (`CompareTable`, `resstream compare`) and a sweep
(`SweepResult`, `resstream sweep`).

A run shows its losses and the figures `resstream train` writes into its folder
(`resstream.reporting.plots.run_figures`: loss_curve.png, gate.png); its frame is its metrics
log, long (`train_frame`, `TRAIN_COLUMNS`). A comparison and a sweep show the baseline / best
fixed cut / learned gate table as report.html's Table II draws it (`compare_html`), with the
figures their command writes: compare.png (`compare_figure`); sweep_val_loss.png and
learned_gate_heatmap.png (`sweep_val_loss_figure`, `gate_heatmap_figure`). Their frames are
those of `resstream.reporting.tables`, from which compare.csv and sweep.csv are written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from resstream.reporting.notebook import (
    NotebookView,
    Picture,
    Table,
    frame_table,
    long_frame,
    register_result,
)
from resstream.reporting.plots import (
    RUN_FIGURES,
    compare_figure,
    gate_heatmap_figure,
    run_figures,
    seed_counts,
    sweep_val_loss_figure,
)
from resstream.reporting.report.benchmark_table import compare_html
from resstream.reporting.report.markup import escape
from resstream.reporting.tables import CompareTable, compare_frame, sweep_frame, sweep_table
from resstream.training.records import SweepResult, TrainResult

if TYPE_CHECKING:
    import pandas

#: What a comparison's figure shows, under it (rows of two seeds or more; `compare_caption`).
COMPARE_CAPTION = (
    "compare.png: each row's mean over seeds (points) ± the sample standard deviation (error bars), "
    "one panel per metric (lower is better)"
)


def compare_caption(table: CompareTable) -> str:
    """compare.png's caption, for the seed counts the table has: no spread is claimed for a
    row of one seed."""
    counts = seed_counts(table)
    if counts and max(counts) < 2:
        return (
            "compare.png: one seed per row: each point is that run's value (no spread: n = 1), "
            "one panel per metric (lower is better)"
        )
    if 1 in counts:
        return f"{COMPARE_CAPTION}; a row of one seed has no error bar"
    return COMPARE_CAPTION


def comparison_table(title: str, table: CompareTable) -> Table:
    """The comparison as report.html's Table II draws it (best of each column in bold), with
    its conventions below."""
    return Table(title, f"{compare_html(table, ())}<p>{escape(table.footer())}</p>")


def compare_view(table: CompareTable) -> NotebookView:
    """compare.md as a table and compare.png (when the table has rows to draw)."""
    pictures = (
        [Picture(compare_figure(table), compare_caption(table))] if table.rows and table.panels() else []
    )
    return NotebookView(tables=[comparison_table("compare.md", table)], pictures=pictures)


def sweep_view(result: SweepResult) -> NotebookView:
    """The sweep's comparison table, sweep_val_loss.png and, when a learned gate logged its
    distribution, learned_gate_heatmap.png (the figures `resstream sweep` writes)."""
    pictures = [
        Picture(
            sweep_val_loss_figure(result),
            "sweep_val_loss.png: final validation loss against the fixed cut layer (points; with several "
            "seeds, black: mean ± std), baseline dotted, learned gate dashed",
        )
    ]
    histories = {seed: history for seed, history in result.gate_histories.items() if history.steps}
    if histories:
        pictures.append(
            Picture(
                gate_heatmap_figure(histories),
                "learned_gate_heatmap.png: the learned gate's distribution p over layers (rows) at each "
                "logged training step (columns), one panel per seed",
            )
        )
    table = comparison_table("baseline / best fixed cut / learned gate", sweep_table(result))
    return NotebookView(tables=[table], pictures=pictures)


#: The columns of a run's frame (`TrainResult.to_pandas()`; documented by `TrainResult`).
TRAIN_COLUMNS = ("step", "split", "metric", "layer", "value")
#: A training step's metrics that are one number each, in the frame's order.
STEP_METRICS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu")
#: A training step's metrics that are one number per layer: the record's key -> the frame's name.
LAYER_METRICS = {"grad_norm_layers": "layer_grad_norm", "gate": "gate_p"}
#: What each of a run's figures shows, under it.
RUN_CAPTIONS = dict(
    zip(
        RUN_FIGURES,
        (
            "loss_curve.png: training loss at every logged step and validation loss at each evaluation",
            "gate.png: the gate's distribution p over layers at each logged step (left) and at the end "
            "(right; dotted: uniform)",
        ),
        strict=True,
    )
)


def _record_rows(record: dict[str, Any]) -> list[tuple[int, str, str, int | None, float]]:
    """The frame's rows of one metrics.jsonl record (none for a record without a step)."""
    if "step" not in record:
        return []
    step = int(record["step"])
    rows: list[tuple[int, str, str, int | None, float]] = []
    if record.get("loss") is not None:
        values = {m: record[m] for m in STEP_METRICS if record.get(m) is not None}
        rows += [(step, "train", metric, None, float(value)) for metric, value in values.items()]
        for key, metric in LAYER_METRICS.items():
            per_layer = enumerate(record.get(key) or ())
            rows += [(step, "train", metric, layer, float(value)) for layer, value in per_layer]
    if record.get("val_loss") is not None:
        rows.append((step, "val", "loss", None, float(record["val_loss"])))
    return rows


def train_frame(result: TrainResult) -> pandas.DataFrame:
    """The run's metrics log as a long frame (`TRAIN_COLUMNS`, described by `TrainResult`)."""
    rows = [row for record in result.metrics for row in _record_rows(record)]
    return long_frame(TRAIN_COLUMNS, rows, integers=("layer",))


def train_view(result: TrainResult) -> NotebookView:
    """The run's losses (the frame's loss rows) and the figures `resstream train` writes."""
    frame = train_frame(result)
    losses = frame.loc[frame.metric == "loss", ["step", "split", "value"]]
    table = frame_table("loss (train: each logged step; val: each evaluation)", losses)
    figures = run_figures(result.curve, result.gate_history, result.gate, result.run_dir.name)
    pictures = [Picture(figure, RUN_CAPTIONS[name]) for name, figure in figures.items()]
    return NotebookView(tables=[table], pictures=pictures)


register_result(TrainResult, train_frame, train_view)
register_result(CompareTable, compare_frame, compare_view)
register_result(SweepResult, sweep_frame, sweep_view)


__all__ = [
    "COMPARE_CAPTION",
    "LAYER_METRICS",
    "RUN_CAPTIONS",
    "STEP_METRICS",
    "TRAIN_COLUMNS",
    "compare_caption",
    "compare_view",
    "comparison_table",
    "sweep_view",
    "train_frame",
    "train_view",
]
