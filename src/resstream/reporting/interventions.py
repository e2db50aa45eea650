"""What `resstream ablate` and `resstream patch` write and show: the renderers of an
`InterventionResult`. They arrange its numbers and compute nothing new.

* `effects_frame` (`to_pandas()`, effects.csv): one row per effect and metric, `EFFECT_COLUMNS`;
  `top_effects_frame` its rows of the headline metric with the largest |difference| (the page's,
  the notebook's and the terminal's table).
* Figures (`intervention_figures`, each drawn only when its data exists): heads.png
  (`head_heatmap_figure`, layer × head, total and direct effect), neurons.png
  (`neuron_strip_figure`, total beside direct per neuron) and residual.png
  (`residual_grid_figure`, layer × position, the classic activation-patching picture).
* `write_intervention_report`: ablate.json / patch.json (`to_dict()`), effects.csv, the PNGs and
  ablate.html / patch.html, a page that loads nothing from anywhere (figures as data: URIs,
  every text from data escaped, no script); `--atp` also screen.csv (`reporting.screen`). Where
  the direct path was not measured, the page and the terminal say so and how to ask for it.
* `terminal_summary` (the command's lines) and the notebook view (the page's tables and figures).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from resstream.analysis.interventions.components import ComponentSpace, parse_component
from resstream.analysis.interventions.results import EFFECT_COLUMNS, Effect, InterventionResult
from resstream.io import write_json, write_text
from resstream.reporting import screen as atp
from resstream.reporting.attribute.common import Directory, output_path
from resstream.reporting.attribute.drawing import literal, token_label, zero_line
from resstream.reporting.attribute.heads import diverging_heatmap
from resstream.reporting.attribute.page import PAGE_STYLE, key_values_html, notes_html, notes_section
from resstream.reporting.figures import figure_token, new_figure, save_figure
from resstream.reporting.html import file_figure_html
from resstream.reporting.notebook import (
    NotebookView,
    Picture,
    Table,
    frame_csv,
    frame_html,
    long_frame,
    register_result,
)
from resstream.reporting.text import show_token

if TYPE_CHECKING:
    import pandas

__all__ = [
    "CAPTIONS",
    "CSV_FILE",
    "NEURONS_SHOWN",
    "TERMINAL_SHOWN",
    "TOP_COLUMNS",
    "TOP_SHOWN",
    "Drawing",
    "caption",
    "effects_frame",
    "head_heatmap_figure",
    "intervention_figures",
    "intervention_html",
    "intervention_view",
    "metric_label",
    "mode_text",
    "neuron_strip_figure",
    "paths_text",
    "prediction_html",
    "ranking_text",
    "residual_grid_figure",
    "terminal_summary",
    "top_effects_frame",
    "top_effects_html",
    "top_effects_title",
    "write_intervention_report",
]

CSV_FILE = "effects.csv"
#: Rows of the page's and the notebook's table of the largest effects, and of the terminal's.
TOP_SHOWN = 20
TERMINAL_SHOWN = 10
#: Neurons drawn in neurons.png (the largest |total effect| first; effects.csv has all).
NEURONS_SHOWN = 30
#: Colours of the two paths wherever they are drawn side by side, and of attribution
#: patching's first-order estimates beside the exact effects.
TOTAL_COLOUR = "#404040"
DIRECT_COLOUR = "#f4a582"
ESTIMATE_COLOUR = "#92c5de"
#: The columns of the table of the largest effects (a slice of `effects_frame`).
TOP_COLUMNS = ("component", "kind", "mode", "path", "patched", "difference", "fraction", "estimate")

#: What a heatmap's colour means: the headline metric's change (ablation), or the fraction of
#: the clean − corrupt gap (activation patching, `_shows_fraction`).
_DIFFERENCE_COLOURS = (
    "the headline metric's change, patched − clean: red raises the target, blue lowers it, white is no effect"
)
_FRACTION_COLOURS = (
    "the fraction of the clean − corrupt gap the patched run sits at, (patched − corrupt) / (clean − "
    "corrupt): red 1 = as the clean run, white 0 = as the corrupted run, blue below it"
)
#: How to read each figure: the one-line captions under it on the page and in a notebook
#: ({colours}: one of the two above).
CAPTIONS = {
    "heads.png": "Every attention head intervened on alone, when the change travels everywhere downstream "
    "(total) and, where measured, when it reaches the logits only through the residual stream, every "
    "later component and the final norm's scale held (direct, a second panel). Colour: {colours}; "
    "grey: not intervened on; each panel has its own symmetric scale.",
    "neurons.png": "The neurons intervened on, the largest |total effect| at the top: total effect (dark) "
    "beside direct effect (light, where measured) on the headline metric: {colours}.",
    "residual.png": "The residual stream at the input of each block (row L; the last row is the final "
    "state) at each position, patched alone, the change travelling everywhere downstream. Colour: "
    "{colours}. Position labels read clean / corrupted token where the texts differ.",
}


def caption(result: InterventionResult, name: str) -> str:
    """How to read figure `name` of `result` (`CAPTIONS`)."""
    colours = _FRACTION_COLOURS if _shows_fraction(result) else _DIFFERENCE_COLOURS
    captions = {**CAPTIONS, **atp.ATP_CAPTIONS} if result.screened else CAPTIONS
    return captions.get(name, "").format(colours=colours)


# ----------------------------------------------------------------------------- the frame
def _metric_rows(result: InterventionResult, effect: Effect) -> list[tuple[str, Any, Any, Any, Any, Any]]:
    """(metric, clean, patched, difference, fraction, estimate) of one effect, metric by metric:
    logprob, logit, logit_diff (with a foil), rank, kl (clean 0, the difference is kl itself);
    the estimate stands on the headline metric's row."""
    clean = result.clean

    def estimate(metric: str) -> float | None:
        return effect.estimate if metric == result.metric else None

    logprob = (effect.logprob, effect.d_logprob, effect.fraction_logprob, estimate("logprob"))
    rows: list[tuple[str, Any, Any, Any, Any, Any]] = [
        ("logprob", clean.logprob, *logprob),
        ("logit", clean.logit, effect.logit, effect.d_logit, None, None),
    ]
    if result.foil_id is not None:
        rows.append(
            (
                "logit_diff",
                clean.logit_diff,
                effect.logit_diff,
                effect.d_logit_diff,
                effect.fraction_logit_diff,
                estimate("logit_diff"),
            )
        )
    rows.append(("rank", clean.rank, effect.rank, effect.d_rank, None, None))
    rows.append(("kl", 0.0, effect.kl, effect.kl, None, None))
    return rows


def effects_frame(result: InterventionResult) -> pandas.DataFrame:
    """`result.to_pandas()` and effects.csv: one row per effect and metric, `EFFECT_COLUMNS`
    (documented by `InterventionResult`), in the order of `result.effects`."""
    rows = [
        (effect.component, effect.kind, effect.layer, effect.index, effect.mode, effect.path, *metric_row)
        for effect in result.effects
        for metric_row in _metric_rows(result, effect)
    ]
    return long_frame(
        EFFECT_COLUMNS,
        rows,
        integers=("layer", "index"),
        floats=("clean", "patched", "difference", "fraction", "estimate"),
    )


def top_effects_frame(result: InterventionResult, count: int = TOP_SHOWN) -> pandas.DataFrame:
    """The `count` rows of `effects_frame` of the headline metric (`result.metric`) that moved
    it most from the run intervened on, largest first, in `TOP_COLUMNS` (fraction and estimate
    only when some effect has one): by |difference| (patched − clean), but by |fraction| when
    the corrupted run was patched (`denoise`: there the clean − corrupt gap is in every
    difference, and the fraction is the change from the corrupted run, in units of the gap)."""
    frame = effects_frame(result)
    frame = frame[frame["metric"] == result.metric]
    moved = frame["fraction" if _ranks_by_fraction(result) else "difference"].abs()
    order = moved.sort_values(ascending=False, kind="stable", na_position="last").index
    top = frame.loc[order[:count], list(TOP_COLUMNS)].reset_index(drop=True)
    empty = [column for column in ("fraction", "estimate") if top[column].isna().all()]
    return top.drop(columns=empty)


def _ranks_by_fraction(result: InterventionResult) -> bool:
    """Whether the largest effects are those with the largest |fraction| (`top_effects_frame`)."""
    name = f"fraction_{result.metric}"
    return result.mode == "denoise" and any(getattr(e, name) is not None for e in result.effects)


def ranking_text(result: InterventionResult) -> str:
    """How the largest effects are chosen, in words."""
    if _ranks_by_fraction(result):
        return (
            "the largest |fraction| (the change from the corrupted run, in units of the clean − corrupt gap)"
        )
    return "the largest |difference| (patched − clean)"


# ------------------------------------------------------------------------------- labels
def metric_label(result: InterventionResult) -> str:
    """The headline metric in words: log p(target), or the target − foil logit difference."""
    return "logit difference target − foil" if result.metric == "logit_diff" else "log p(target)"


def _difference_label(result: InterventionResult) -> str:
    unit = "" if result.metric == "logit_diff" else " (nats)"
    return f"Δ {metric_label(result)}{unit}, patched − clean"


def mode_text(result: InterventionResult) -> str:
    """What was done: "zero ablation", "activation patching, noise (corrupted → clean run)",
    attribution patching with how many estimates were confirmed..."""
    if result.command == "patch":
        runs = "corrupted → clean run" if result.mode == "noise" else "clean → corrupted run"
        if not result.screened:
            return f"activation patching, {result.mode} ({runs})"
        confirmed = sum(s.confirmed for s in result.screened)
        if not confirmed:
            return f"attribution patching, {result.mode} ({runs}): first-order estimates only, none confirmed"
        return (
            f"attribution patching, {result.mode} ({runs}): first-order estimates, the top {confirmed} "
            "confirmed by exact activation patching"
        )
    return f"{result.mode} ablation"


def paths_text(result: InterventionResult) -> str | None:
    """That the direct path was not measured, and how to ask for it (None: it was, or AtP)."""
    if result.direct or result.screened:
        return None
    return "direct path not computed (total path only): `direct=True` measures it too"


def _title(result: InterventionResult) -> str:
    """The figures' title: model, what was done, the target and its position, the clean metric."""
    after = token_label(result.tokens[result.position]) if 0 <= result.position < len(result.tokens) else ""
    foil = f", foil {token_label(result.foil)}" if result.foil is not None else ""
    clean = getattr(result.clean, result.metric)
    return (
        f"{literal(result.model)}: {mode_text(result)}\ntarget {token_label(result.target)}{foil} after "
        f"position {result.position} {after} (clean {metric_label(result)} {clean:.3f})"
    )


def _headline(effect: Effect, result: InterventionResult) -> float:
    """The effect's change of the headline metric (nan where it has none)."""
    value = getattr(effect, "d_" + result.metric)
    return math.nan if value is None else float(value)


def _measured(result: InterventionResult, kind: str, path: str) -> list[Effect]:
    """The exact interventions of one kind along one path (first-order estimates left out)."""
    return [effect for effect in result.select(kind=kind, path=path) if effect.mode != "atp"]


# ------------------------------------------------------------------------------ figures
def _shows_fraction(result: InterventionResult) -> bool:
    """Whether the figures show the fraction of the clean − corrupt gap rather than the
    difference patched − clean: when denoising with a gap (every difference there holds the
    whole gap; the fraction reads 1 = restored to the clean run, 0 = still the corrupted one).
    Ablation and noising show the difference: a component that matters moves the prediction
    away from the clean run, and one that does not stays white. Attribution patching shows
    the difference, which its estimates are of."""
    return _ranks_by_fraction(result) and not result.screened


def _shown(effect: Effect, result: InterventionResult) -> float:
    """What a heatmap cell shows of `effect` (`_shows_fraction`); nan where it has none."""
    if not _shows_fraction(result):
        return _headline(effect, result)
    value = getattr(effect, f"fraction_{result.metric}")
    return math.nan if value is None else float(value)


def _shown_labels(result: InterventionResult) -> tuple[str, str]:
    """The heatmaps' quantity in a title and on the colour bar."""
    if _shows_fraction(result):
        return f"fraction of the {metric_label(result)} gap", "fraction: 0 = corrupted run, 1 = clean run"
    return f"Δ {metric_label(result)}", _difference_label(result)


def _head_matrix(result: InterventionResult, path: str) -> np.ndarray:
    """Layers × heads of `_shown` along `path`; nan where no head was measured."""
    matrix = np.full((result.n_layers, result.n_heads), np.nan)
    for effect in _measured(result, "head", path):
        matrix[effect.layer, effect.index] = _shown(effect, result)
    return matrix


def head_heatmap_figure(result: InterventionResult) -> Figure:
    """heads.png: a layer × head heatmap of the headline metric's change (patched − clean) for
    the total effect and, when measured, a second one for the direct effect; each centred at 0
    on its own symmetric scale (red raises the target, blue lowers it). Activation patching
    shows the fraction of the clean − corrupt gap instead (`_shows_fraction`)."""
    if result.screened:
        panels = [
            ("attribution patching: first-order estimate of each head", atp.estimate_matrix(result)),
            ("activation patching: exact effect of the confirmed heads", _head_matrix(result, "total")),
        ]
        panels = panels if result.effects else panels[:1]  # `confirm` 0: the estimates alone
    else:
        panels = [(f"{path} effect of each head", _head_matrix(result, path)) for path in ("total", "direct")]
        panels = panels if _measured(result, "head", "direct") else panels[:1]
    per_head = 0.5 if result.n_layers * result.n_heads <= 256 else 0.2
    width = min(8.0, max(4.0, 2.2 + per_head * result.n_heads))
    fig = new_figure(len(panels) * width, min(9.0, max(3.4, 2.0 + 0.35 * result.n_layers)))
    fig.set_layout_engine("constrained", w_pad=0.15)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    name, label = _shown_labels(result)
    for ax, (what, matrix) in zip(axes, panels, strict=True):
        diverging_heatmap(fig, ax, matrix, what, label)
    if result.screened and result.effects:
        unconfirmed = Patch(facecolor="#dddddd", edgecolor=atp.UNCONFIRMED_COLOUR, label=atp.UNCONFIRMED)
        axes[-1].legend(handles=[unconfirmed], loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8)
    fig.suptitle(f"{_title(result)}\n{name}", fontsize=9)
    return fig


def neuron_strip_figure(result: InterventionResult) -> Figure:
    """neurons.png: each neuron intervened on (at most NEURONS_SHOWN, the largest |total
    effect| at the top) as a pair of horizontal bars, total effect beside direct effect on the
    headline metric, labelled L<layer>.N<neuron>. Attribution patching: the neurons with the
    largest |estimate|, the estimate beside the exact effect of those confirmed
    (`_screened_neurons`)."""
    if result.screened:
        return _screened_neurons(result)
    direct = {effect.component: effect for effect in _measured(result, "neuron", "direct")}
    total = sorted(
        _measured(result, "neuron", "total"), key=lambda e: -abs(np.nan_to_num(_shown(e, result)))
    )[:NEURONS_SHOWN]
    names = [e.component for e in total]
    bars = [(TOTAL_COLOUR, "total", [_shown(e, result) for e in total])]
    if direct:
        values = [_shown(direct[name], result) if name in direct else np.nan for name in names]
        bars.append((DIRECT_COLOUR, "direct", values))
    fig, _ = _bar_pairs(names, bars, _shown_labels(result)[1])
    shown = f"{len(total)} neuron{'s' if len(total) != 1 else ''}, largest |total effect| first"
    fig.suptitle(f"{_title(result)}\n{shown}", fontsize=9)
    return fig


def _screened_neurons(result: InterventionResult) -> Figure:
    """neurons.png of attribution patching: the NEURONS_SHOWN neurons with the largest
    |estimate|, largest first, attribution patching's estimate beside the exact effect of
    activation patching where it was confirmed; the names of the others grey."""
    screened = [s for s in result.screened if s.kind == "neuron"][:NEURONS_SHOWN]
    exact = {effect.component: effect for effect in _measured(result, "neuron", "total")}
    names = [s.component for s in screened]
    bars = [
        (ESTIMATE_COLOUR, "attribution patching: first-order estimate", [s.estimate for s in screened]),
        (
            TOTAL_COLOUR,
            "activation patching: exact effect (confirmed)",
            [_shown(exact[name], result) if name in exact else np.nan for name in names],
        ),
    ]
    fig, ax = _bar_pairs(names, bars, _shown_labels(result)[1], legend=False)
    for label, s in zip(ax.get_yticklabels(), screened, strict=True):
        if not s.confirmed:
            label.set_color(atp.UNCONFIRMED_COLOUR)
    handles, _ = ax.get_legend_handles_labels()
    unconfirmed = Patch(facecolor="none", edgecolor="none", label=f"names in {atp.UNCONFIRMED}")
    fig.legend(  # below the axes: no bar under it
        handles=[*handles, unconfirmed], fontsize=8, loc="outside lower center", ncols=2
    )
    shown = f"{len(screened)} neuron{'s' if len(screened) != 1 else ''}, largest |estimate| first"
    fig.suptitle(f"{_title(result)}\n{shown}", fontsize=9)
    return fig


def _bar_pairs(
    names: Sequence[str], bars: Sequence[tuple[str, str, Sequence[float]]], label: str, *, legend: bool = True
) -> tuple[Figure, Axes]:
    """A figure of one row per name, each with one horizontal bar per (colour, legend label,
    values) side by side, the first row at the top; x labelled `label`; a legend in the axes
    unless the caller places its own."""
    fig = new_figure(7.2, max(2.6, 1.6 + 0.34 * len(names)))
    fig.set_layout_engine("constrained")
    ax = fig.add_subplot()
    rows = np.arange(len(names))
    height = 0.8 / len(bars)
    for k, (colour, what, values) in enumerate(bars):
        offset = (k - (len(bars) - 1) / 2) * height
        ax.barh(rows + offset, values, height=height, color=colour, label=what)
    ax.set_yticks(rows, names, fontsize=8, family="monospace")
    ax.set_ylim(len(names) - 0.5, -0.5)
    zero_line(ax, vertical=True)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel(label)
    if legend:
        ax.legend(fontsize=8, loc="best")
    return fig, ax


def _resid_position(effect: Effect, result: InterventionResult) -> int:
    """The position of a residual-state effect, read from its name (`L2.resid@5`: 5)."""
    space = ComponentSpace(result.n_layers, result.n_heads, 0)
    return parse_component(effect.component.split("+")[0], space).position


def _residual_matrix(result: InterventionResult) -> np.ndarray:
    """(layers + 1) × positions of `_shown` of each residual state's total effect; nan where
    no state was patched."""
    matrix = np.full((result.n_layers + 1, len(result.tokens)), np.nan)
    for effect in _measured(result, "resid", "total"):
        matrix[effect.layer, _resid_position(effect, result)] = _shown(effect, result)
    return matrix


def _position_labels(result: InterventionResult) -> list[str]:
    """Each position's token; "clean / corrupted" where the corrupted text differs there."""
    corrupt = result.corrupt_tokens or result.tokens
    labels = []
    for index, (token, other) in enumerate(zip(result.tokens, corrupt, strict=False)):
        label = figure_token(token, limit=12)
        if other != token:
            label += " / " + figure_token(other, limit=12)
        labels.append(f"{label} {index}")
    return labels


def residual_grid_figure(result: InterventionResult) -> Figure:
    """residual.png: the residual state at each block's input (rows; the last is the final
    state) and position (columns, the tokens as labels), patched alone: the fraction of the
    clean − corrupt gap (`fraction_logprob`, or `fraction_logit_diff` with a foil) in activation
    patching, else the headline metric's change; centred at 0 on a symmetric scale."""
    matrix = _residual_matrix(result)
    name, label = _shown_labels(result)
    title = "each residual state alone: " + (
        "(patched − corrupt) / (clean − corrupt)" if _shows_fraction(result) else name
    )
    rows, positions = matrix.shape
    fig = new_figure(min(16.0, max(5.0, 2.6 + 0.55 * positions)), min(10.0, max(3.6, 2.6 + 0.38 * rows)))
    fig.set_layout_engine("constrained")
    ax = fig.add_subplot()
    diverging_heatmap(fig, ax, matrix, title, label)
    ax.set_xticks(range(positions), _position_labels(result), rotation=60, ha="right", fontsize=8)
    names = [f"L{layer}" for layer in range(rows - 1)] + [f"L{rows - 1} (final)"]
    ax.set_yticks(range(rows), names, fontsize=8)
    ax.set_xlabel("position (token)")
    ax.set_ylabel("input of block")
    fig.suptitle(_title(result), fontsize=9)
    return fig


#: A figure's file name and how to draw it.
Drawing = tuple[str, Callable[[], Figure]]


def intervention_figures(result: InterventionResult) -> list[Drawing]:
    """Each figure `result` has data for, as (PNG file name, how to draw it): heads.png when
    heads were intervened on, neurons.png when neurons were, residual.png when residual states
    were."""
    figures: list[Drawing] = []
    estimated = {s.kind for s in result.screened}  # attribution patching: drawn from its estimates too
    if _measured(result, "head", "total") or _measured(result, "head", "direct") or "head" in estimated:
        figures.append(("heads.png", lambda: head_heatmap_figure(result)))
    if _measured(result, "neuron", "total") or "neuron" in estimated:
        figures.append(("neurons.png", lambda: neuron_strip_figure(result)))
    if _measured(result, "resid", "total"):
        figures.append(("residual.png", lambda: residual_grid_figure(result)))
    return figures


# --------------------------------------------------------------------------------- page
def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def _text_html(tokens: Sequence[str], position: int, target: str | None, others: Sequence[str] = ()) -> str:
    """The text as tokens, the predicting position marked, later tokens greyed, the target (when
    given) after the position; a token that differs from `others` at its place is marked."""
    spans = []
    for index, token in enumerate(tokens):
        kind = "position" if index == position else "after" if index > position else "before"
        if index < len(others) and others[index] != token:
            kind += " changed"
        spans.append(f'<span class="{kind}">{html.escape(show_token(token))}</span>')
        if index == position and target is not None:
            spans.append(f'→ <span class="target">{html.escape(show_token(target))}</span>')
    return f"<p class='text'>{''.join(spans)}</p>"


def prediction_html(result: InterventionResult) -> str:
    """The prediction as a table: what was done, the target (and foil), the clean metrics and,
    for activation patching, the corrupted run's."""
    pairs = [
        ("intervention", mode_text(result)),
        ("target", f"{show_token(result.target)} (id {result.target_id})"),
    ]
    if result.foil is not None:
        pairs.append(("foil", f"{show_token(result.foil)} (id {result.foil_id})"))
    pairs.append(("position", f"{result.position} ({show_token(result.tokens[result.position])})"))
    shown = "every position" if result.positions is None else ", ".join(map(str, result.positions))
    pairs.append(("intervened at", shown))
    if not result.screened:
        measured = "total and direct" if result.direct else _DIRECT_NOT_COMPUTED
        pairs.append(("paths measured", measured))
    if result.samples is not None:
        pairs.append(("resampled windows", str(result.samples)))
    runs = [("clean", result.clean)] + ([("corrupted", result.corrupt)] if result.corrupt is not None else [])
    for name, run in runs:
        pairs += [
            (f"{name} log p(target)", _number(run.logprob)),
            (f"{name} logit (before soft-capping)", _number(run.logit)),
            (f"{name} rank (0 = top-1)", str(run.rank)),
        ]
        if run.logit_diff is not None:
            pairs.append((f"{name} logit difference target − foil", _number(run.logit_diff)))
    return str(key_values_html(pairs))


def top_effects_title(result: InterventionResult, count: int = TOP_SHOWN) -> str:
    """The title of the table of the largest effects."""
    return f"the {count} largest effects on {metric_label(result)}"


#: The page's words for a result without the direct path (`paths_text`: the terminal's).
_DIRECT_NOT_COMPUTED = (
    "total only; the direct path was not computed (ask for it with direct=True, --direct on the command line)"
)


def top_effects_html(result: InterventionResult, count: int = TOP_SHOWN) -> str:
    """The table of the largest effects (`top_effects_frame`) with how to read it."""
    direct = (
        "direct: through the residual stream to the logits only."
        if result.direct or result.screened
        else f"{_DIRECT_NOT_COMPUTED}."
    )
    caption = (
        f"The rows of {CSV_FILE} of metric {result.metric} with {ranking_text(result)}, of "
        f"{len(result.effects)} effects; path total: everything downstream recomputes, {direct}"
    )
    table = frame_html(top_effects_frame(result, count), count)
    return f"<p class='caption'>{html.escape(caption)}</p>{table}"


_STYLE = PAGE_STYLE + ".text .changed{background:#fbb4ae;border-color:#c33}"


def intervention_html(result: InterventionResult, images: Sequence[Path]) -> str:
    """ablate.html / patch.html: the text (and the corrupted text), the prediction, notes, the
    largest effects and every figure in `images` embedded; loads nothing from anywhere."""
    patching = "Attribution patching" if result.screened else "Activation patching"
    what = "Ablation" if result.command == "ablate" else patching
    heading = (
        f"<h1>{what} on {html.escape(result.model)}: target ‘{html.escape(show_token(result.target))}’ "
        f"after position {result.position}</h1><p>{html.escape(mode_text(result))}. The marked token is "
        "the predicting position, the green one the target, grey tokens come later.</p>"
    )
    text = f"<h2>Text</h2>{_text_html(result.tokens, result.position, result.target)}"
    if result.corrupt_tokens is not None:
        corrupted = _text_html(result.corrupt_tokens, result.position, None, result.tokens)
        text += f"<h3>Corrupted text (tokens that differ marked red)</h3>{corrupted}"
    notes = notes_section(result.notes)
    figures = "".join(file_figure_html(image, caption(result, Path(image).name)) for image in images)
    return (
        f"<!doctype html><html lang='en'><meta charset='utf-8'>"
        f"<title>resstream {html.escape(result.command)}: {html.escape(result.model)}</title>"
        f"<style>{_STYLE}</style>{heading}{text}<h2>Prediction</h2>{prediction_html(result)}{notes}"
        f"<h2>{html.escape(top_effects_title(result).capitalize())}</h2>{top_effects_html(result)}"
        f"<h2>Figures</h2>{figures}</html>"
    )


def write_intervention_report(result: InterventionResult, directory: Directory) -> list[Path]:
    """Every file of `resstream ablate` / `resstream patch` in `directory` (a folder or an
    output set): `{command}.json` (`result.to_dict()`), effects.csv (`effects_frame`), AtP's
    screen.csv, the PNGs of `intervention_figures` and the page `{command}.html`; returns the
    paths written."""
    json_path = output_path(directory, f"{result.command}.json")
    write_json(json_path, result.to_dict())
    csv_path = output_path(directory, CSV_FILE)
    write_text(csv_path, frame_csv(effects_frame(result)))
    screen = atp.write_screen(result, directory)
    drawings = intervention_figures(result)
    images = [save_figure(draw(), output_path(directory, name)) for name, draw in drawings]
    page = output_path(directory, f"{result.command}.html")
    write_text(page, intervention_html(result, images))
    return [json_path, csv_path, *screen, *images, page]


# ----------------------------------------------------------------------------- terminal
def terminal_summary(result: InterventionResult, count: int = TERMINAL_SHOWN) -> str:
    """The command's lines: what was done, the clean (and corrupted) prediction, the `count`
    largest effects on the headline metric (`top_effects_frame`), total and direct (with
    attribution patching, what its two columns are), and the notes."""
    after = show_token(result.tokens[result.position])
    lines = [
        f"{result.command} ({mode_text(result)}) on {result.model}: target {show_token(result.target)!r} "
        f"(id {result.target_id}) after position {result.position} {after!r}"
        + (f", foil {show_token(result.foil)!r}" if result.foil is not None else "")
    ]
    runs = [("clean", result.clean)] + ([("corrupted", result.corrupt)] if result.corrupt is not None else [])
    for name, run in runs:
        diff = f", logit difference {run.logit_diff:.4g}" if run.logit_diff is not None else ""
        lines.append(f"  {name}: log p {run.logprob:.4g}, logit {run.logit:.4g}, rank {run.rank}{diff}")
    top = top_effects_frame(result, count)
    lines.append(
        f"the effects on {metric_label(result)} with {ranking_text(result)}, of {len(result.effects)}:"
    )
    width = max([len("component"), *(len(c) for c in top["component"])])
    extra = [column for column in ("fraction", "estimate") if column in top.columns]
    header = f"  {'component':<{width}}  {'path':<8}  {'difference':>10}"
    lines.append(header + "".join(f"  {column:>10}" for column in extra))
    for row in top.itertuples(index=False):
        values = "".join(f"  {_cell(getattr(row, column)):>10}" for column in extra)
        lines.append(f"  {row.component:<{width}}  {row.path:<8}  {row.difference:>+10.4f}{values}")
    if top.empty:
        lines.append("  (no effects)")
    if result.screened and not result.effects:
        lines += atp.largest_estimates(result, count)
    if result.screened:
        lines.append(
            "  difference: exact activation patching of the confirmed components; estimate: attribution "
            f"patching's first-order estimate ({len(result.screened)} kept in {result.command}.json, "
            f"every head and neuron in {atp.SCREEN_FILE})"
        )
    lines += [f"  {paths}" for paths in [paths_text(result)] if paths is not None]
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    """A number of the terminal's table; "" where it is missing."""
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return "" if missing else _number(value)


# ----------------------------------------------------------------------------- notebook
def intervention_view(result: InterventionResult) -> NotebookView:
    """What `result` shows in a notebook: the prediction, the notes, the largest effects (the
    page's tables) and every figure with its caption."""
    tables = [Table("prediction", prediction_html(result))]
    if result.notes:
        tables.append(Table("notes", notes_html(result.notes)))
    tables.append(Table(top_effects_title(result), top_effects_html(result)))
    drawings = intervention_figures(result)
    pictures = [Picture(draw(), f"{name}: {caption(result, name)}") for name, draw in drawings]
    return NotebookView(tables=tables, pictures=pictures)


register_result(InterventionResult, effects_frame, intervention_view)
