"""Steering sweeps and attenuation maps: figures, tables, terminal lines, page, notebook view."""

from __future__ import annotations

import html
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from resstream.analysis.steering.sweep import AttenuationResult, SteerPoint, SteerResult
from resstream.io import write_text
from resstream.reporting.figures import figure_png, new_figure, save_figure
from resstream.reporting.html import figure_html
from resstream.reporting.notebook import NotebookView, Picture, Table, frame_html, register_result

if TYPE_CHECKING:
    import pandas
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# --------------------------------------------------------------------------- steer

#: The columns of steer.csv (`steer_frame`).
STEER_COLUMNS = ("site", "coef", "concept_score", "concept_logprob", "kl", "perplexity", "changed", "example")
STEER_CAPTION = (
    "Each curve is one site, each point one coefficient (labelled). Left: the concept probe's "
    "probability of the steered continuations (read by the unsteered model) against the KL from "
    "the unsteered model on neutral text; middle: the concept tokens' log-probability; right: "
    "the continuations' perplexity under the unsteered model. Up and to the left is a cheap steer."
)


def steer_frame(result: SteerResult) -> pandas.DataFrame:
    """One row per site and coefficient: `STEER_COLUMNS`."""
    import pandas as pd

    return pd.DataFrame(
        [{c: getattr(p, c) for c in STEER_COLUMNS} for p in result.points], columns=STEER_COLUMNS
    )


def steer_figure(result: SteerResult) -> Figure:
    """steer.png: the trade-off curves (`STEER_CAPTION`)."""
    fig = new_figure(14.0, 4.4)
    axes = fig.subplots(1, 3)
    panels = (
        (
            "concept_score",
            "kl",
            "concept probe probability",
            "KL from unsteered on neutral text (nats/token)",
        ),
        ("concept_logprob", "kl", "log p(concept tokens)", "KL from unsteered on neutral text (nats/token)"),
        ("perplexity", "coef", "continuation perplexity (unsteered model, log)", "coefficient"),
    )
    for ax, (y, x, ylabel, xlabel) in zip(axes, panels, strict=True):
        _draw_curves(ax, result, x, y)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
        if y == "perplexity":
            ax.set_yscale("log")  # a steer that breaks the text costs orders of magnitude
    fig.suptitle(f"Steering {result.model}: what each coefficient buys and costs", fontsize=11)
    fig.tight_layout()
    return fig


def _draw_curves(ax: Axes, result: SteerResult, x: str, y: str) -> None:
    drawn = False
    for site in result.sites:
        points = [p for p in result.curve(site) if getattr(p, y) is not None]
        if not points:
            continue
        xs = [float(getattr(p, x)) for p in points]
        ys = [float(getattr(p, y)) for p in points]
        ax.plot(xs, ys, marker="o", label=site)
        for p, px, py in zip(points, xs, ys, strict=True):
            ax.annotate(f"{p.coef:g}", (px, py), textcoords="offset points", xytext=(4, 4), fontsize=7)
        drawn = True
    if drawn:
        ax.legend(fontsize=8, title="site", title_fontsize=8)
    else:
        ax.text(
            0.5,
            0.5,
            f"no {y.replace('_', ' ')} (not asked)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )


def plot_steer(result: SteerResult, path: str | os.PathLike[str]) -> Path:
    """steer.png."""
    return save_figure(steer_figure(result), path)


def steer_lines(result: SteerResult) -> list[str]:
    """The terminal's table: one line per site and coefficient."""
    lines = [
        f"steer: {result.model}",
        f"{'site':<12} {'coef':>6} {'probe':>7} {'log p':>8} {'KL':>8} {'ppl':>8} changed",
    ]
    for p in result.points:
        lines.append(
            f"{p.site:<12} {p.coef:>6g} {_number(p.concept_score, '.3f'):>7} "
            f"{_number(p.concept_logprob, '.2f'):>8} "
            f"{p.kl:>8.4f} {p.perplexity:>8.2f} {p.changed:>6.0%}"
        )
    return lines


def _number(value: float | None, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _examples_table(points: tuple[SteerPoint, ...]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(p.site)}</td><td>{p.coef:g}</td>"
        f"<td class='text'>{html.escape(p.example)}</td></tr>"
        for p in points
    )
    return f"<table><tr><th>site</th><th>coef</th><th>first prompt's continuation</th></tr>{rows}</table>"


PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #bbb;padding:4px 8px;text-align:left}"
    "th{background:#f2f2f2}td.text{font-family:monospace;white-space:pre-wrap}figure img{max-width:100%}"
    ".caption,figcaption{color:#444;font-size:90%}"
)


def _full_table(result: SteerResult) -> str:
    """Every point's scores (the page shows them all; a notebook cuts long tables)."""
    frame = steer_frame(result).drop(columns="example")
    return frame_html(frame, shown=len(frame))


def write_steer_html(result: SteerResult, path: str | os.PathLike[str]) -> None:
    """steer.html: the curves, the table and each point's example continuation; self-contained."""
    settings = result.settings
    prompts = ", ".join(repr(p) for p in settings.get("prompts", []))
    page = (
        "<!doctype html><meta charset='utf-8'><title>resstream steer</title>"
        f"<style>{PAGE_STYLE}</style><h1>Steering {html.escape(result.model)}</h1>"
        f"<p class='caption'>Prompts: {html.escape(prompts)}; concept tokens: "
        f"{html.escape(', '.join(map(repr, settings.get('concept_tokens', []))) or 'none')}; probe at "
        f"{html.escape(str(settings.get('probe_site')))}.</p>"
        f"{figure_html(figure_png(steer_figure(result)), 'steering curves', STEER_CAPTION)}"
        f"{_full_table(result)}{_examples_table(result.points)}"
    )
    write_text(path, page)


def _steer_view(result: SteerResult) -> NotebookView:
    return NotebookView(
        tables=[Table("Steering sweep", frame_html(steer_frame(result)))],
        pictures=[Picture(steer_figure(result), STEER_CAPTION)],
    )


# --------------------------------------------------------------------------- attenuation

#: The columns of attenuation.csv (`attenuation_frame`).
ATTENUATION_COLUMNS = ("kind", "name", "layer", "alpha", "loss", "shift_layer")
ATTENUATION_CAPTION = (
    "Each cell: the trained model with block l's identity path scaled by α at inference "
    "(block l computes α·h_l + F_l(h_l)); left its loss on the sample (nats/token), right its "
    "shift layer (NaN: the match with the next token never overtakes). The α = 1 column is the "
    "model itself. Markers: models trained with a fixed gate at that block and α (their loss)."
)


def attenuation_frame(result: AttenuationResult) -> pandas.DataFrame:
    """One row per block and α (kind "inference"), then one per trained run (kind "trained")."""
    import pandas as pd

    rows: list[dict[str, Any]] = [
        {"kind": "inference", "name": result.model, **vars(p)} for p in result.points
    ]
    rows += [
        {
            "kind": "trained",
            "name": t.name,
            "layer": t.layer,
            "alpha": t.alpha,
            "loss": t.loss,
            "shift_layer": t.shift_layer,
        }
        for t in result.trained
    ]
    return pd.DataFrame(rows, columns=ATTENUATION_COLUMNS)


def attenuation_figure(result: AttenuationResult) -> Figure:
    """attenuation.png: the loss and shift-layer maps (`ATTENUATION_CAPTION`)."""
    layers, alphas = result.layers, result.alphas
    fig = new_figure(4.0 + 1.1 * len(alphas) * 2, 1.6 + 0.45 * len(layers))
    axes = fig.subplots(1, 2)
    for ax, metric, label, cmap in (
        (axes[0], "loss", "loss (nats/token)", "magma_r"),
        (axes[1], "shift_layer", "shift layer", "viridis"),
    ):
        grid = np.array(result.grid(metric), dtype=float)
        image = ax.imshow(grid, aspect="auto", cmap=cmap, interpolation="nearest")
        for (i, j), value in np.ndenumerate(grid):
            text = "never" if math.isnan(value) else f"{value:.2f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color=_ink(image, value))
        ax.set_xticks(range(len(alphas)), [f"{a:g}" for a in alphas])
        ax.set_yticks(range(len(layers)), [f"block {layer}" for layer in layers])
        ax.set_xlabel("α (identity-path factor)")
        ax.set_title(label, fontsize=10)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        if metric == "loss":
            _mark_trained(ax, result, layers, alphas)
    fig.suptitle(f"Inference-time attenuation of {result.model}", fontsize=11)
    fig.tight_layout()
    return fig


def _ink(image: Any, value: float) -> str:
    """Black on a light cell, white on a dark one."""
    if math.isnan(value):
        return "black"
    red, green, blue, _ = image.cmap(image.norm(value))
    return "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"


def _mark_trained(ax: Axes, result: AttenuationResult, layers: list[int], alphas: list[float]) -> None:
    for t in result.trained:
        if t.layer in layers and t.alpha in alphas:
            ax.plot(alphas.index(t.alpha), layers.index(t.layer), marker="*", color="cyan", markersize=14)
            ax.annotate(
                f"trained {t.loss:.2f}",
                (alphas.index(t.alpha), layers.index(t.layer)),
                textcoords="offset points",
                xytext=(6, -12),
                fontsize=7,
                color="cyan",
            )


def plot_attenuation(result: AttenuationResult, path: str | os.PathLike[str]) -> Path:
    """attenuation.png."""
    return save_figure(attenuation_figure(result), path)


def attenuation_lines(result: AttenuationResult) -> list[str]:
    """The terminal's table: per block, the loss at each α (and the trained runs)."""
    alphas = result.alphas
    lines = [f"attenuation: {result.model} (loss, nats/token; shift layer in brackets)"]
    lines.append(f"{'block':<8}" + "".join(f"{'α=' + format(a, 'g'):>16}" for a in alphas))
    table = {(p.layer, p.alpha): p for p in result.points}
    for layer in result.layers:
        cells = []
        for a in alphas:
            p = table[(layer, a)]
            shift = "never" if p.shift_layer is None else f"{p.shift_layer:.2f}"
            cells.append(f"{p.loss:>8.3f} [{shift:>5}]")
        lines.append(f"{layer:<8}" + "".join(f"{c:>16}" for c in cells))
    for t in result.trained:
        shift = "never" if t.shift_layer is None else f"{t.shift_layer:.2f}"
        lines.append(
            f"trained {t.name} (gate {t.gate}, block {t.layer}, α {t.alpha}): loss {t.loss:.3f} [{shift}]"
        )
    return lines


def _attenuation_view(result: AttenuationResult) -> NotebookView:
    return NotebookView(
        tables=[Table("Attenuation map", frame_html(attenuation_frame(result)))],
        pictures=[Picture(attenuation_figure(result), ATTENUATION_CAPTION)],
    )


register_result(SteerResult, steer_frame, _steer_view)
register_result(AttenuationResult, attenuation_frame, _attenuation_view)

__all__ = [
    "ATTENUATION_COLUMNS",
    "STEER_COLUMNS",
    "attenuation_figure",
    "attenuation_frame",
    "attenuation_lines",
    "plot_attenuation",
    "plot_steer",
    "steer_figure",
    "steer_frame",
    "steer_lines",
    "write_steer_html",
]
