"""Table III of report.html (from misalignment.json): how much the last layer of each trained
variant is still about its input token, one row per variant, each metric as mean ± std over
seeds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from resstream.reporting.misalignment import METRICS as MISALIGNMENT_METRICS
from resstream.reporting.misalignment import READING as MISALIGNMENT_READING
from resstream.reporting.report.inputs import Output
from resstream.reporting.report.markup import caption_html, escape
from resstream.reporting.tables import Stat

__all__ = ["misalignment_html", "misalignment_section"]


def _misalignment_cell(stat: dict[str, Any] | None, variant_n: int, metric: str) -> str:
    if not stat or stat.get("mean") is None:
        return f"<td>never (0 of {variant_n} seeds)</td>" if metric == "shift_layer" else "<td>—</td>"
    text = Stat(tuple(float(v) for v in stat.get("values") or [stat["mean"]])).format()
    count = int(stat.get("n") or 0)
    if metric == "shift_layer":
        text += f" ({count} of {variant_n} seeds)"
    elif count != variant_n:
        text += f" (n={count})"
    return f"<td>{escape(text)}</td>"


def misalignment_html(data: dict[str, Any]) -> str:
    """Table III: one row per variant, each metric as mean ± std over seeds."""
    metrics = list(data.get("metrics") or MISALIGNMENT_METRICS)
    head = "".join(f"<th>{escape(m)}</th>" for m in metrics)
    rows = []
    for v in data.get("variants") or []:
        n = int(v.get("n") or 0)
        cells = "".join(_misalignment_cell(v.get(m), n, m) for m in metrics)
        rows.append(f"<tr><th class='row'>{escape(v.get('variant'))}</th><td>{n}</td>{cells}</tr>")
    return (
        f"<div class='scroll'><table><thead><tr><th class='row'>variant</th><th>n</th>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def misalignment_section(outputs: Sequence[Output]) -> str:
    """Table III of each misalignment.json with its caption."""
    parts = []
    for output in outputs:
        data = output.data
        seeds = sorted({int(run["seed"]) for run in data.get("runs") or [] if "seed" in run})
        caption = caption_html(
            "Table III.",
            "How much the last layer (L) of each trained variant is still about its input token: "
            "final_* are the shift metrics at layer L (in_match and out_match: the input and the "
            "next token among the top-k; cos_in, cos_out, projection as in Figure 3), shift_layer "
            "is where the next token first out-ranks the input one (counted over the seeds where "
            f"it happened); mean ± sample std over seeds. Reading: {escape(MISALIGNMENT_READING)}.",
            [
                f"{data.get('num_sequences', '?')} sequences × {data.get('seq_len', '?')} tokens of "
                f"{data.get('dataset', '?')!r}, top-{data.get('top_k', '?')}, {data.get('decoder', '?')} "
                f"decoder; seeds {', '.join(map(str, seeds)) or '?'}.",
            ],
            "the layers below L (each run's shift.json has them); whether the differences "
            "between variants are significant (a few seeds only).",
        )
        parts.append(f"{misalignment_html(data)}<p class='caption'>{caption}</p>")
    return "".join(parts)
