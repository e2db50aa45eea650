"""attribute.html: one self-contained page per result. For one text: the text with the scored
position marked and the prediction; for a corpus: the dataset and sequences; then the check
residuals, any notes, every figure embedded as a data: URI and every table (`attribute_tables`),
each with a caption on how to read it (`captions`), and which score leads them
(`ranking_html`). The page loads nothing from anywhere; tokens show their whitespace
(`show_token`), every text from data is escaped. A result's notebook view (`notebook`)
shows the same tables by the same functions (`table_html`, `prediction_html`, `check_html`,
`notes_html`, `ranking_html`)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from resstream.analysis.attribution.results import AttributeResult, AttributionCheck, CorpusAttribution
from resstream.io import write_text
from resstream.reporting.attribute.captions import captions_of, ranking_line
from resstream.reporting.attribute.common import HTML_FILE, Directory, Result, output_path, residual_text
from resstream.reporting.attribute.tables import Table, attribute_tables
from resstream.reporting.html import file_figure_html
from resstream.reporting.text import probability_text, show_token

__all__ = [
    "SCROLL_STYLE",
    "captions_of",
    "check_html",
    "key_values_html",
    "logit_label",
    "notes_html",
    "notes_section",
    "prediction_html",
    "ranking_html",
    "table_html",
    "write_attribute_html",
]

PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:1150px;margin:1em auto;padding:0 1em;color:#222}"
    "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}"
    ".text{font-family:monospace;line-height:2;word-break:break-all}"
    ".text span{border:1px solid #ddd;padding:1px 2px;margin:0 1px;border-radius:3px}"
    ".text .after{color:#aaa}.text .position{background:#ffe08a;border-color:#c90;font-weight:bold}"
    ".text .target{background:#a1d99b;border-color:#4a4}"
    "table{border-collapse:separate;border-spacing:0;font-size:85%}"
    "td,th{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:pre}"
    "th{background:#f4f4f4;position:sticky;top:0}th.key{text-align:left;position:static}td.text-cell{text-align:left;font-family:monospace}"
    ".scroll{display:inline-block;max-width:100%}"
    "figure{margin:1.2em 0}figure img{max-width:100%;border:1px solid #eee}"
    "figcaption,.caption{color:#555;font-size:90%;margin:.3em 0}"
)


#: A long table scrolls in its own box (inline, so that it also does in a notebook).
SCROLL_STYLE = "max-height:360px;overflow:auto"


def _number(value: float) -> str:
    return f"{value:.4g}"


def _shown_text(column: str, value: str) -> str:
    """A text cell as shown: a token with visible whitespace; the promoted tokens (a JSON
    list) each so, separated by spaces."""
    if column == "promoted" and value:
        return " ".join(show_token(token) for token in json.loads(value))
    return show_token(value)


def _html_cell(column: str, value: Any) -> str:
    if isinstance(value, float):
        return f"<td>{_number(value)}</td>"
    if isinstance(value, str):
        return f"<td class='text-cell'>{html.escape(_shown_text(column, value))}</td>"
    return f"<td>{html.escape(str(value))}</td>"


def table_html(table: Table, caption: str) -> str:
    """`table` with its caption and row count above it, in a box that scrolls (the page's and
    the notebook's table)."""
    header = "".join(f"<th>{html.escape(column)}</th>" for column in table.columns)
    body = "".join(
        "<tr>" + "".join(_html_cell(c, v) for c, v in zip(table.columns, row, strict=True)) + "</tr>"
        for row in table.rows
    )
    return (
        f"<p class='caption'>{html.escape(caption)} ({len(table.rows)} rows)</p>"
        f"<div class='scroll' style='{SCROLL_STYLE}'><table><thead><tr>{header}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def _html_table(table: Table, caption: str) -> str:
    return f"<h3>{table.name}.csv</h3>{table_html(table, caption)}"


def _html_text(result: AttributeResult) -> str:
    """The text as tokens, the scored position marked, later tokens (unseen by the prediction)
    greyed, and the target after it."""
    spans = []
    for index, token in enumerate(result.tokens):
        kind = "position" if index == result.position else "after" if index > result.position else "before"
        spans.append(f'<span class="{kind}">{html.escape(show_token(token))}</span>')
        if index == result.position:
            spans.append(f'→ <span class="target">{html.escape(show_token(result.target))}</span>')
    return f"<p class='text'>{''.join(spans)}</p>"


def key_values_html(pairs: Sequence[tuple[str, str]]) -> str:
    """A two-column table of (key, value) text pairs, both escaped."""
    rows = "".join(
        f"<tr><th class='key'>{html.escape(k)}</th><td class='text-cell'>{html.escape(v)}</td></tr>"
        for k, v in pairs
    )
    return f"<table>{rows}</table>"


def logit_label(result: AttributeResult) -> str:
    """ "logit (before soft-capping)" for a model that soft-caps its logits, else "logit"."""
    return "logit (before soft-capping)" if result.logit_softcap is not None else "logit"


def prediction_html(result: AttributeResult) -> str:
    """The prediction as a table: target, probability, log-probability, logit, rank, the foil
    and logit difference when given, the embedding's DLA and the bias term."""
    pairs = [
        ("target", f"{show_token(result.target)} (id {result.target_id})"),
        ("probability", probability_text(result.probability)),
        ("log-probability", _number(result.logprob)),
        (logit_label(result), _number(result.logit)),
        ("rank (0 = top-1)", str(result.rank)),
    ]
    if result.foil is not None:
        pairs.append(("foil", f"{show_token(result.foil)} (id {result.foil_id})"))
    if result.logit_difference is not None:
        pairs.append(("logit difference target − foil", _number(result.logit_difference)))
    pairs += [
        ("embedding DLA", _number(result.embed_dla)),
        ("bias term of the DLA", _number(result.bias_dla)),
    ]
    return key_values_html(pairs)


def check_html(check: AttributionCheck) -> str:
    """The measured residuals of the decomposition and the DLA as a table."""
    return key_values_html(
        [
            ("decomposition: max |Σ components − state|", residual_text(check.decomposition_max_abs)),
            ("decomposition: the same / ‖state‖", residual_text(check.decomposition_relative)),
            ("DLA: |Σ DLA + bias term − actual logit (difference)|", residual_text(check.dla_residual)),
        ]
    )


def notes_html(notes: Sequence[str]) -> str:
    """The notes as a list ("" when there are none)."""
    if not notes:
        return ""
    return "<ul>" + "".join(f"<li>{html.escape(note)}</li>" for note in notes) + "</ul>"


def notes_section(notes: Sequence[str]) -> str:
    """A page's "Notes" heading and list ("" when there are none)."""
    return f"<h2>Notes</h2>{notes_html(notes)}" if notes else ""


def ranking_html(result: Result) -> str:
    """Which score leads the figures and lists, which is beside it, and where their
    faithfulness is measured (`ranking_line`), as a paragraph."""
    return f"<p class='ranking'>{html.escape(ranking_line(result))}.</p>"


def _html_head(result: Result) -> str:
    """The page's heading and the part above the figures."""
    if isinstance(result, CorpusAttribution):
        model, dataset, decoder = (
            html.escape(text) for text in (result.model, result.dataset, result.decoder)
        )
        return (
            f"<h1>Who writes the next token: {model} on {dataset}</h1>"
            f"<p>{result.num_seqs} sequences × {result.seq_len} tokens, {result.positions:,} positions "
            f"scored (each position's next token is its target); decoder {decoder}. Means over "
            f"sequences with 95% intervals. Neurons: {html.escape(result.neuron_rule)}.</p>"
            f"{ranking_html(result)}<h2>Check</h2>{check_html(result.check)}"
        )
    return (
        f"<h1>Who wrote ‘{html.escape(show_token(result.target))}’ after position {result.position}: "
        f"{html.escape(result.model)}</h1>"
        f"<p>decoder {html.escape(result.decoder)}; the marked token is the scored position, the green one "
        "the target predicted after it, grey tokens come later (the prediction does not see them).</p>"
        f"{ranking_html(result)}<h2>Text</h2>{_html_text(result)}<h2>Prediction</h2>{prediction_html(result)}"
        f"<h2>Check</h2>{check_html(result.check)}"
    )


def write_attribute_html(result: Result, directory: Directory, images: Sequence[Path]) -> Path:
    """`attribute.html` in `directory`: the text with the scored position and the prediction
    (one text) or the dataset (corpus), the check residuals, every figure in `images`
    embedded as a data: URI and every table, each with a caption on how to read it. The page
    loads nothing from anywhere; returns its path."""
    captions = captions_of(result)
    notes = notes_section(result.notes)
    figures = "".join(file_figure_html(image, captions.get(Path(image).name, "")) for image in images)
    tables = "".join(_html_table(t, captions.get(t.name, "")) for t in attribute_tables(result))
    page = (
        f"<!doctype html><html lang='en'><meta charset='utf-8'>"
        f"<title>resstream attribute: {html.escape(result.model)}</title><style>{PAGE_STYLE}</style>"
        f"{_html_head(result)}{notes}<h2>Figures</h2>{figures}"
        f"<h2>Tables</h2><p class='caption'>The same numbers as the CSV files beside this page "
        f"(which keep full precision).</p>{tables}</html>"
    )
    path = output_path(directory, HTML_FILE)
    write_text(path, page)
    return path
