"""What the faithfulness check (`resstream ablate --dataset`, `resstream.faithfulness`) writes
and shows: the renderers of a `FaithfulnessResult`. They arrange its numbers and compute
nothing new.

* `faithfulness_frame` (`to_pandas()`): one long frame, `FAITHFULNESS_COLUMNS`; agreement.csv,
  curves.csv and components.csv are its rows of some tables with the columns those use
  (`CSV_TABLES`, `CSV_COLUMNS`).
* Figures: scatter_heads.png and scatter_neurons.png (`scatter_figure`: each additive score
  against the exact effect, one panel per score, Spearman's ρ in each title) and
  ablation_curves.png (`curves_figure`: Δ log p and Δ reciprocal rank against the neurons
  ablated jointly, one line per selection method).
* `write_faithfulness_report`: ablate.json (`to_dict()`), the CSVs, the PNGs and ablate.html, a
  page that loads nothing from anywhere (figures as data: URIs, every text from data escaped).
* `terminal_summary` (a command's lines) and the notebook view (the page's tables and figures).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from resstream.analysis.interventions.faithfulness import (
    FAITHFULNESS_COLUMNS,
    HEAD_SCORES,
    MAGNITUDE_SCORES,
    NEURON_SCORES,
    SELECTIONS,
    FaithfulnessResult,
    Mean,
)
from resstream.io import write_json, write_text
from resstream.reporting.attribute.common import Directory, output_path
from resstream.reporting.attribute.page import PAGE_STYLE, notes_html, notes_section
from resstream.reporting.figures import new_figure, save_figure
from resstream.reporting.html import file_figure_html
from resstream.reporting.notebook import (
    NotebookView,
    Picture,
    Table,
    frame_csv,
    frame_html,
    frame_table,
    long_frame,
    register_result,
)
from resstream.reporting.text import show_token

if TYPE_CHECKING:
    import pandas

__all__ = [
    "CAPTIONS",
    "CSV_COLUMNS",
    "CSV_TABLES",
    "CURVES_TABLE",
    "FIGURES",
    "HTML_FILE",
    "JSON_FILE",
    "SCORE_LABELS",
    "agreement_table",
    "csv_frame",
    "curves_figure",
    "curves_table",
    "faithfulness_frame",
    "faithfulness_html",
    "faithfulness_view",
    "scatter_figure",
    "terminal_summary",
    "write_faithfulness_report",
]

JSON_FILE = "ablate.json"
HTML_FILE = "ablate.html"
#: Each CSV: the `table` values of the frame's rows it holds, and its columns.
CSV_TABLES = {
    "agreement.csv": ("agreement", "direct_share"),
    "curves.csv": ("curve",),
    "components.csv": ("component",),
}
CSV_COLUMNS = {
    "agreement.csv": ("table", "level", "score", "n", "metric", "value", "low", "high", "count"),
    "curves.csv": ("score", "n", "metric", "value", "low", "high", "count"),
    "components.csv": ("prediction", "level", "component", "layer", "index", "score", "metric", "value"),
}
#: The PNGs, in the page's order.
FIGURES = ("scatter_heads.png", "scatter_neurons.png", "ablation_curves.png")
#: How figures and tables name each score and selection method.
SCORE_LABELS = {
    "C": "C (log-prob contribution)",
    "DLA": "DLA (direct logit attribution)",
    "activation": "activation |m|",
    "grad_x_act": "grad × act (= −AtP)",
    "random": "random",
    "effect": "exact single effect",
}
#: What the page's and the notebook's table of the curves shows.
CURVES_TABLE = (
    "Δ log p(target) (patched − clean) when the top-n neurons chosen by each method (columns) are "
    "zero-ablated together; C, DLA, grad_x_act: the largest scores; activation: the largest |m|; "
    "random: a seeded random set; effect: the largest exact single drops among the candidates. "
    "curves.csv also has the reciprocal rank and the intervals."
)
#: Colours and markers of the selection methods in the ablation curves.
_METHOD_STYLES = {
    "C": ("tab:blue", "o"),
    "DLA": ("tab:orange", "s"),
    "activation": ("tab:green", "^"),
    "grad_x_act": ("tab:red", "D"),
    "random": ("tab:grey", "x"),
    "effect": ("black", "*"),
}
CAPTIONS = {
    "scatter_heads.png": "Each attention head zero-ablated alone at the prediction's position: its additive "
    "score (x) against the log-probability it removes, −Δ log p(target) (y; for the activation magnitude "
    "|Δ log p|), one point per head and prediction. Agreement is a rising cloud; ρ is Spearman's rank "
    "correlation (over a corpus: its mean over windows with the 95% interval). The dashed line is y = x "
    "for scores in log-probability units.",
    "scatter_neurons.png": "The same for the candidate neurons of each prediction (taken in turn from "
    "each score's ranking, so every score's own top neurons are among them).",
    "ablation_curves.png": "The top-n neurons chosen by each method zero-ablated together at the "
    "prediction's position (n on a log axis): the change of log p(target) (left) and of the reciprocal "
    "rank 1/(rank + 1) (right), patched − clean, so a faithful score falls fastest. Random: a seeded "
    "random set; exact single effect: the candidates with the largest drops measured one by one.",
    "agreement.csv": "Per level and score: Spearman's ρ of the score with −effect (|effect| for the "
    "activation magnitude) and the top-k overlap of |score| with |effect|; and per level the direct "
    "share Σ direct·sign(total) / Σ |total|.",
    "curves.csv": "Per selection method (score) and n: the change of log p(target) and of the "
    "reciprocal rank when the top-n neurons are ablated together.",
    "components.csv": "Every component at every prediction: its total and direct effect on "
    "log p(target), direct / total, and each additive score (metric score).",
}


# ----------------------------------------------------------------------------- the frame
def faithfulness_frame(result: FaithfulnessResult) -> pandas.DataFrame:
    """`result.to_pandas()`: one long frame (`FAITHFULNESS_COLUMNS`, documented by
    `FaithfulnessResult`)."""
    return long_frame(
        FAITHFULNESS_COLUMNS,
        list(_frame_rows(result)),
        integers=("n", "prediction", "layer", "index", "count"),
        floats=("value", "low", "high"),
    )


def _mean_row(
    table: str, level: str | None, score: str | None, n: int | None, metric: str, mean: Mean
) -> tuple[Any, ...]:
    return (
        table,
        level,
        score,
        n,
        None,
        None,
        None,
        None,
        metric,
        mean.value,
        mean.low,
        mean.high,
        mean.count,
    )


def _frame_rows(result: FaithfulnessResult) -> Iterator[tuple[Any, ...]]:
    for a in result.agreement:
        yield _mean_row("agreement", a.level, a.score, a.k, "spearman", a.spearman)
        yield _mean_row("agreement", a.level, a.score, a.k, "top_k_overlap", a.top_k_overlap)
    for d in result.direct_shares:
        yield _mean_row("direct_share", d.level, None, None, "direct_share", d.share)
    for p in result.curves:
        yield _mean_row("curve", "neuron", p.method, p.n, "d_logprob", p.d_logprob)
        yield _mean_row("curve", "neuron", p.method, p.n, "d_reciprocal_rank", p.d_reciprocal_rank)
    nan = math.nan
    for c in result.components:
        where = ("component", c.level)
        ids = (c.prediction, c.component, c.layer, c.index)
        for metric, value in (("total", c.total), ("direct", c.direct), ("direct_share", c.direct_share)):
            yield (*where, None, None, *ids, metric, value, nan, nan, None)
        for score, value in c.scores.items():
            yield (*where, score, None, *ids, "score", value, nan, nan, None)


def csv_frame(
    result: FaithfulnessResult, name: str, frame: pandas.DataFrame | None = None
) -> pandas.DataFrame:
    """The rows and columns of the frame that CSV `name` holds (`CSV_TABLES`, `CSV_COLUMNS`)."""
    frame = faithfulness_frame(result) if frame is None else frame
    rows = frame[frame["table"].isin(CSV_TABLES[name])]
    return rows.loc[:, list(CSV_COLUMNS[name])].reset_index(drop=True)


# ----------------------------------------------------------------------------- tables
def _interval(mean: Mean) -> str:
    """A mean as text: the value, and its 95% interval when there is one."""
    if math.isnan(mean.value):
        return "–"
    if math.isnan(mean.low):
        return f"{mean.value:.3f}"
    return f"{mean.value:.3f} [{mean.low:.3f}, {mean.high:.3f}]"


def agreement_table(result: FaithfulnessResult) -> pandas.DataFrame:
    """One row per level and score: Spearman's ρ, the top-k overlap, the components compared
    and the level's direct share (the page's and the notebook's table)."""
    import pandas

    shares = {d.level: _interval(d.share) for d in result.direct_shares}
    rows = [
        (
            a.level,
            SCORE_LABELS.get(a.score, a.score),
            _interval(a.spearman),
            _interval(a.top_k_overlap),
            a.k,
            a.components,
            shares.get(a.level, "–"),
        )
        for a in result.agreement
    ]
    columns = ["level", "score", "Spearman ρ", "top-k overlap", "k", "components", "direct share"]
    return pandas.DataFrame(rows, columns=columns)


def curves_table(result: FaithfulnessResult) -> pandas.DataFrame:
    """One row per n, one column per selection method (`SELECTIONS`): the mean Δ log p(target)
    of ablating the top-n neurons together (the page's and the notebook's table)."""
    import pandas

    methods = [m for m in SELECTIONS if result.curve(m)]
    sizes = sorted({p.n for p in result.curves})
    values = {(p.method, p.n): p.d_logprob.value for p in result.curves}
    rows = [[n, *(values.get((m, n), math.nan) for m in methods)] for n in sizes]
    return pandas.DataFrame(rows, columns=["n", *methods])


def _predictions_html(result: FaithfulnessResult) -> str:
    """The predictions measured, as a small table (at most 40 rows shown)."""
    import pandas

    rows = [
        (p.sequence, p.position, show_token(p.target), p.target_id, p.logprob, p.rank)
        for p in result.predictions
    ]
    frame = pandas.DataFrame(rows, columns=["window", "position", "target", "target id", "log p", "rank"])
    return frame_html(frame, 40)


# ----------------------------------------------------------------------------- figures
def _title_of(result: FaithfulnessResult, level: str, score: str) -> str:
    found = result.agreement_of(level, score)
    return f"{SCORE_LABELS.get(score, score)}\nρ = {_interval(found.spearman)}"


def scatter_figure(result: FaithfulnessResult, level: str) -> Figure:
    """scatter_heads.png / scatter_neurons.png: one panel per additive score of `level`, the
    score (x) against the log-probability ablation removes (y: −Δ log p, or |Δ log p| for
    the activation magnitude), one point per component and prediction, Spearman's ρ in each
    panel's title."""
    scores = HEAD_SCORES if level == "head" else NEURON_SCORES
    rows = [c for c in result.components if c.level == level]
    fig = new_figure(3.3 * len(scores), 3.6)
    axes = fig.subplots(1, len(scores), squeeze=False)[0]
    size = 14 if len(rows) < 500 else 4
    for ax, score in zip(axes, scores, strict=True):
        x = [c.scores[score] for c in rows]
        magnitude = score in MAGNITUDE_SCORES
        y = [abs(c.total) if magnitude else -c.total for c in rows]
        ax.scatter(x, y, s=size, alpha=0.6, color="tab:blue", linewidths=0)
        if score in ("C", "grad_x_act") and x:
            low, high = max(min(x), min(y)), min(max(x), max(y))  # y = x where both axes reach
            if low < high:
                ax.plot([low, high], [low, high], "--", color="grey", linewidth=0.8)
        ax.axhline(0, color="black", linewidth=0.5)
        ax.axvline(0, color="black", linewidth=0.5)
        ax.set_title(_title_of(result, level, score), fontsize=9)
        ax.set_xlabel(score if not magnitude else "|m|", fontsize=9)
        ax.set_ylabel("|Δ log p|" if magnitude else "−Δ log p (log p removed)", fontsize=9)
        ax.grid(alpha=0.3)
    plural = "heads" if level == "head" else "candidate neurons"
    fig.suptitle(
        f"{result.model}: additive scores against zero-ablation effects, {plural}, {_scope(result)}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _scope(result: FaithfulnessResult) -> str:
    count = len(result.predictions)
    if result.dataset is None:
        return "one prediction"
    return f"{count} predictions in {result.num_seqs} windows of {result.dataset}"


def _band(ax: Axes, sizes: Sequence[int], means: Sequence[Mean], colour: str) -> None:
    low = [m.low for m in means]
    if all(math.isnan(v) for v in low):
        return
    ax.fill_between(sizes, low, [m.high for m in means], color=colour, alpha=0.12, linewidth=0)


def curves_figure(result: FaithfulnessResult) -> Figure:
    """ablation_curves.png: Δ log p(target) and Δ reciprocal rank against the number of neurons
    ablated together (log axis), one line per selection method (95% bands over a corpus)."""
    fig = new_figure(11.0, 4.2)
    left, right = fig.subplots(1, 2)
    for method in SELECTIONS:
        points = result.curve(method)
        if not points:
            continue
        colour, marker = _METHOD_STYLES[method]
        sizes = [p.n for p in points]
        style = "--" if method in ("random", "effect") else "-"
        for ax, means in (
            (left, [p.d_logprob for p in points]),
            (right, [p.d_reciprocal_rank for p in points]),
        ):
            ax.plot(
                sizes,
                [m.value for m in means],
                style,
                marker=marker,
                markersize=4,
                color=colour,
                label=SCORE_LABELS[method],
            )
            _band(ax, sizes, means, colour)
    for ax, label in ((left, "Δ log p(target) (patched − clean)"), (right, "Δ reciprocal rank 1/(rank+1)")):
        ax.set_xscale("log")
        ax.set_xlabel("neurons ablated together (top-n by each method)")
        ax.set_ylabel(label)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.grid(alpha=0.3, which="both")
    left.legend(fontsize=8)
    fig.suptitle(f"{result.model}: ablating the top-n neurons, {_scope(result)}", fontsize=10)
    fig.tight_layout()
    return fig


def _drawings(result: FaithfulnessResult) -> list[tuple[str, Figure]]:
    return [
        ("scatter_heads.png", scatter_figure(result, "head")),
        ("scatter_neurons.png", scatter_figure(result, "neuron")),
        ("ablation_curves.png", curves_figure(result)),
    ]


# ----------------------------------------------------------------------------- the page
def _heading(result: FaithfulnessResult) -> str:
    model = html.escape(result.model)
    if result.dataset is None:
        prediction = result.predictions[0]
        tokens = "".join(
            f"<span class='{'position' if i == prediction.position else 'before'}'>"
            f"{html.escape(show_token(t))}</span>"
            for i, t in enumerate(result.tokens[: prediction.position + 1])
        )
        target = html.escape(show_token(prediction.target))
        return (
            f"<h1>Do the additive scores predict the ablation effect? {model}</h1>"
            f"<h2>Text</h2><p class='text'>{tokens} → <span class='target'>{target}</span></p>"
        )
    dataset = html.escape(result.dataset)
    return (
        f"<h1>Do the additive scores predict the ablation effect? {model} on {dataset}</h1>"
        f"<p>{len(result.predictions)} predictions in {result.num_seqs} windows of {result.seq_len} tokens; "
        "each statistic is averaged over a window's predictions, then over windows (95% intervals over "
        "windows).</p>"
    )


def _rules_html(result: FaithfulnessResult) -> str:
    items = "".join(f"<li>{html.escape(rule)}</li>" for rule in result.rules)
    return f"<ul>{items}</ul>" if items else ""


def faithfulness_html(result: FaithfulnessResult, images: Sequence[Path]) -> str:
    """ablate.html: what was measured, the agreement and curves tables, the predictions and
    every figure in `images` embedded; loads nothing from anywhere."""
    figures = "".join(file_figure_html(image, CAPTIONS.get(Path(image).name, "")) for image in images)
    return (
        "<!doctype html><html lang='en'><meta charset='utf-8'>"
        f"<title>resstream ablate (faithfulness): {html.escape(result.model)}</title>"
        f"<style>{PAGE_STYLE}</style>{_heading(result)}"
        f"<h2>How it was measured</h2>{_rules_html(result)}{notes_section(result.notes)}"
        "<h2>Agreement with the exact effect</h2>"
        f"<p class='caption'>{html.escape(CAPTIONS['agreement.csv'])}</p>"
        f"{frame_html(agreement_table(result), 40)}"
        f"<h2>Ablation curves: Δ log p(target)</h2><p class='caption'>{html.escape(CURVES_TABLE)}</p>"
        f"{frame_html(curves_table(result), 40)}"
        f"<h2>Figures</h2>{figures}"
        f"<h2>Predictions</h2>{_predictions_html(result)}</html>"
    )


def write_faithfulness_report(result: FaithfulnessResult, out_dir: Directory) -> list[Path]:
    """Every file of the faithfulness check in `out_dir` (a folder or an output set):
    ablate.json (`result.to_dict()`), agreement.csv, curves.csv and components.csv (slices of
    `faithfulness_frame`), the PNGs of `FIGURES` and ablate.html; returns the paths written."""
    json_path = output_path(out_dir, JSON_FILE)
    write_json(json_path, result.to_dict())
    frame = faithfulness_frame(result)
    tables = []
    for name in CSV_TABLES:
        path = output_path(out_dir, name)
        write_text(path, frame_csv(csv_frame(result, name, frame)))
        tables.append(path)
    images = [save_figure(figure, output_path(out_dir, name)) for name, figure in _drawings(result)]
    page = output_path(out_dir, HTML_FILE)
    write_text(page, faithfulness_html(result, images))
    return [json_path, *tables, *images, page]


# ----------------------------------------------------------------------------- terminal
def terminal_summary(result: FaithfulnessResult) -> str:
    """A command's lines: what was measured, then per level and score Spearman's ρ and the
    top-k overlap, the direct shares, each method's Δ log p at the largest n, and the notes."""
    lines = [f"faithfulness of the additive scores on {result.model}, {_scope(result)}"]
    for a in result.agreement:
        lines.append(
            f"  {a.level:<6} {a.score:<10}  Spearman ρ {_interval(a.spearman):<28}  "
            f"top-{a.k} overlap {_interval(a.top_k_overlap)}"
        )
    for d in result.direct_shares:
        lines.append(f"  {d.level:<6} direct share of the total effect {_interval(d.share)}")
    for method in SELECTIONS:
        points = result.curve(method)
        if points:
            last = points[-1]
            lines.append(f"  top-{last.n} by {method}: Δ log p {_interval(last.d_logprob)}")
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- notebook
def faithfulness_view(result: FaithfulnessResult) -> NotebookView:
    """What `result` shows in a notebook: the notes, the page's tables and every figure with its
    caption."""
    tables = [Table("notes", notes_html(result.notes))] if result.notes else []
    tables += [
        frame_table("agreement with the exact effect", agreement_table(result), 40),
        frame_table(
            "ablation curves: Δ log p(target) (patched − clean), the top-n neurons of each method ablated",
            curves_table(result),
            40,
        ),
    ]
    pictures = [Picture(figure, f"{name}: {CAPTIONS[name]}") for name, figure in _drawings(result)]
    return NotebookView(tables=tables, pictures=pictures)


register_result(FaithfulnessResult, faithfulness_frame, faithfulness_view)
