"""An evaluation (`EvalReport`, `resstream eval`) as a long-format DataFrame, `eval.csv` and
its notebook view. A benchmark's scores become rows by `resstream.reporting.tables.score_rows`,
as in the sweep's frame."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resstream.reporting.notebook import NotebookView, frame_csv, frame_table, register_result
from resstream.reporting.tables import score_rows, typed_frame
from resstream.training.evaluate.report import EvalReport

if TYPE_CHECKING:
    import pandas

#: The columns of `EvalReport.to_pandas()` and eval.csv, in order.
EVAL_COLUMNS = ("model", "benchmark", "metric", "value", "n")


def eval_frame(report: EvalReport) -> pandas.DataFrame:
    """`EvalReport.to_pandas()`: one row per benchmark and score (`EVAL_COLUMNS`), the values
    of eval.json (a null there is NaN here)."""
    rows = [
        (report.model, entry["name"], metric, value, n)
        for entry in report.to_dict()["benchmarks"]
        for metric, value, n in score_rows(entry)
    ]
    return typed_frame(EVAL_COLUMNS, rows)


def eval_csv(report: EvalReport) -> str:
    """eval.csv: the report's frame (`eval_frame`)."""
    return frame_csv(eval_frame(report))


def eval_view(report: EvalReport) -> NotebookView:
    """The frame as a table (`resstream eval` draws no figure)."""
    return NotebookView(tables=[frame_table("eval.csv", eval_frame(report))])


register_result(EvalReport, eval_frame, eval_view)


__all__ = ["EVAL_COLUMNS", "eval_csv", "eval_frame", "eval_view"]
