"""Comparison tables and sweep plots, on hand-made sweep.json / eval.json fixtures (no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from resstream.reporting import plots, tables
from resstream.training.records import GateHistory, RunRecord, SweepResult, gate_history, load_runs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: (seed, run) -> validation loss. Fixed-cut means: k0 3.6, k1 2.6, k2 2.8 -> best k = 1.
VAL = {
    (0, "baseline"): 2.0,
    (0, "fixed-k0"): 3.5,
    (0, "fixed-k1"): 2.5,
    (0, "fixed-k2"): 2.0,
    (0, "learned"): 3.0,
    (1, "baseline"): 4.0,
    (1, "fixed-k0"): 3.7,
    (1, "fixed-k1"): 2.7,
    (1, "fixed-k2"): 3.6,
    (1, "learned"): 3.0,
}
#: (seed, run) -> (wikitext-2 ppl, lambada ppl, lambada last-word accuracy %).
EVALS = {
    (0, "baseline"): (10.0, 30.0, 20.0),
    (1, "baseline"): (20.0, 50.0, 30.0),
    (0, "fixed-k1"): (12.0, 35.0, 40.0),
    (1, "fixed-k1"): (14.0, 45.0, 50.0),
    (0, "learned"): (11.0, 60.0, 10.0),
    (1, "learned"): (13.0, 40.0, 20.0),
    (0, "fixed-k0"): (1.0, 1.0, 99.0),
    (1, "fixed-k0"): (1.0, 1.0, 99.0),  # not the best cut: unused
}


def run_entry(name: str, val: float) -> dict:
    if name == "baseline":
        gate, cut, alpha = "none", None, None
    elif name == "learned":
        gate, cut, alpha = "learned", None, None
    else:
        gate, cut, alpha = "fixed", int(name.removeprefix("fixed-k")), 0.5
    return {"gate": gate, "cut_layer": cut, "alpha": alpha, "val_loss": val, "dir": None, "eval": None}


def bench(name: str, perplexity: float, **extra) -> dict:
    return {
        "name": name,
        "loss": math.log(perplexity),
        "perplexity": perplexity,
        "accuracy": 5.0,
        "num_tokens": 100,
        "last_word_accuracy": None,
        "num_examples": None,
        **extra,
    }


def write_sweep(root: Path, val: dict, evals: dict, *, in_sweep_json: set = frozenset()) -> Path:
    """A sweep directory as `resstream sweep` leaves it; evals in eval.json unless listed."""
    runs: dict[str, dict] = {}
    for (seed, name), loss in val.items():
        entry = run_entry(name, loss)
        entry["dir"] = f"seed-{seed}/{name}"
        run_dir = root / f"seed-{seed}" / name
        run_dir.mkdir(parents=True)
        if (seed, name) in evals:
            wiki, lam_ppl, lam_acc = evals[(seed, name)]
            scores = [
                bench("wikitext-2", wiki),
                bench("lambada", lam_ppl, last_word_accuracy=lam_acc, num_examples=10),
            ]
            if (seed, name) in in_sweep_json:
                entry["eval"] = {s["name"]: s for s in scores}
            else:
                (run_dir / "eval.json").write_text(json.dumps({"model": str(run_dir), "benchmarks": scores}))
        runs.setdefault(str(seed), {})[name] = entry
    seeds = sorted({seed for seed, _ in val})
    (root / "sweep.json").write_text(
        json.dumps(
            {
                "format": "resstream-sweep",
                "version": 1,
                "n_layer": 3,
                "alpha": 0.5,
                "seeds": seeds,
                "layers": [0, 1, 2],
                "learned": True,
                "benchmarks": ["wikitext-2", "lambada"],
                "config": {},
                "runs": runs,
            }
        )
    )
    return root


@pytest.fixture
def sweep_dir(tmp_path):
    return write_sweep(tmp_path / "sweep", VAL, EVALS, in_sweep_json={(1, "learned")})


def table_for(*paths, benchmarks=("wikitext-2", "lambada")):
    return tables.compare_table(load_runs(list(paths)), benchmarks)


def test_stat_mean_and_sample_std():
    stat = tables.Stat((2.0, 4.0))
    assert stat.mean == 3.0 and stat.std == pytest.approx(math.sqrt(2))
    assert stat.format() == "3.000 ± 1.414"
    assert tables.Stat((2.5,)).format() == "2.500" and tables.Stat((2.5,)).std is None
    assert tables.make_stat([1.0, None, float("nan"), 3.0]) == tables.Stat((1.0, 3.0))
    assert tables.make_stat([None]) is None


def test_best_fixed_cut_is_lowest_mean_val_loss(sweep_dir):
    table = table_for(sweep_dir)
    assert table.best_fixed.cut_layer == 1 and table.best_fixed.alpha == 0.5
    assert {c.cut_layer: round(c.val_loss.mean, 9) for c in table.fixed_cuts} == {0: 3.6, 1: 2.6, 2: 2.8}
    assert [row.label for row in table.rows] == ["baseline", "best fixed cut (k=1, α=0.5)", "learned gate"]
    assert [row.n for row in table.rows] == [2, 2, 2]


def test_cells_mean_std_and_bold(sweep_dir):
    table = table_for(sweep_dir)
    assert [c.key for c in table.columns] == [
        "val_loss",
        "wikitext-2/perplexity",
        "lambada/perplexity",
        "lambada/last_word_accuracy",
    ]
    markdown = table.to_markdown()
    lines = markdown.splitlines()
    assert lines[0] == ("| model | n | val loss | wikitext-2 ppl | lambada ppl | lambada last-word acc (%) |")
    # Hand-computed: mean ± sample std (ddof = 1); std of (a, b) is |a - b| / sqrt(2).
    assert (
        lines[2] == "| baseline | 2 | 3.000 ± 1.414 | 15.000 ± 7.071 | **40.000 ± 14.142** | 25.000 ± 7.071 |"
    )
    assert lines[3] == (
        "| best fixed cut (k=1, α=0.5) | 2 | **2.600 ± 0.141** | 13.000 ± 1.414 | "
        "**40.000 ± 7.071** | **45.000 ± 7.071** |"
    )
    assert (
        lines[4]
        == "| learned gate | 2 | 3.000 ± 0.000 | **12.000 ± 1.414** | 50.000 ± 14.142 | 15.000 ± 7.071 |"
    )
    assert "sample standard deviation (ddof = 1)" in markdown
    assert "k=0: 3.600 ± 0.141, k=1: 2.600 ± 0.141, k=2: 2.800 ± 1.131" in markdown


def test_more_seeds_from_several_inputs(sweep_dir, tmp_path):
    other = write_sweep(
        tmp_path / "other",
        {(2, "baseline"): 3.0, (2, "fixed-k1"): 2.6, (2, "learned"): 3.3},
        {(2, "baseline"): (15.0, 40.0, 25.0)},
    )
    table = table_for(sweep_dir, other / "seed-2")
    baseline = table.rows[0]
    assert baseline.seeds == (0, 1, 2)
    assert baseline.cells["val_loss"].format() == "3.000 ± 1.000"  # (2, 4, 3)
    fixed = table.rows[1]
    assert fixed.cells["wikitext-2/perplexity"].n == 2  # seed 2 has no eval for this run
    assert table.cell_text(fixed, table.columns[1], bold=False) == "13.000 ± 1.414 (n=2)"
    assert "| best fixed cut (k=1, α=0.5) | 3 |" in table.to_markdown()


def test_single_seed_shows_no_std(sweep_dir):
    table = table_for(sweep_dir / "seed-0")
    assert table.rows[0].cells["val_loss"].format() == "2.000"
    assert table.best_fixed.cut_layer == 2  # seed 0 alone: k2 = 2.0 is lowest
    assert "±" not in table.to_markdown().split("\n\n")[0]


def test_missing_rows_and_columns():
    records = [
        RunRecord(0, "fixed-k0", "fixed", 0, 0.5, 2.0),
        RunRecord(0, "fixed-k1", "fixed", 1, 0.5, 1.0),
    ]
    table = tables.compare_table(records, ["wikitext-2"])
    assert [row.key for row in table.rows] == ["fixed"]
    assert [c.key for c in table.columns] == ["val_loss", "wikitext-2/perplexity"]  # no accuracy: none saved
    assert table.cell_text(table.rows[0], table.columns[1]) == "—"
    assert table.best_rows(table.columns[1]) == set()


def test_csv_and_json(sweep_dir):
    table = table_for(sweep_dir)
    rows = table.to_csv().splitlines()  # one line per row and column: 3 rows × 4 columns
    assert rows[0] == ",".join(tables.COMPARE_COLUMNS) and len(rows) == 1 + 3 * 4
    assert rows[1].startswith("baseline,baseline,,,2,,val_loss,2,3.0,1.414213562373")
    assert rows[5].startswith('fixed,"best fixed cut (k=1, α=0.5)",1,0.5,2,,val_loss,2,2.6')
    assert rows[6].startswith('fixed,"best fixed cut (k=1, α=0.5)",1,0.5,2,wikitext-2,perplexity,2,13.0')
    data = table.to_dict()
    assert data["best_fixed_cut"]["cut_layer"] == 1
    cell = data["rows"][2]["cells"]["wikitext-2/perplexity"]
    assert cell["values"] == [11.0, 13.0] and cell["best"] is True and cell["n"] == 2
    assert data["rows"][0]["cells"]["lambada/perplexity"]["best"] is True  # tie with the fixed cut
    json.dumps(data)


# ----------------------------------------------------------------------------- plots
def hand_result(root: Path) -> SweepResult:
    runs = tuple(
        RunRecord(
            seed,
            name,
            **{k: v for k, v in run_entry(name, loss).items() if k in ("gate", "cut_layer", "alpha")},
            val_loss=loss,
        )
        for (seed, name), loss in VAL.items()
    )
    history = GateHistory((1, 2, 3), ((0.4, 0.3, 0.3), (0.5, 0.3, 0.2), (0.6, 0.3, 0.1)))
    return SweepResult(
        root=root,
        n_layer=3,
        alpha=0.5,
        seeds=(0, 1),
        layers=(0, 1, 2),
        learned=True,
        benchmarks=(),
        runs=runs,
        gate_histories={0: history, 1: history},
        config={},
    )


def check_png(path: Path) -> np.ndarray:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 300 and image.std() > 0
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary files left
    return image


def test_val_loss_plot(tmp_path):
    result = hand_result(tmp_path)
    fig = plots.sweep_val_loss_figure(result)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    baseline = next(line for label, line in lines.items() if label.startswith("baseline"))
    learned = next(line for label, line in lines.items() if label.startswith("learned gate"))
    assert baseline.get_linestyle() == ":" and baseline.get_ydata()[0] == pytest.approx(3.0)
    assert learned.get_linestyle() == "--" and learned.get_ydata()[0] == pytest.approx(3.0)
    seed0 = lines["fixed cut, seed 0"]
    assert list(seed0.get_xdata()) == [0, 1, 2] and list(seed0.get_ydata()) == [3.5, 2.5, 2.0]
    assert ax.get_xlabel().startswith("cut layer") and ax.get_ylabel() == "validation loss"
    assert any("mean ± std" in text.get_text() for text in ax.get_legend().get_texts())
    check_png(plots.save_figure(fig, tmp_path / "plots" / "sweep_val_loss.png"))
    assert fig.axes == []  # closed (cleared) after saving


def test_gate_heatmap_data_and_png(tmp_path):
    run = tmp_path / "learned"
    run.mkdir()
    records = [
        {"step": 1, "loss": 5.0, "gate": [0.5, 0.5]},
        {"step": 2, "loss": 4.9, "gate": [0.6, 0.4]},
        {"step": 2, "val_loss": 4.8},
        {"step": 3, "loss": 4.7, "gate": [0.7, 0.3]},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    history = gate_history(run)
    assert history.to_dict() == {"steps": [1, 2, 3], "p": [[0.5, 0.5], [0.6, 0.4], [0.7, 0.3]]}
    fig = plots.gate_heatmap_figure({0: history})
    shown = np.asarray(fig.axes[0].images[0].get_array())
    assert shown.shape == (2, 3)  # rows = layers, columns = steps
    assert np.array_equal(shown, np.array([r["gate"] for r in records if "gate" in r]).T)
    assert fig.axes[0].get_ylabel() == "layer" and fig.axes[0].get_xlabel() == "training step"
    assert len(fig.axes) == 2  # the heatmap and its colour bar
    check_png(plots.save_figure(fig, tmp_path / "plots" / "learned_gate_heatmap.png"))


def test_heatmap_without_records_refused():
    with pytest.raises(ValueError, match="no gate records"):
        plots.gate_heatmap_figure({0: GateHistory((), ())})


def test_sweep_csv(tmp_path):
    result = hand_result(tmp_path)
    result = SweepResult(
        **{
            **result.__dict__,
            "benchmarks": ("wikitext-2",),
            "runs": (
                RunRecord(0, "baseline", "none", None, None, 2.0, evals={"wikitext-2": {"perplexity": 9.5}}),
                RunRecord(0, "fixed-k1", "fixed", 1, 0.5, 2.5),
            ),
        }
    )
    lines = tables.sweep_csv(result).splitlines()
    assert lines[0] == ",".join(tables.SWEEP_COLUMNS)
    assert lines[1:] == [  # a score missing from a benchmark entry is empty; a run without one has no rows
        "0,baseline,none,,,,val_loss,2.0,",
        "0,baseline,none,,,wikitext-2,loss,,",
        "0,baseline,none,,,wikitext-2,perplexity,9.5,",
        "0,baseline,none,,,wikitext-2,accuracy,,",
        "0,fixed-k1,fixed,1,0.5,,val_loss,2.5,",
    ]


def _tick_numbers(axis) -> list[float]:
    return [float(t.get_text().replace("−", "-")) for t in axis.get_ticklabels() if t.get_text()]


def test_loss_curve_has_both_losses_and_whole_step_ticks():
    from resstream.reporting.plots import loss_curve_figure
    from resstream.training.records import TrainingCurve

    curve = TrainingCurve((1, 2, 3), (6.0, 5.5, 5.2), (2, 3), (5.6, 5.3))
    fig = loss_curve_figure(curve)
    fig.canvas.draw()
    ax = fig.axes[0]
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[1, 2, 3], [2, 3]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["training loss (batch)", "validation loss"]
    assert all(v.is_integer() for v in _tick_numbers(ax.xaxis)), _tick_numbers(ax.xaxis)


def test_run_gate_figure_shows_training_and_the_final_distribution():
    from resstream.reporting.plots import run_gate_figure

    history = GateHistory((1, 2, 3), ((0.5, 0.5), (0.6, 0.4), (0.7, 0.3)))
    fig = run_gate_figure(history, "learned")
    fig.canvas.draw()
    heat, bars = fig.axes[0], fig.axes[1]
    assert all(v.is_integer() for v in _tick_numbers(heat.xaxis))
    assert [p.get_width() for p in bars.patches] == pytest.approx([0.7, 0.3])
    assert bars.get_title() == "final p (step 3)"


def test_compare_figure_draws_each_row_with_its_std(sweep_dir):
    from resstream.reporting.plots import compare_figure

    table = tables.compare_table(load_runs([sweep_dir]), ("wikitext-2",))
    fig = compare_figure(table)
    assert [ax.get_title() for ax in fig.axes] == ["val loss", "wikitext-2 ppl"]
    ax = fig.axes[0]
    means = [row.cells["val_loss"].mean for row in table.rows]
    drawn = [
        line.get_ydata()[0]
        for line in ax.get_lines()
        if len(line.get_ydata()) == 1 and line.get_marker() == "o"
    ]
    assert drawn == pytest.approx(means)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["baseline", "fixed k=1", "learned"]


def test_compare_figure_of_one_seed_claims_no_spread_and_keeps_a_tiny_difference_small():
    """n = 1: no error bars, a title and caption that claim no std, and a y-range that draws a
    0.003-nat difference on a 6.43-nat loss as small, not full height."""
    from resstream.reporting.experiments import compare_caption
    from resstream.reporting.plots import MIN_RELATIVE_SPAN, compare_figure

    records = [
        RunRecord(0, "baseline", "none", None, None, 6.4345),
        RunRecord(0, "fixed-k0", "fixed", 0, 0.5, 6.4315),
        RunRecord(0, "learned", "learned", None, None, 6.4328),
    ]
    table = tables.compare_table(records, [])
    fig = compare_figure(table)
    (ax,) = fig.axes
    assert "std" not in fig.texts[0].get_text() and "one seed" in fig.texts[0].get_text()
    assert "standard deviation" not in compare_caption(table) and "n = 1" in compare_caption(table)
    assert not ax.collections  # no error bars
    low, high = ax.get_ylim()
    assert high - low >= MIN_RELATIVE_SPAN * 6.43 * 0.999
    assert (6.4345 - 6.4315) / (high - low) < 0.05


def test_footer_names_the_shakespeare_column_only_when_the_table_has_one():
    records = [
        RunRecord(0, "fixed-k0", "fixed", 0, 0.5, 2.0, evals={"shakespeare": {"perplexity": 9.0}}),
        RunRecord(0, "fixed-k1", "fixed", 1, 0.5, 1.0, evals={"shakespeare": {"perplexity": 8.0}}),
    ]
    with_tail = tables.compare_table(records, ["shakespeare"]).footer()
    assert "its val loss and the shakespeare column are measured on, so those two cells are" in with_tail
    without = tables.compare_table(records, ["wikitext-2"]).footer()
    assert "shakespeare" not in without and "its val loss is measured on, so that cell is" in without


def test_gate_heatmap_panels_keep_their_step_labels_apart():
    """Three seeds side by side over 800 steps: each panel gets a few step labels, not one per
    80 steps run together."""
    from resstream.reporting.plots import gate_heatmap_figure
    from resstream.training.records import GateHistory

    steps = tuple(range(10, 810, 10))
    history = GateHistory(steps, tuple((0.25, 0.25, 0.25, 0.25) for _ in steps))
    fig = gate_heatmap_figure({0: history, 1: history, 2: history})
    fig.canvas.draw()
    for ax in fig.axes[:3]:
        shown = [t for t in ax.get_xticks() if steps[0] - 5 <= t <= steps[-1] + 5]
        assert 2 <= len(shown) <= 5, shown
