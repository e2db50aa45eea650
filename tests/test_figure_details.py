"""Figure details a reader trips over (issue 23, item 10): compare.png's row names legible for 3
and 8 rows, neurons.png saying which neurons it shows and what m is, "before soft-capping" only
for a model that soft-caps, the attention grid's diagonal off the colour scale and said so, the
direction rule printed under the verdicts, and tokens in scripts the plot font lacks escaped
(no "Glyph ... missing" warning, no box)."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import replace

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from resstream.analysis.attribution.results import NeuronAttribution
from resstream.analysis.memories.neurons import NeuronReport
from resstream.reporting.attention import LEGEND, attention_grid_figure, shared_scale
from resstream.reporting.attribute.neurons import NEURONS_SHOWN, neurons_figure
from resstream.reporting.attribute.page import logit_label
from resstream.reporting.figures import drawable, figure_png, figure_token
from resstream.reporting.lens import lens_figure
from resstream.reporting.neurons import neurons_figure as neurons_figure_of
from resstream.reporting.neurons import plot_neurons
from resstream.reporting.plots import compare_figure
from resstream.reporting.tables import Column, CompareRow, CompareTable, make_stat
from tests.test_reporting_attribute import corpus, single
from tests.test_reporting_lens import result as lens_result
from tests.test_reporting_neurons import result as neurons_result

KATAKANA = "アイウ"  # GPT-2's vocabulary has tokens like these; DejaVu has no glyph for them
ESCAPED = r"\u30a2\u30a4\u30a6"


@pytest.fixture(autouse=True)
def _dejavu_fonts():
    """matplotlib's own DejaVu fonts, whatever a matplotlibrc on this machine prefers (one with
    Katakana would draw it and leave nothing to escape)."""
    from matplotlib import rc_context

    from resstream.reporting import figures

    fonts = {
        "font.family": "sans-serif",
        "font.sans-serif": ["DejaVu Sans"],
        "font.monospace": ["DejaVu Sans Mono"],
    }
    figures._glyphs.cache_clear()
    with rc_context(fonts):
        yield
    figures._glyphs.cache_clear()


# ---------------------------------------------------------------------------- compare.png
def _compare_table(extra_rows: int) -> CompareTable:
    """baseline, best fixed cut, learned gate and `extra_rows` pretrained models; three panels."""
    columns = (
        Column("val_loss", "val loss"),
        Column("a/perplexity", "a ppl"),
        Column("b/perplexity", "b ppl"),
    )

    def row(key: str, label: str, value: float, cut: int | None = None) -> CompareRow:
        cells = {c.key: make_stat([value + i, value + i + 0.1]) for i, c in enumerate(columns)}
        return CompareRow(key, label, cut, 0.5 if cut is not None else None, (0, 1), cells)

    rows = [row("baseline", "baseline", 5.0), row("fixed", "best fixed cut (k=0, α=0.5)", 4.9, 0)]
    rows.append(row("learned", "learned gate", 4.95))
    names = ["gpt2", "EleutherAI/pythia-70m", "google/gemma-2-2b", "Qwen/Qwen2.5-0.5B", "runs/tiny-model"]
    rows += [
        row("pretrained", names[i % len(names)] + "-x" * (i // len(names)), 4.0 + i)
        for i in range(extra_rows)
    ]
    return CompareTable(tuple(rows), columns, (), None)


def _drawn(fig: Figure) -> Figure:
    fig.canvas.draw()  # tick labels get their place and size when drawn
    return fig


def _overlap(a: Bbox, b: Bbox) -> bool:
    return a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5


@pytest.mark.parametrize("extra_rows", [0, 1, 5], ids=["3 rows", "4 rows", "8 rows"])
def test_compare_row_names_and_tick_labels_never_run_together(extra_rows: int) -> None:
    table = _compare_table(extra_rows)
    fig = _drawn(compare_figure(table))
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 3
    boxes = []
    for ax in panels:
        names = [label.get_text().replace("\n", " ") for label in ax.get_xticklabels()]
        assert names[:3] == ["baseline", "fixed k=0", "learned"]
        assert names[3:] == [r.label for r in table.rows[3:]]  # other rows by their own name
        slanted = _slanted_labels_keep_apart(ax)
        labels = [*([] if slanted else ax.get_xticklabels()), *ax.get_yticklabels()]
        boxes += [(ax, label.get_window_extent(renderer)) for label in labels if label.get_text()]
    for (ax_a, a), (ax_b, b) in itertools.combinations(boxes, 2):
        assert not _overlap(a, b), (ax_a.get_title(), ax_b.get_title(), a, b)
    for ax in panels:  # no tick label reaches into another panel
        labels = [*ax.get_xticklabels(), *ax.get_yticklabels()]
        for box in (label.get_window_extent(renderer) for label in labels if label.get_text()):
            for other in panels:
                if other is not ax:
                    assert not _overlap(box, other.get_window_extent(renderer)), (
                        ax.get_title(),
                        other.get_title(),
                    )


def _slanted_labels_keep_apart(ax) -> bool:
    """For slanted x tick labels (whose upright boxes overlap by nature): True after checking
    that neighbouring labels, parallel lines of text, lie further apart than a line is high;
    False for upright labels."""
    labels = [label for label in ax.get_xticklabels() if label.get_text()]
    angle = labels[0].get_rotation()
    if angle == 0:
        return False
    points = ax.transData.transform([(x, 0) for x in ax.get_xticks()])
    spacing = float(np.diff(points[:, 0]).min())
    height = labels[0].get_fontsize() * ax.figure.dpi / 72
    assert spacing * np.sin(np.radians(angle)) > 1.2 * height
    return True


# --------------------------------------------------------------------------- neurons.png
def test_attribute_neurons_figure_says_which_neurons_it_shows_and_what_m_is() -> None:
    result = single()
    fig = neurons_figure(result)
    title = fig.get_suptitle()
    assert f"the {len(result.neurons)} neurons with the largest |DLA| of all neurons in every layer" in title
    by_c = neurons_figure(replace(result, rank_by="c")).get_suptitle()
    assert "the 8 neurons with the largest |C| of all neurons in every layer" in by_c
    assert " of 8 neurons" not in title and "top 8" not in title
    assert "m (at the attributed position) = the neuron's coefficient m_k" in fig.get_supxlabel()
    assert "act(x·W_in[:, k] + b_in[k])" in fig.get_supxlabel()


def test_attribute_neurons_figure_counts_what_it_leaves_out_of_a_longer_list() -> None:
    base = single().neurons[0]
    many = tuple(replace(base, neuron=n, contribution=1.0 - n / 100) for n in range(NEURONS_SHOWN + 10))
    title = neurons_figure(replace(single(), neurons=many)).get_suptitle()
    assert f"the {NEURONS_SHOWN} neurons with the largest |DLA|" in title
    assert f"(the first {NEURONS_SHOWN} of the {NEURONS_SHOWN + 10} in neurons.csv)" in title


def test_corpus_neurons_figure_explains_the_mean_coefficient() -> None:
    fig = neurons_figure(corpus())
    assert "largest |mean DLA| of all neurons" in fig.get_suptitle()
    assert (
        "largest |mean C| of those scored exactly"
        in neurons_figure(replace(corpus(), rank_by="c")).get_suptitle()
    )
    assert fig.get_supxlabel().startswith("mean m = the mean over the scored positions")


def test_neurons_command_figure_explains_m(tmp_path) -> None:
    title = neurons_figure_of(neurons_result()).get_suptitle()
    assert "m = the neuron's coefficient m_k, its activation act(x·W_in[:, k] + b_in[k])" in title
    assert plot_neurons(neurons_result(), tmp_path / "neurons.png").stat().st_size > 0


# -------------------------------------------------------------------------- soft-capping
def test_logit_label_says_before_soft_capping_only_for_a_model_that_soft_caps() -> None:
    plain = single()
    assert logit_label(plain) == "logit"
    capped = replace(plain, logit_softcap=30.0)
    assert logit_label(capped) == "logit (before soft-capping)"


@pytest.mark.parametrize(("case", "capped"), [("gpt2", False), ("gemma2", True)])
def test_attribute_page_of_a_real_model_names_soft_capping_only_for_gemma2(tmp_path, case, capped) -> None:
    from resstream.analysis.attribution.scores import Levels, attribute_position
    from resstream.analysis.decoding.decoder import decoder_of
    from resstream.capture import block_internals
    from resstream.models.adapters import view_of
    from resstream.reporting.attribute import write_attribute_report
    from tests.test_models_adapters import tiny_ids, tiny_model

    view = view_of(tiny_model(case))
    ids = tiny_ids(batch=1)
    result = attribute_position(
        view,
        block_internals(view, ids),
        decoder_of(view),
        2,
        int(ids[0, 3]),
        levels=Levels(sources=False, neurons=False, linearity=False, queries=0, top=3),
    )
    write_attribute_report(result, tmp_path)
    page = (tmp_path / "attribute.html").read_text(encoding="utf-8")
    assert ("logit (before soft-capping)" in page) is capped
    assert ">logit<" in page or capped


# ------------------------------------------------------------------- attention grid
def _stack(n: int, self_share: float, tilt: float) -> list[list[float]]:
    """Rows giving `self_share` to the query itself and the rest to earlier keys, rising by
    `tilt` per key (a recency trend)."""
    rows = []
    for i in range(n):
        weights = np.array([1.0 + tilt * j for j in range(i)])
        earlier = (1 - self_share) * weights / weights.sum() if i else np.zeros(0)
        rows.append([*earlier, 1.0 if i == 0 else self_share, *[0.0] * (n - i - 1)])
    return rows


def test_grid_keeps_the_diagonal_off_the_colour_scale_and_says_so() -> None:
    maps = np.array([_stack(8, 0.95, 0.5), _stack(8, 0.95, 1.0)])
    kept = maps.copy()
    fig = attention_grid_figure([("tilted", list(maps))], title="t")
    assert np.array_equal(maps, kept)  # the caller's arrays are not changed
    panels = [ax for ax in fig.axes if ax.images]
    for ax, matrix in zip(panels, maps, strict=True):
        coloured = np.asarray(ax.images[0].get_array(), dtype=float)
        assert np.isnan(np.diagonal(coloured)).all()  # the diagonal is not colour-mapped ...
        grey = np.asarray(ax.images[1].get_array(), dtype=float)
        assert np.allclose(np.diagonal(grey), np.diagonal(matrix))  # ... but drawn in flat grey
        assert np.isnan(grey[np.tril_indices(8, k=-1)]).all()
    low, high = panels[0].images[0].get_clim()
    earlier = maps[:, np.tril_indices(8, k=-1)[0], np.tril_indices(8, k=-1)[1]]
    assert (low, high) == (pytest.approx(earlier.min()), pytest.approx(earlier.max()))
    assert (low, high) == shared_scale([list(maps)])
    assert "grey diagonal: each query's attention to itself (0.95–1 here)" in fig.get_suptitle()
    assert "left off the colour scale" in fig.get_suptitle()


def test_the_direction_rule_is_printed_with_the_5_percent_band() -> None:
    rule = LEGEND.splitlines()[-1]
    assert rule.startswith("direction: recency (primacy) when ρ's 95% interval lies above (below) 0")
    assert "at least 5% off uniform (×r ≤ 0.95 or ≥ 1.05); otherwise none, however large |ρ|" in rule


def test_simulate_prints_the_direction_rule_after_its_verdicts(tmp_path, capsys) -> None:
    from resstream.cli.main import main

    code = main(
        ["simulate", "--layers", "2", "--tokens", "5", "--sims", "200", "--quiet", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "direction: recency (primacy) when ρ's 95% interval" in out
    assert out.index("layer 2:") < out.index("direction: recency")


# ------------------------------------------------------------------- glyphs the font lacks
def test_a_token_the_font_cannot_draw_is_escaped_and_one_it_can_is_kept() -> None:
    assert drawable(KATAKANA) == ESCAPED
    assert drawable(KATAKANA, monospace=True) == ESCAPED
    assert drawable("␣the↵ café …") == "␣the↵ café …"
    assert figure_token(" " + KATAKANA + "$") == "␣" + ESCAPED + r"\$"
    assert figure_token("abcdefghijkl", limit=5) == "abcd…"


def _no_glyph_warnings(fig: Figure) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figure_png(fig)
    return [str(w.message) for w in caught if "Glyph" in str(w.message)]


def _texts(fig: Figure) -> str:
    parts = [fig.get_suptitle()]
    for ax in fig.axes:
        parts += [ax.get_title(), *(t.get_text() for t in ax.texts)]
        parts += [label.get_text() for label in ax.get_yticklabels()]
    return "\n".join(parts)


def test_attribute_figures_draw_katakana_tokens_escaped_without_warnings() -> None:
    result = single(target=KATAKANA)
    katakana = NeuronAttribution(0, 1, 2.0, 1.0, 0.5, (KATAKANA, " the"))
    result = replace(result, neurons=(katakana, *result.neurons[1:]))
    fig = _drawn(neurons_figure(result))
    assert ESCAPED in _texts(fig) and KATAKANA not in _texts(fig)
    assert _no_glyph_warnings(fig) == []


def test_neurons_and_lens_figures_draw_katakana_tokens_escaped_without_warnings(tmp_path) -> None:
    base = neurons_result()
    texts = tuple((t, KATAKANA if t == 1 else text) for t, text in base.texts)
    neuron = NeuronReport(7, 2.5, ((1, 0.9),), ((3, -0.4),), base.neurons[0].contexts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Glyph warning fails the test
        plot_neurons(replace(base, texts=texts, neurons=(neuron,)), tmp_path / "neurons.png")
    lens = lens_result()
    lens = replace(lens, texts=tuple((t, KATAKANA if t == 2 else text) for t, text in lens.texts))
    fig = _drawn(lens_figure(lens, 0))
    assert ESCAPED in _texts(fig) and KATAKANA not in _texts(fig)
    assert _no_glyph_warnings(fig) == []
