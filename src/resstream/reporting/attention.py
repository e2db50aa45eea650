"""Heatmaps of mean attention (simulated stacks and trained models) and distance profiles.

`plot_attention_grid` draws the classic figure: one row per configuration or model, one
column per layer, each panel the mean attention matrix (query down, key across, the masked
future blank). Every row has its own colour scale, from 0 to the largest score a query gives
an earlier token: self-attention, which can take most of the mass, saturates the colour, so
the structure among the earlier keys stays visible.
`plot_distance_profiles` draws, per layer, the mean attention δ tokens back, beside what
uniform causal attention would give.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from resstream.reporting.figures import new_figure, save_figure
from resstream.simulation import LayerAttention

Matrix = Sequence[Sequence[float]]


def _masked(matrix: Matrix) -> np.ndarray:
    """The matrix with the future (key > query) as NaN, so it is drawn blank."""
    array = np.asarray(matrix, dtype=float)
    array[np.triu_indices(array.shape[0], k=1)] = np.nan
    return array


def _row_scale(maps: Sequence[Matrix]) -> float:
    """The largest score to an earlier token (self excluded) over a row's maps, so the
    structure among earlier keys stays visible; larger self scores saturate the colour."""
    tops = []
    for matrix in maps:
        earlier = _masked(matrix)
        np.fill_diagonal(earlier, np.nan)
        if np.isfinite(earlier).any():
            tops.append(float(np.nanmax(earlier)))
    top = max(tops, default=1.0)
    return top if math.isfinite(top) and top > 0 else 1.0


def plot_attention_grid(
    rows: Sequence[tuple[str, Sequence[Matrix]]],
    path: str | os.PathLike[str],
    *,
    title: str = "mean attention (query ↓, key →)",
) -> Path:
    """Rows = (label, one matrix per layer); columns = layers 1..L. Writes a PNG."""
    if not rows or not all(maps for _, maps in rows):
        raise ValueError("plot_attention_grid needs at least one row with at least one layer")
    columns = max(len(maps) for _, maps in rows)
    fig = new_figure(width=1.6 * columns + 1.6, height=1.6 * len(rows) + 0.8)
    axes = fig.subplots(len(rows), columns, squeeze=False)
    for r, (label, maps) in enumerate(rows):
        vmax = _row_scale(maps)
        image = None
        for c in range(columns):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(maps):
                ax.axis("off")
                continue
            image = ax.imshow(_masked(maps[c]), cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
            if r == 0:
                ax.set_title(f"layer {c + 1}", fontsize=9)
        axes[r][0].set_ylabel(label, fontsize=8, rotation=0, ha="right", va="center", labelpad=6)
        if image is not None:
            fig.colorbar(image, ax=list(axes[r]), fraction=0.02, pad=0.01)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def uniform_profile(tokens: int) -> list[float]:
    """The distance profile of uniform causal attention (query i gives 1/(i+1) to each key):
    it falls with δ too, because long distances exist only for late queries with many keys."""
    return [sum(1.0 / (i + 1) for i in range(delta, tokens)) / (tokens - delta) for delta in range(tokens)]


def plot_distance_profiles(
    profiles: Sequence[Sequence[float]],
    path: str | os.PathLike[str],
    *,
    head_profiles: Sequence[Sequence[Sequence[float]]] | None = None,
    title: str = "attention by distance",
) -> Path:
    """Per layer (one panel each), mean attention δ tokens back (δ = 0: the token itself);
    thin grey lines for single heads when `head_profiles` is given, a dotted line for uniform
    causal attention (`uniform_profile`), the no-bias reference. Log scale."""
    layers = len(profiles)
    fig = new_figure(width=min(2.2 * layers, 13.0) + 0.6, height=2.8)
    axes = fig.subplots(1, layers, squeeze=False, sharey=True)[0]
    for layer, ax in enumerate(axes):
        if head_profiles is not None:
            for head in head_profiles[layer]:
                ax.plot(range(len(head)), head, color="0.7", linewidth=0.6)
        ax.plot(range(len(profiles[layer])), profiles[layer], color="tab:blue", linewidth=1.6)
        ax.plot(
            range(len(profiles[layer])),
            uniform_profile(len(profiles[layer])),
            color="black",
            linestyle=":",
            linewidth=1.0,
        )
        ax.set_yscale("log")
        ax.set_title(f"layer {layer + 1}", fontsize=9)
        ax.set_xlabel("distance δ = i − j", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean attention", fontsize=8)
    fig.suptitle(title, fontsize=10, y=1.04)
    return save_figure(fig, path)


def verdict_lines(layers: Sequence[LayerAttention]) -> list[str]:
    """One line per layer: recency (rows that hold, weakest z) and primacy (the same)."""
    lines = []
    for layer in layers:
        parts = []
        for verdict in (layer.recency, layer.primacy):
            testable = len(verdict.rows) - len(verdict.untestable_rows)
            held = len(verdict.holding_rows)
            state = "holds" if verdict.holds else f"{held}/{testable} rows"
            parts.append(f"{verdict.direction} {state} (min z {verdict.min_z:.1f})")
        lines.append(f"layer {layer.layer}: " + "; ".join(parts))
    return lines
