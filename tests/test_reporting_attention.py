"""Attention figures and printed lines (reporting/attention.py) and model file stems (figures.py):
integer position and distance ticks, one labelled colour scale per grid, the uniform baseline in
a legend, z-scores that read sensibly, and file names after the model."""

from __future__ import annotations

import math

import pytest

from resstream.reporting.attention import (
    COLOUR_BAR_LABEL,
    COLOUR_FLOOR,
    UNIFORM_LABEL,
    attention_grid_figure,
    distance_figure,
    format_z,
    layer_lines,
    uniform_profile,
)
from resstream.reporting.figures import model_file_stem, model_file_stems, save_figure
from resstream.simulation import SimulationConfig, simulate


def _uniform(n: int, scale: float = 1.0) -> list[list[float]]:
    return [[scale / (i + 1) if j <= i else 0.0 for j in range(n)] for i in range(n)]


def _tick_labels_are_integers(axis) -> bool:
    labels = [label.get_text().replace("−", "-") for label in axis.get_ticklabels() if label.get_text()]
    return bool(labels) and all(label.lstrip("-").isdigit() for label in labels)


def _draw(fig) -> None:
    fig.canvas.draw()  # tick labels are made when the figure is drawn


def test_grid_has_integer_positions_one_scale_and_a_labelled_colour_bar(tmp_path) -> None:
    rows = [("bright", [_uniform(6), _uniform(6)]), ("dim", [_uniform(6, 0.001), _uniform(6, 0.001)])]
    fig = attention_grid_figure(rows, title="t")
    _draw(fig)
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 4
    limits = {ax.images[0].get_clim() for ax in panels}
    assert len(limits) == 1  # one colour scale for the whole grid: the dim row looks dim
    # log scale up to the largest score to an earlier key, down to the smallest (here raised to
    # a thousandth of the top)
    assert limits.pop() == (pytest.approx(0.5 * COLOUR_FLOOR), pytest.approx(0.5))
    assert all(type(ax.images[0].norm).__name__ == "LogNorm" for ax in panels)
    for ax in panels:
        assert _tick_labels_are_integers(ax.xaxis) and _tick_labels_are_integers(ax.yaxis)
    bars = [ax for ax in fig.axes if not ax.images and ax.get_ylabel()]
    assert [bar.get_ylabel() for bar in bars] == [COLOUR_BAR_LABEL]
    assert panels[0].get_ylabel() == "query i" and panels[-1].get_xlabel() == "key j"
    assert save_figure(fig, tmp_path / "grid.png").stat().st_size > 0


def test_distance_plot_names_the_uniform_baseline_and_has_integer_distances() -> None:
    profiles = [uniform_profile(12), uniform_profile(12)]
    fig = distance_figure(profiles, head_profiles=[[profiles[0]] * 2] * 2)
    _draw(fig)
    legend = fig.legends[0]
    assert [text.get_text() for text in legend.get_texts()] == [
        "single heads",
        "heads averaged",
        UNIFORM_LABEL,
    ]
    for ax in fig.axes:
        assert _tick_labels_are_integers(ax.xaxis)


@pytest.mark.parametrize(
    ("z", "shown"),
    [
        (3.21, "+3.2"),
        (-2.0, "-2.0"),
        (-222173.4, "< -1000"),
        (5e6, "> 1000"),
        (math.inf, "+∞"),
        (math.nan, "n/a"),
    ],
)
def test_z_scores_read_sensibly(z, shown) -> None:
    assert format_z(z) == shown


def test_layer_lines_lead_with_the_trend_then_the_strict_verdict() -> None:
    result = simulate(SimulationConfig(layers=2, tokens=5, simulations=300, layernorm=False))
    lines = layer_lines(result.layers)
    assert len(lines) == 4
    assert lines[0].startswith("layer 1: ") and " ρ " in lines[0] and "δ 1–3 ×" in lines[0]
    assert lines[1].startswith("  strict, every step: recency")
    # the no-LayerNorm stack is near the identity: zero-variance steps, no absurd z digits
    for line in lines:
        for z in line.split("min z ")[1:]:
            value = z.split(")")[0]
            assert value in ("< -1000", "> 1000", "n/a", "+∞", "-∞") or abs(float(value)) < 1000, line


def test_model_file_stems() -> None:
    assert model_file_stem("reference") == "reference"
    assert model_file_stem("runs/tiny") == "runs_tiny"
    assert model_file_stem("/srv/experiments/runs/tiny/") == "runs_tiny"
    assert model_file_stem("EleutherAI/pythia-70m") == "EleutherAI_pythia-70m"
    assert model_file_stem("a b:c") == "a_b_c"
    assert model_file_stem("..") == "model"
    assert len(model_file_stem("x" * 200)) == 60
    # two models that collapse to one stem (also only by case) still get files of their own
    assert model_file_stems(["runs/tiny", "runs:tiny", "RUNS/tiny"]) == [
        "runs_tiny",
        "runs_tiny_2",
        "RUNS_tiny_3",
    ]
