"""What `ablate` and `patch` write and show (`resstream.reporting.interventions`): the long frame
holds each effect's fields, effects.csv and ablate.json / patch.json are the frame and
`to_dict()`, every figure is drawn only where its data exists and puts each number in its cell,
the page is self-contained and escapes the text, and a notebook shows the page's tables and
figures."""

from __future__ import annotations

import base64
import json
import math
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas
import pytest

from resstream.analysis.interventions.results import (
    EFFECT_COLUMNS,
    SCREEN_COLUMNS,
    Effect,
    InterventionResult,
)
from resstream.api.interventions import ablate, patch
from resstream.reporting.interventions import (
    caption,
    effects_frame,
    head_heatmap_figure,
    intervention_figures,
    intervention_html,
    mode_text,
    neuron_strip_figure,
    residual_grid_figure,
    terminal_summary,
    top_effects_frame,
    top_effects_title,
    write_intervention_report,
)
from resstream.reporting.notebook import frame_csv
from resstream.reporting.screen import UNCONFIRMED
from tests.notebook_support import assert_displays, assert_frame_columns, fetched

TEXT = "To be, or not to be, that is the question"
CLEAN = "The king is dead, long live the king"
CORRUPT = "The queen is dead, long live the king"
PNG = b"\x89PNG\r\n\x1a\n"
pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def ablated() -> InterventionResult:
    return ablate(TEXT, components=["L*.H*", "L*.mlp", "L2.N5", "L4.N7"], direct=True)


@pytest.fixture(scope="module")
def patched() -> InterventionResult:
    return patch(CLEAN, corrupt=CORRUPT, components=["L*.resid@*"])


@pytest.fixture(scope="module")
def screened() -> InterventionResult:
    return patch(CLEAN, corrupt=CORRUPT, atp=True, confirm=5)


@pytest.fixture(scope="module")
def estimated() -> InterventionResult:
    """Attribution patching's estimates alone (`confirm` 0)."""
    return patch(CLEAN, corrupt=CORRUPT, atp=True, confirm=0)


@pytest.fixture(scope="module")
def with_foil() -> InterventionResult:
    return ablate(TEXT, components=["L0.H*"], foil=" and")


def effect(result: InterventionResult, component: str, path: str = "total") -> Effect:
    (found,) = [e for e in result.effects if e.component == component and e.path == path]
    return found


def row(frame: pandas.DataFrame, component: str, metric: str, path: str = "total") -> pandas.Series:
    kept = frame[(frame["component"] == component) & (frame["metric"] == metric) & (frame["path"] == path)]
    assert len(kept) == 1
    return kept.iloc[0]


class Page(HTMLParser):
    """The tags (with attributes) and the text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text += data


# -------------------------------------------------------------------------------- frame
def test_frame_has_one_row_per_effect_and_metric(ablated, with_foil) -> None:
    frame = assert_frame_columns(ablated, EFFECT_COLUMNS)
    assert len(frame) == 4 * len(ablated.effects)  # logprob, logit, rank, kl
    assert set(frame["metric"]) == {"logprob", "logit", "rank", "kl"}
    foiled = assert_frame_columns(with_foil, EFFECT_COLUMNS)
    assert len(foiled) == 5 * len(with_foil.effects)
    assert list(foiled["metric"][:5]) == ["logprob", "logit", "logit_diff", "rank", "kl"]


def test_frame_values_are_the_fields_of_each_effect(ablated) -> None:
    frame = ablated.to_pandas()
    for component, path in [("L4.H3", "total"), ("L0.mlp", "direct"), ("L2.N5", "total")]:
        e = effect(ablated, component, path)
        logprob = row(frame, component, "logprob", path)
        assert (logprob["clean"], logprob["patched"]) == (ablated.clean.logprob, e.logprob)
        assert logprob["difference"] == e.d_logprob
        assert (logprob["kind"], logprob["layer"], logprob["index"], logprob["mode"]) == (
            e.kind,
            e.layer,
            e.index,
            "zero",
        )
        assert row(frame, component, "logit", path)["difference"] == e.d_logit
        rank = row(frame, component, "rank", path)
        assert (rank["clean"], rank["patched"], rank["difference"]) == (ablated.clean.rank, e.rank, e.d_rank)
        kl = row(frame, component, "kl", path)
        assert (kl["clean"], kl["patched"], kl["difference"]) == (0.0, e.kl, e.kl)
        assert math.isnan(logprob["fraction"]) and math.isnan(logprob["estimate"])  # ablation: none


def test_frame_values_equal_to_dict(patched, with_foil) -> None:
    data = patched.to_dict()
    frame = patched.to_pandas()
    for stored in data["effects"][::20]:
        cells = row(frame, stored["component"], "logprob", stored["path"])
        assert cells["patched"] == stored["logprob"] and cells["difference"] == stored["d_logprob"]
        assert cells["fraction"] == stored["fraction_logprob"]
        assert cells["clean"] == data["clean"]["logprob"]
    foiled = with_foil.to_pandas()
    stored = with_foil.to_dict()["effects"][2]
    diff = row(foiled, stored["component"], "logit_diff", stored["path"])
    assert (diff["patched"], diff["difference"]) == (stored["logit_diff"], stored["d_logit_diff"])
    assert diff["clean"] == with_foil.to_dict()["clean"]["logit_diff"]


def test_the_estimate_stands_on_the_headline_metric_only(ablated) -> None:
    first = replace(ablated.effects[0], estimate=-0.25)
    frame = effects_frame(replace(ablated, effects=(first,)))
    assert frame["estimate"].tolist()[0] == -0.25
    assert frame["estimate"][1:].isna().all()


def test_top_effects_are_the_headline_rows_with_the_largest_change(ablated, patched) -> None:
    top = top_effects_frame(ablated, 7)
    assert len(top) == 7 and "metric" not in top.columns and "fraction" not in top.columns
    everything = effects_frame(ablated)
    largest = everything[everything["metric"] == "logprob"]["difference"].abs().nlargest(7)
    assert np.allclose(sorted(top["difference"].abs(), reverse=True), largest)
    assert list(top["difference"].abs()) == sorted(top["difference"].abs(), reverse=True)
    # denoising starts from the corrupted run: its largest effects move the fraction most
    denoised = top_effects_frame(replace(patched, mode="denoise"), 5)
    fractions = effects_frame(patched).query("metric == 'logprob'")["fraction"].abs()
    assert np.allclose(denoised["fraction"].abs(), fractions.nlargest(5))


# -------------------------------------------------------------------------------- files
def test_ablate_writes_json_csv_figures_and_page(ablated, tmp_path: Path) -> None:
    paths = write_intervention_report(ablated, tmp_path)
    names = [p.name for p in paths]
    assert names == ["ablate.json", "effects.csv", "heads.png", "neurons.png", "ablate.html"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    assert json.loads((tmp_path / "ablate.json").read_text()) == json.loads(json.dumps(ablated.to_dict()))
    assert (tmp_path / "effects.csv").read_text(encoding="utf-8") == frame_csv(ablated.to_pandas())
    for name in ("heads.png", "neurons.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG)


def test_patch_writes_the_residual_grid_and_no_head_figure(patched, tmp_path: Path) -> None:
    names = [p.name for p in write_intervention_report(patched, tmp_path)]
    assert names == ["patch.json", "effects.csv", "residual.png", "patch.html"]
    data = json.loads((tmp_path / "patch.json").read_text())
    assert data == json.loads(json.dumps(patched.to_dict()))
    assert data["corrupt"]["logprob"] == patched.corrupt.logprob
    assert (tmp_path / "effects.csv").read_text(encoding="utf-8") == frame_csv(patched.to_pandas())
    assert (tmp_path / "residual.png").read_bytes().startswith(PNG)


def test_figures_are_drawn_only_where_their_data_exists(ablated, patched) -> None:
    assert [name for name, _ in intervention_figures(ablated)] == ["heads.png", "neurons.png"]
    assert [name for name, _ in intervention_figures(patched)] == ["residual.png"]
    mlps = replace(ablated, effects=tuple(e for e in ablated.effects if e.kind == "mlp"))
    assert intervention_figures(mlps) == []


# ------------------------------------------------------------------------------ figures
def shown(fig, panel: int = 0) -> np.ndarray:
    """The numbers heatmap panel `panel` shows (nan where masked)."""
    image = [ax for ax in fig.axes if ax.images][panel].images[0]
    return np.ma.filled(np.ma.asarray(image.get_array(), dtype=float), np.nan)


def test_head_heatmap_puts_each_difference_in_its_cell(ablated) -> None:
    fig = head_heatmap_figure(ablated)
    total, direct = shown(fig, 0), shown(fig, 1)
    assert total.shape == direct.shape == (ablated.n_layers, ablated.n_heads)
    assert total[4, 3] == effect(ablated, "L4.H3").d_logprob
    assert direct[1, 2] == effect(ablated, "L1.H2", "direct").d_logprob
    assert [ax.get_xlabel() for ax in fig.axes if ax.images] == ["head", "head"]
    assert fig.axes[0].get_ylabel() == "layer"
    image = fig.axes[0].images[0]
    assert image.norm.vmin == -image.norm.vmax  # centred at 0
    assert "zero ablation" in fig.get_suptitle()
    only_total = replace(ablated, effects=ablated.select(path="total"))
    assert len([ax for ax in head_heatmap_figure(only_total).axes if ax.images]) == 1


def test_neuron_strip_sorts_neurons_and_draws_total_beside_direct(ablated) -> None:
    fig = neuron_strip_figure(ablated)
    ax = fig.axes[0]
    labels = [tick.get_text() for tick in ax.get_yticklabels()]
    assert sorted(labels) == ["L2.N5", "L4.N7"]
    totals = [abs(effect(ablated, label).d_logprob) for label in labels]
    assert totals == sorted(totals, reverse=True)
    bars = ax.patches
    assert len(bars) == 4  # total and direct of each neuron
    assert bars[0].get_width() == effect(ablated, labels[0]).d_logprob
    assert bars[2].get_width() == effect(ablated, labels[0], "direct").d_logprob


def test_attribution_patching_is_named_so_and_draws_its_estimates_beside_the_exact_effects(
    screened,
) -> None:
    """`patch --atp` said "activation patching" and drew only the confirmed heads, greyed the
    rest without a legend: its figures put the estimate of every head (and of the neurons with
    the largest |estimate|) beside the exact effect of those confirmed, and say what grey is."""
    assert mode_text(screened).startswith("attribution patching, noise") and "top 5 confirmed" in mode_text(
        screened
    )
    estimates = {s.component: s for s in screened.screened}
    heads = head_heatmap_figure(screened)
    estimate, exact = shown(heads, 0), shown(heads, 1)
    assert not np.isnan(estimate).any() and estimate[1, 2] == estimates["L1.H2"].estimate
    for head in (s for s in screened.screened if s.kind == "head"):
        value = exact[head.layer, head.index]
        assert (value == effect(screened, head.component).d_logprob) if head.confirmed else np.isnan(value)
    titles = [ax.get_title() for ax in heads.axes if ax.images]
    assert "attribution patching" in titles[0] and "activation patching" in titles[1]
    assert [t.get_text() for ax in heads.axes if ax.get_legend() for t in ax.get_legend().get_texts()] == [
        UNCONFIRMED
    ]
    neurons = neuron_strip_figure(screened)
    ax = neurons.axes[0]
    labels = [tick.get_text() for tick in ax.get_yticklabels()]
    assert labels == [s.component for s in screened.screened if s.kind == "neuron"][: len(labels)]
    assert ax.patches[0].get_width() == estimates[labels[0]].estimate
    grey = {t.get_text() for t in ax.get_yticklabels() if t.get_color() != "black"}
    assert grey == {name for name in labels if not estimates[name].confirmed} != set()
    legend = " ".join(t.get_text() for t in neurons.legends[0].get_texts())
    assert "first-order estimate" in legend and "exact effect" in legend and "not confirmed" in legend
    assert "Attribution patching" in caption(screened, "heads.png") and "grey" in caption(
        screened, "heads.png"
    )
    assert "<h1>Attribution patching on " in intervention_html(screened, [])
    text = terminal_summary(screened)
    assert "estimate: attribution patching's first-order estimate" in text
    assert "note: attribution patching (plain AtP" in text


def test_estimates_alone_are_drawn_listed_and_written_whole(estimated, screened, tmp_path: Path) -> None:
    """`confirm` 0: nothing patched exactly, and the figures, the terminal and screen.csv show the
    estimates (the heat map without its exact panel); screen.csv is the whole screen, the same
    frame as `screen.to_pandas()`."""
    assert estimated.effects == () and estimated.screen is not None
    assert "first-order estimates only, none confirmed" in mode_text(estimated)
    assert [name for name, _ in intervention_figures(estimated)] == ["heads.png", "neurons.png"]
    heads = head_heatmap_figure(estimated)
    assert len([ax for ax in heads.axes if ax.images]) == 1
    assert shown(heads)[1, 2] == {s.component: s.estimate for s in estimated.screened}["L1.H2"]
    lines = terminal_summary(estimated).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("the largest first-order estimates"))
    assert [line.split()[0] for line in lines[start + 2 : start + 12]] == [
        s.component for s in estimated.screened[:10]
    ]
    assert "every head and neuron in screen.csv" in terminal_summary(estimated)
    names = [p.name for p in write_intervention_report(estimated, tmp_path)]
    assert names == ["patch.json", "effects.csv", "screen.csv", "heads.png", "neurons.png", "patch.html"]
    frame = pandas.read_csv(tmp_path / "screen.csv")
    assert list(frame.columns) == list(SCREEN_COLUMNS)
    assert (tmp_path / "screen.csv").read_text(encoding="utf-8") == frame_csv(estimated.screen.to_pandas())
    layers, d_ff = estimated.screen.neurons.shape
    assert len(frame) == layers * estimated.n_heads + layers * d_ff
    assert list(frame.kind.unique()) == ["head", "neuron"] and not frame.confirmed.any()
    assert frame.component[estimated.n_heads + 1] == "L1.H1"
    assert frame.estimate[layers * estimated.n_heads + d_ff + 7] == float(estimated.screen.neurons[1, 7])
    assert "screen" not in json.loads((tmp_path / "patch.json").read_text())
    whole = screened.screen.to_pandas()
    assert sorted(whole.loc[whole.confirmed, "component"]) == sorted(e.component for e in screened.effects)
    assert_displays(screened.screen, ["largest first-order estimates", "confirmed"], figure=False)


def test_a_result_without_the_direct_path_says_how_to_ask_for_it(ablated, patched, tmp_path: Path) -> None:
    assert terminal_summary(patched).splitlines()[-1].strip() == (
        "direct path not computed (total path only): `direct=True` measures it too"
    )
    assert "direct path not computed" not in terminal_summary(ablated)
    write_intervention_report(patched, tmp_path)
    parsed = Page()
    parsed.feed((tmp_path / "patch.html").read_text(encoding="utf-8"))
    assert "the direct path was not computed (ask for it with direct=True, --direct on the command line)" in (
        parsed.text
    )
    assert "total and direct" in intervention_html(ablated, [])
    assert json.loads((tmp_path / "patch.json").read_text())["direct"] is False
    head = replace(patched, effects=tuple(e for e in ablated.effects if e.component == "L1.H2"))
    total = replace(head, effects=head.effects[:1])
    assert len([ax for ax in head_heatmap_figure(head).axes if ax.images]) == 2  # ablated's direct=True
    assert len([ax for ax in head_heatmap_figure(total).axes if ax.images]) == 1


def test_residual_grid_puts_each_state_at_its_layer_and_position(patched) -> None:
    fig = residual_grid_figure(patched)
    grid = shown(fig)
    assert grid.shape == (patched.n_layers + 1, len(patched.tokens))
    # noising shows the difference from the clean run: what matters moves away from white
    assert grid[2, 1] == effect(patched, "L2.resid@1").d_logprob
    assert grid[patched.n_layers, 8] == effect(patched, f"L{patched.n_layers}.resid@8").d_logprob
    labels = [tick.get_text() for tick in fig.axes[0].get_xticklabels()]
    assert labels[1] == "␣king / ␣queen 1" and labels[2] == "␣is 2"  # the corrupted token beside
    denoised = shown(residual_grid_figure(replace(patched, mode="denoise")))  # the fraction restored
    assert denoised[2, 1] == effect(patched, "L2.resid@1").fraction_logprob
    ablated_states = replace(patched, command="ablate", mode="zero")  # no corrupted run: differences
    assert shown(residual_grid_figure(ablated_states))[2, 1] == effect(patched, "L2.resid@1").d_logprob


# ------------------------------------------------------------------------- page, terminal
def test_page_is_self_contained_embeds_every_figure_and_escapes_text(ablated, tmp_path: Path) -> None:
    hostile = replace(
        ablated,
        tokens=("<b>bold</b>", *ablated.tokens[1:]),
        target="<script>alert(1)</script>",
        notes=("a note & <i>more</i>",),
    )
    write_intervention_report(hostile, tmp_path)
    page = (tmp_path / "ablate.html").read_text(encoding="utf-8")
    parsed = Page()
    parsed.feed(page)
    tags = {tag for tag, _ in parsed.tags}
    assert not tags & {"script", "b", "i", "link", "iframe"}
    assert not fetched(page)
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "<script>alert(1)</script>" in parsed.text
    assert "a note & <i>more</i>" in parsed.text
    images = [attrs for tag, attrs in parsed.tags if tag == "img"]
    assert sorted(str(a["alt"]) for a in images) == ["heads.png", "neurons.png"]
    for attrs in images:
        data = str(attrs["src"]).removeprefix("data:image/png;base64,")
        assert base64.b64decode(data) == (tmp_path / str(attrs["alt"])).read_bytes()
    marked = [attrs for _, attrs in parsed.tags if attrs.get("class") == "position"]
    assert len(marked) == 1


def test_patch_page_shows_the_corrupted_text_and_run(patched, tmp_path: Path) -> None:
    write_intervention_report(patched, tmp_path)
    parsed = Page()
    parsed.feed((tmp_path / "patch.html").read_text(encoding="utf-8"))
    changed = [attrs for _, attrs in parsed.tags if "changed" in str(attrs.get("class"))]
    assert len(changed) == 1  # " queen" is the one token that differs
    assert "corrupted log p(target)" in parsed.text and "␣queen" in parsed.text
    assert f"{patched.corrupt.logprob:.4g}" in parsed.text


def test_terminal_summary_names_the_prediction_and_the_largest_effects(ablated, patched) -> None:
    text = terminal_summary(ablated)
    lines = text.splitlines()
    assert "zero ablation" in lines[0] and "␣question" in lines[0]
    assert f"log p {ablated.clean.logprob:.4g}" in lines[1]
    top = top_effects_frame(ablated, 10)
    assert len(lines) == 4 + 10
    for line, component, path in zip(lines[4:], top["component"], top["path"], strict=True):
        assert line.split()[:2] == [component, path]
    assert "corrupted: log p" in terminal_summary(patched) and "fraction" in terminal_summary(patched)


# ------------------------------------------------------------------------------ notebook
def test_a_result_shows_the_pages_tables_and_figures(ablated, patched) -> None:
    fragment = assert_displays(ablated, ["prediction", top_effects_title(ablated), "difference", "L4.H3"])
    assert fragment.count("<img") == 2  # heads, neurons
    assert "heads.png: " in fragment and "neurons.png: " in fragment
    fragment = assert_displays(patched, ["prediction", "corrupted log p(target)", "fraction"])
    assert fragment.count("<img") == 1  # residual
