"""Generations under edits: terminal lines, generations.jsonl, the page and the notebook view."""

from __future__ import annotations

import html
import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from resstream.analysis.steering.continuations import Continuation, GenerationResult
from resstream.io import write_text
from resstream.reporting.notebook import NotebookView, Table, register_result

if TYPE_CHECKING:
    import pandas

#: The page's style: the two continuations side by side, the edited one marked.
PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}"
    "h1{font-size:1.4em}table{border-collapse:collapse;width:100%;margin:.5em 0 1.5em}"
    "td,th{border:1px solid #bbb;padding:6px 9px;vertical-align:top;text-align:left}"
    "th{background:#f2f2f2}td.text{font-family:monospace;white-space:pre-wrap;width:40%}"
    "td.prompt{font-family:monospace;white-space:pre-wrap;color:#555}"
    "td.changed{background:#fff4d6}.note{color:#555;font-size:90%}code{background:#f4f4f4}"
)


def generation_frame(result: GenerationResult) -> pandas.DataFrame:
    """One row per prompt: prompt, steered, unsteered, changed, new_tokens (steered),
    steered_ids, unsteered_ids (`GenerationResult` docstring)."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "prompt": c.prompt,
                "steered": c.steered,
                "unsteered": c.unsteered,
                "changed": c.changed,
                "new_tokens": len(c.steered_ids),
                "steered_ids": list(c.steered_ids),
                "unsteered_ids": None if c.unsteered_ids is None else list(c.unsteered_ids),
            }
            for c in result.continuations
        ]
    )


def write_jsonl(result: GenerationResult, path: str | Path) -> None:
    """generations.jsonl: one JSON object per prompt, each with the edits and sampling rule."""
    record = result.to_dict()
    shared = {key: record[key] for key in ("model", "edits", "sampling", "where")}
    lines = [json.dumps({**row, **shared}, ensure_ascii=False) for row in record["generations"]]
    write_text(path, "\n".join(lines) + "\n")


def edits_line(result: GenerationResult) -> str:
    """The edits as one line: ``Add('L6.resid', coef=4) at all positions``."""
    if not result.edits:
        return "no edits"
    labels = [_edit_label(e) for e in result.edits]
    return f"{'; '.join(labels)} at {result.where} positions"


def _edit_label(record: dict[str, object]) -> str:
    extra = [
        f"{key}={record[key]:g}" for key in ("coef", "alpha") if isinstance(record.get(key), (int, float))
    ]
    value = record.get("value")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        extra.append(f"value={value:g}")
    label = str(record["label"])
    return f"{label[:-1]}, {', '.join(extra)})" if extra else label


def summary_lines(result: GenerationResult, width: int = 100) -> list[str]:
    """The terminal's view: per prompt, the prompt, then the edited and the plain continuation."""
    lines = [f"generate: {result.model}; {edits_line(result)}"]
    for c in result.continuations:
        lines.append("")
        lines += textwrap.wrap(f"prompt:    {c.prompt!r}", width, subsequent_indent=" " * 11)
        lines += textwrap.wrap(f"edited:    {c.steered!r}", width, subsequent_indent=" " * 11)
        if c.unsteered is not None:
            same = "" if c.changed else " (the same)"
            lines += textwrap.wrap(f"unedited:  {c.unsteered!r}{same}", width, subsequent_indent=" " * 11)
    return lines


def _table(result: GenerationResult) -> str:
    compare = any(c.unsteered is not None for c in result.continuations)
    head = "<tr><th>prompt</th><th>edited</th>" + ("<th>unedited</th>" if compare else "") + "</tr>"
    return f"<table>{head}{''.join(_row(c, compare) for c in result.continuations)}</table>"


def _row(c: Continuation, compare: bool) -> str:
    marked = " changed" if c.changed else ""
    cells = f"<td class='prompt'>{html.escape(c.prompt)}</td>"
    cells += f"<td class='text{marked}'>{html.escape(c.steered)}</td>"
    if compare:
        cells += f"<td class='text'>{html.escape(c.unsteered or '')}</td>"
    return f"<tr>{cells}</tr>"


def _note(result: GenerationResult) -> str:
    sampling = result.sampling
    rule = (
        "greedy"
        if sampling["temperature"] == 0
        else f"sampled at temperature {sampling['temperature']:g}, top-p {sampling['top_p']:g}, "
        f"seed {sampling['seed']}"
    )
    return (
        f"<p class='note'>{html.escape(edits_line(result))}; {sampling['max_new_tokens']} new tokens, "
        f"{rule}. A shaded cell is a continuation the edits changed; both columns use the same rule "
        f"and seed.</p>"
    )


def write_html(result: GenerationResult, path: str | Path) -> None:
    """generations.html: every prompt with its edited and unedited continuation; self-contained."""
    page = (
        "<!doctype html><meta charset='utf-8'><title>resstream generate</title>"
        f"<style>{PAGE_STYLE}</style><h1>Generations of {html.escape(result.model)}</h1>"
        f"{_note(result)}{_table(result)}"
    )
    write_text(path, page)


def _view(result: GenerationResult) -> NotebookView:
    style = f"<style>{PAGE_STYLE.split('}', 1)[1]}</style>"  # the page's rules without its body's
    return NotebookView(tables=[Table("Generations", f"{style}{_note(result)}{_table(result)}")])


register_result(GenerationResult, generation_frame, _view)

__all__ = ["edits_line", "generation_frame", "summary_lines", "write_html", "write_jsonl"]
