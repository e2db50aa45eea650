"""Table II of report.html: baseline / best fixed cut / learned gate on the benchmarks, best
value of each column in bold (from compare.json, else the sweep's own scores), with the
pretrained models' rows (eval.json) below them, not ranked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from resstream.reporting.report.inputs import Output
from resstream.reporting.report.markup import caption_html, count_text, escape
from resstream.reporting.report.sweep_figures import sweep_scale
from resstream.reporting.tables import (
    CONVENTION,
    Column,
    CompareRow,
    CompareTable,
    compare_columns,
    model_record,
    model_row,
    sweep_table,
)
from resstream.training.records import SweepResult, normalise_eval

__all__ = ["benchmark_section", "compare_html"]


def _model_name(eval_output: Output) -> str:
    """How a pretrained model's row is labelled: its spec, or the folder name of a path."""
    model = str(eval_output.data.get("model") or eval_output.directory.name)
    return Path(model).name if Path(model).is_absolute() else model


def _eval_tokens(output: Output) -> str:
    counts = ", ".join(
        f"{entry.get('name')} {count_text(int(entry.get('num_tokens') or 0))}"
        for entry in output.data["benchmarks"]
    )
    return f"{_model_name(output)}: scored tokens {counts}."


def _cell(table: CompareTable, row: CompareRow, column: Column, bold: bool) -> str:
    text = escape(table.cell_text(row, column, bold=False))
    return f"<td><strong>{text}</strong></td>" if bold else f"<td>{text}</td>"


def compare_html(table: CompareTable | None, pretrained: Sequence[Output]) -> str:
    """Table II: the comparison's rows (best value per column in bold among them), then one
    row per pretrained model's eval.json (not ranked)."""
    records = [model_record(_model_name(o), normalise_eval(o.data)) for o in pretrained]
    if table is not None:
        columns = table.columns
    else:
        benchmarks = list(dict.fromkeys(name for record in records for name in record.evals))
        columns = tuple(c for c in compare_columns(records, benchmarks) if c.key != "val_loss")
        table = CompareTable((), columns, (), None)
    head = "".join(f"<th>{escape(c.label)}</th>" for c in columns)
    body = []
    for row in table.rows:
        cells = "".join(_cell(table, row, c, row.key in table.best_rows(c)) for c in columns)
        body.append(f"<tr><th class='row'>{escape(row.label)}</th><td>{row.n}</td>{cells}</tr>")
    if records:
        body.append(
            f"<tr class='group'><th colspan='{len(columns) + 2}'>pretrained models "
            "(not ranked: their own tokenizer and training data)</th></tr>"
        )
    for record in records:
        row = model_row(record, columns)
        cells = "".join(_cell(table, row, c, False) for c in columns)
        body.append(f"<tr><th class='row'>{escape(row.label)}</th><td>{row.n}</td>{cells}</tr>")
    return (
        f"<div class='scroll'><table><thead><tr><th class='row'>model</th><th>n</th>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _compare_scale(output: Output | None, sweeps: Sequence[SweepResult]) -> list[str]:
    scale = [sweep_scale(sweep) for sweep in sweeps]
    if output is not None:
        tokens = output.data.get("max_eval_tokens")
        cap = (
            f"at most {count_text(tokens)} tokens per benchmark"
            if tokens
            else "every token of each benchmark"
        )
        benchmarks = ", ".join(output.data.get("benchmarks") or []) or "none"
        scale.append(f"Benchmarks {benchmarks}, {cap}.")
    return scale


def benchmark_section(
    compares: Sequence[Output], sweeps: Sequence[SweepResult], evals: Sequence[Output]
) -> str:
    """Table II: one table per compare.json (else per sweep), the pretrained models' rows
    (eval.json) under the first, each with its caption."""
    tables: list[tuple[CompareTable | None, Output | None]] = [
        (CompareTable.from_dict(output.data), output) for output in compares
    ]
    if not tables:
        tables = [(sweep_table(sweep), None) for sweep in sweeps] or [(None, None)]
    parts = []
    for index, (table, output) in enumerate(tables):
        shown_evals = evals if index == 0 else ()
        footer = table.footer() if table is not None and table.rows else CONVENTION + "."
        scale = _compare_scale(output, sweeps) + [_eval_tokens(o) for o in shown_evals]
        caption = caption_html(
            "Table II.",
            "Validation loss and each benchmark's perplexity (and LAMBADA last-word accuracy) of "
            "the baseline, the best fixed cut and the learned gate; bold marks the best value of "
            "each column among these trained variants. " + escape(footer[:1].upper() + footer[1:]),
            scale,
            "whether a difference is significant (n seeds only); a pretrained model's "
            "perplexity is per token of its own tokenizer, so it is not comparable with the "
            "trained models' (shown for orientation, never bold).",
        )
        parts.append(f"{compare_html(table, shown_evals)}<p class='caption'>{caption}</p>")
    return "".join(parts)
