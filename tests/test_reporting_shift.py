"""Shift renderers on hand-made results (duck-typed like AlignmentResult)."""

from __future__ import annotations

import csv
import io
from types import SimpleNamespace

from resstream.analysis.shift.alignment import SHIFT_COLUMNS, SHIFT_METRICS
from resstream.reporting.shift import (
    plot_comparison,
    plot_match_rates,
    plot_shift_depths,
    plot_similarity,
    shift_csv,
)


def fake(model: str, layers: int) -> SimpleNamespace:
    n = layers + 1
    return SimpleNamespace(
        model=model,
        num_layers=layers,
        layers=tuple(range(n)),
        top_k=5,
        decoder="logit-lens",
        num_tokens=1000,
        num_projection_tokens=990,
        in_match=tuple(1 - i / layers for i in range(n)),
        out_match=tuple(i / layers for i in range(n)),
        in_match_ci=tuple((max(0, 1 - i / layers - 0.05), min(1, 1 - i / layers + 0.05)) for i in range(n)),
        out_match_ci=tuple((max(0, i / layers - 0.05), min(1, i / layers + 0.05)) for i in range(n)),
        cos_in=tuple(1 - i / n for i in range(n)),
        cos_out=tuple(i / n for i in range(n)),
        projection=tuple(i / layers for i in range(n)),
        shift_layer=layers / 2,
        shift_depths=tuple([0] + [10] * layers),
        never_shifted=3,
    )


def test_plots_are_pngs(tmp_path):
    results = [fake("a", 4), fake("b", 8)]
    for name, draw in (("m.png", plot_match_rates), ("s.png", plot_similarity), ("h.png", plot_shift_depths)):
        draw(results[0], tmp_path / name)
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    plot_comparison(results, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_csv_rows_and_values():
    rows = list(csv.DictReader(io.StringIO(shift_csv([fake("a", 4), fake("b", 2)]))))
    assert len(rows) == (5 + 3) * len(SHIFT_METRICS)  # one row per model, layer and metric
    assert list(rows[0]) == list(SHIFT_COLUMNS)
    in_match, out_match, cos_in = (rows[2 * len(SHIFT_METRICS) + i] for i in range(3))
    assert in_match["model"] == "a" and in_match["layer"] == "2" and float(in_match["depth"]) == 0.5
    assert in_match["metric"] == "in_match" and float(in_match["value"]) == 0.5
    assert out_match["metric"] == "out_match" and float(out_match["ci_high"]) == 0.55
    assert cos_in["metric"] == "cos_in" and cos_in["ci_low"] == cos_in["ci_high"] == ""
    first_of_b = rows[5 * len(SHIFT_METRICS) : 6 * len(SHIFT_METRICS)]
    assert first_of_b[-1]["model"] == "b" and first_of_b[-1]["metric"] == "shift_depth"
    assert float(first_of_b[-1]["value"]) == 0.0  # the share of tokens shifting at layer 0
    second = rows[6 * len(SHIFT_METRICS) + len(SHIFT_METRICS) - 1]
    assert float(second["value"]) == 10 / 1000


def drawn(monkeypatch, draw, *args):
    """The figure `draw` builds, kept instead of saved (saving clears it)."""
    import resstream.reporting.shift as rendering

    kept = []
    monkeypatch.setattr(rendering, "save_figure", lambda fig, path: kept.append(fig))
    draw(*args, "unused.png")
    (fig,) = kept
    fig.canvas.draw()  # lay out the ticks
    return fig


def test_a_shallow_model_gets_whole_layer_ticks(monkeypatch):
    for draw in (plot_match_rates, plot_similarity):
        ax = drawn(monkeypatch, draw, fake("a", 2)).axes[0]
        ticks = [tick for tick in ax.get_xticks() if ax.get_xlim()[0] <= tick <= ax.get_xlim()[1]]
        assert ticks == [0, 1, 2], ticks


def test_the_next_token_is_a_subscript_and_the_bands_are_named(monkeypatch):
    ax = drawn(monkeypatch, plot_match_rates, fake("a", 4)).axes[0]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert any("$t_{i+1}$" in label for label in labels) and not any("t_i+1" in label for label in labels)
    assert any("95% CI" in label for label in labels)


def test_the_comparison_has_a_band_per_model(monkeypatch):
    ax = drawn(monkeypatch, plot_comparison, [fake("a", 4), fake("b", 8)]).axes[0]
    assert len(ax.collections) == 2  # one confidence band per model
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels[:2] == ["a (L=4)", "b (L=8)"] and "95% CI" in labels[2]
