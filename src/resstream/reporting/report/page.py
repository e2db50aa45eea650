"""report.html: the page assembled from the sections whose inputs were given, numbered as in
the paper (Table I, Figures 2–5, Tables II and III), with a title, the study's scale, a list
of contents and where the numbers came from. One file with every figure embedded as a data:
URI and its style inline, so it opens offline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from resstream.errors import UsageError
from resstream.io import write_text
from resstream.reporting.report.benchmark_table import benchmark_section
from resstream.reporting.report.inputs import ReportInputs
from resstream.reporting.report.lens_table import lens_section
from resstream.reporting.report.markup import escape
from resstream.reporting.report.misalignment_table import misalignment_section
from resstream.reporting.report.shift_figures import match_section, shift_runs, similarity_section
from resstream.reporting.report.sweep_figures import gate_section, val_loss_section
from resstream.training.records import SweepResult, load_sweep

__all__ = ["DEFAULT_TITLE", "REPORT_FILE", "Section", "report_html", "write_report"]


REPORT_FILE = "report.html"
DEFAULT_TITLE = "resstream: the causal shift and residual attenuation"


PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#222;line-height:1.4}"
    "h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}"
    "h3{font-size:1em;margin-bottom:.3em}"
    "table{border-collapse:collapse;font-size:88%;margin:.5em 0}"
    "td,th{border:1px solid #bbb;padding:3px 7px;text-align:right;vertical-align:top;white-space:nowrap}"
    "th{background:#f2f2f2}th.row,td.text{text-align:left}thead th{text-align:center}"
    "td.token{font-family:monospace;text-align:center;white-space:pre}"
    "tr.group th{text-align:left;font-weight:normal;font-style:italic;background:#fafafa}"
    ".scroll{overflow-x:auto;max-width:100%}"
    "figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}"
    ".grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:0 1.5em}"
    "figcaption,p.caption{color:#444;font-size:90%;margin:.4em 0}"
    ".note{color:#555;font-size:90%}nav ol{margin:.3em 0}"
    "code{font-size:95%}"
    "@media print{body{max-width:none}h2{break-after:avoid}"
    "figure,table,.caption{break-inside:avoid}.scroll{overflow:visible}}"
)


@dataclass(frozen=True)
class Section:
    """One numbered section of the page."""

    anchor: str
    heading: str
    body: str


def _has_gate(sweep: SweepResult) -> bool:
    """Whether a sweep logged its learned gate (Figure 5 draws it)."""
    return any(h.steps for h in sweep.gate_histories.values())


def _sections(inputs: ReportInputs) -> list[Section]:
    """The sections whose inputs were given, in the paper's order."""
    sweeps = [load_sweep(output.directory) for output in inputs.of("sweep")]
    shifts = shift_runs(inputs.of("shift"))
    makers: list[tuple[bool, str, str, Callable[[], str]]] = [
        (
            bool(inputs.of("lens")),
            "table-1",
            "Table I. Decoded tokens by layer",
            lambda: lens_section(inputs.of("lens")),
        ),
        (bool(shifts), "figure-2", "Figure 2. Match rates by layer", lambda: match_section(shifts)),
        (
            bool(shifts),
            "figure-3",
            "Figure 3. Similarity to the input and the next token by relative depth",
            lambda: similarity_section(shifts),
        ),
        (
            bool(sweeps),
            "figure-4",
            "Figure 4. Validation loss against the cut layer",
            lambda: "".join(val_loss_section(s) for s in sweeps),
        ),
        (
            any(_has_gate(s) for s in sweeps),
            "figure-5",
            "Figure 5. The learned gate over training",
            lambda: "".join(gate_section(s) for s in sweeps if _has_gate(s)),
        ),
        (
            bool(inputs.of("compare") or sweeps or inputs.of("eval")),
            "table-2",
            "Table II. Benchmarks",
            lambda: benchmark_section(inputs.of("compare"), sweeps, inputs.of("eval")),
        ),
        (
            bool(inputs.of("misalignment")),
            "table-3",
            "Table III. Misalignment of the trained variants",
            lambda: misalignment_section(inputs.of("misalignment")),
        ),
    ]
    return [Section(anchor, heading, make()) for present, anchor, heading, make in makers if present]


def _scale_note(inputs: ReportInputs, scale_note: str | None) -> str:
    if scale_note:
        return scale_note
    scales = [str(r.data.get("scale")) for r in inputs.reproductions if r.data.get("scale")]
    return f"a reproduction at the {', '.join(scales)} scale" if scales else ""


def report_html(inputs: ReportInputs, *, title: str = DEFAULT_TITLE, scale_note: str | None = None) -> str:
    """The page of `write_report`, as text."""
    if not inputs.outputs:
        raise UsageError("nothing to report: no outputs were found")
    sections = _sections(inputs)
    note = _scale_note(inputs, scale_note)
    contents = "".join(f"<li><a href='#{s.anchor}'>{escape(s.heading)}</a></li>" for s in sections)
    sources = ", ".join(f"<code>{escape(d)}</code>" for d in inputs.directories)
    body = "".join(
        f"<section id='{s.anchor}'><h2>{escape(s.heading)}</h2>{s.body}</section>" for s in sections
    )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{PAGE_STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        + (f"<p><strong>Scale:</strong> {escape(note)}</p>" if note else "")
        + f"<p class='note'>Made from the outputs in {sources}. Figures and tables "
        "are numbered as in the paper; a section appears only when its inputs were given. Every "
        "number comes from those outputs; nothing was recomputed.</p>"
        f"<nav><ol>{contents}</ol></nav>{body}</body></html>"
    )


def write_report(
    inputs: ReportInputs, out_dir: str | Path, *, title: str = DEFAULT_TITLE, scale_note: str | None = None
) -> Path:
    """Write `out_dir/report.html` (module docstring) and return its path. `scale_note` is a
    sentence on the scale of the whole study, shown under the title (default: the scale of
    the reproductions given, if any)."""
    page = report_html(inputs, title=title, scale_note=scale_note)
    path = Path(out_dir) / REPORT_FILE
    write_text(path, page)
    return path
