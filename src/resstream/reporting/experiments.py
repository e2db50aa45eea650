"""The notebook views and DataFrames of the training experiments: a comparison (`CompareTable`,
`resstream compare`) and a sweep (`SweepResult`, `resstream sweep`).

Each shows the baseline / best fixed cut / learned gate table as report.html's Table II draws
it (`compare_html`), with the figures its command writes: compare.png (`compare_figure`);
sweep_val_loss.png and learned_gate_heatmap.png (`sweep_val_loss_figure`,
`gate_heatmap_figure`). The frames are those of `resstream.reporting.tables`, from which
compare.csv and sweep.csv are written.
"""

from __future__ import annotations

from resstream.reporting.notebook import NotebookView, Picture, Table, notebook_view, tidy_frame
from resstream.reporting.plots import compare_figure, gate_heatmap_figure, sweep_val_loss_figure
from resstream.reporting.report.benchmark_table import compare_html
from resstream.reporting.report.markup import escape
from resstream.reporting.tables import CompareTable, compare_frame, sweep_frame, sweep_table
from resstream.training.records import SweepResult

#: What a comparison's figure shows, under it.
COMPARE_CAPTION = (
    "compare.png: each row's mean over seeds (points) ± the sample standard deviation (error bars), "
    "one panel per metric (lower is better)"
)


def comparison_table(title: str, table: CompareTable) -> Table:
    """The comparison as report.html's Table II draws it (best of each column in bold), with
    its conventions below."""
    return Table(title, f"{compare_html(table, ())}<p>{escape(table.footer())}</p>")


def compare_view(table: CompareTable) -> NotebookView:
    """compare.md as a table and compare.png (when the table has rows to draw)."""
    pictures = [Picture(compare_figure(table), COMPARE_CAPTION)] if table.rows and table.panels() else []
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


# Registered by class (a decorator would evaluate the return annotation, pandas, at import).
tidy_frame.register(CompareTable, compare_frame)
notebook_view.register(CompareTable, compare_view)
tidy_frame.register(SweepResult, sweep_frame)
notebook_view.register(SweepResult, sweep_view)


__all__ = ["COMPARE_CAPTION", "compare_view", "comparison_table", "sweep_view"]
