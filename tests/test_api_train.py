"""`resstream.train` and `resstream.sweep`: the same runs as `resstream train` / `resstream
sweep` on the same settings, the files those write, and what `TrainResult` shows (short repr,
notebook view, long frame of the metrics log); parameters that are no config field refused
by name."""

from __future__ import annotations

import json
import math

import pytest

import resstream
from resstream.cli.main import main
from resstream.errors import UsageError
from resstream.reporting.experiments import TRAIN_COLUMNS
from resstream.reporting.notebook import frame_csv
from resstream.reporting.tables import SWEEP_COLUMNS
from resstream.training.checkpoint import load_run
from resstream.training.metrics import iter_metrics
from resstream.training.records import TrainResult, load_sweep
from tests.notebook_support import assert_displays, assert_frame_columns
from tests.test_train import corpus_text
from tests.training_support import assert_same_training

#: A tiny model and run, as config fields: a few steps take about a second.
FIELDS = {
    "n_layer": 2,
    "n_head": 2,
    "d_model": 16,
    "block_size": 16,
    "bpe_vocab_size": 300,
    "batch_size": 4,
    "max_steps": 4,
    "eval_interval": 2,
    "eval_batches": 1,
    "checkpoint_interval": 2,
    "warmup_steps": 1,
    "threads": 1,
    "device": "cpu",
}

#: Metrics that depend on the clock, not on the training.
TIMED = ("time", "tokens_per_s", "mfu")


def flags(fields: dict[str, object]) -> list[str]:
    """`fields` as the command's flags."""
    return [arg for name, value in fields.items() for arg in (f"--{name.replace('_', '-')}", str(value))]


@pytest.fixture
def setting(tmp_path):
    """The tiny run's fields with a corpus and a token cache in `tmp_path`."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(), encoding="utf-8")
    return {**FIELDS, "dataset": str(corpus), "cache_dir": str(tmp_path / "cache")}


@pytest.fixture
def learned_run(tmp_path, setting) -> TrainResult:
    """A learned-gate run of the API."""
    return resstream.train(tmp_path / "api", gate="learned", **setting)


def untimed(run_dir) -> list[dict[str, object]]:
    """The metrics log without its clock-dependent values."""
    return [{k: v for k, v in record.items() if k not in TIMED} for record in iter_metrics(run_dir)]


def test_the_api_trains_what_the_command_trains(tmp_path, setting, learned_run):
    command = tmp_path / "cli"
    args = ["train", "--preset", "tiny", "--gate", "learned", *flags(setting)]
    assert main([*args, "--out", str(command)]) == 0
    assert untimed(learned_run.run_dir) == untimed(command)
    assert_same_training(load_run(learned_run.run_dir), load_run(command), rtol=0, atol=0)
    for name in ("loss_curve.png", "gate.png", "model.json", "run.json"):
        assert (learned_run.run_dir / name).is_file() and (command / name).is_file(), name
    saved = json.loads((command / "model.json").read_text())
    assert learned_run.config == saved["config"]
    assert learned_run.final_val_loss == saved["val_loss"]


def test_the_result_repr_is_a_few_lines(learned_run):
    text = repr(learned_run)
    lines = text.splitlines()
    assert len(lines) <= 6 and all(len(line) <= 100 for line in lines), text
    assert str(learned_run.run_dir) in text
    assert "2 layers × 16, gate learned (p highest at layer " in text
    assert "4 steps" in text and f"validation loss {learned_run.final_val_loss:.3f}" in text
    assert repr(learned_run.train_losses[0]) not in text  # not a dump of the losses
    assert str(learned_run) == text


def test_the_frame_is_the_metrics_log(learned_run):
    assert_frame_columns(learned_run, TRAIN_COLUMNS)
    frame = learned_run.to_pandas()
    records = list(iter_metrics(learned_run.run_dir))

    def value(step, split, metric, layer=None):
        rows = frame[(frame.step == step) & (frame.split == split) & (frame.metric == metric)]
        rows = rows[rows.layer.isna()] if layer is None else rows[rows.layer == layer]
        assert len(rows) == 1, (step, split, metric, layer)
        return rows.value.iloc[0]

    steps = [r for r in records if "loss" in r]
    evaluations = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and [r["step"] for r in evaluations] == [2, 4]
    for record in steps:
        step = record["step"]
        for metric in ("loss", "lr", "grad_norm", "tokens_per_s"):
            assert value(step, "train", metric) == record[metric]
        for layer in (0, 1):
            assert value(step, "train", "gate_p", layer) == record["gate"][layer]
            assert value(step, "train", "layer_grad_norm", layer) == record["grad_norm_layers"][layer]
    for record in evaluations:
        assert value(record["step"], "val", "loss") == record["val_loss"]
    assert "mfu" not in set(frame.metric)  # a CPU has no known peak: no value, no row
    per_step = 4 + 2 * 2  # loss, lr, grad_norm, tokens/s; gate p and gradient norm per layer
    assert len(frame) == 4 * per_step + 2


def test_the_result_displays_its_losses_and_the_train_figures(learned_run, tmp_path, setting):
    fragment = assert_displays(learned_run, ["loss (train: each logged step", "step", "split", "value"])
    assert fragment.count("<img") == 2  # loss_curve.png and gate.png
    assert "loss_curve.png" in fragment and "gate.png" in fragment
    baseline = resstream.train(tmp_path / "baseline", **setting)  # no gate: no gate figure
    assert baseline.gate == "none" and "p highest" not in repr(baseline)
    assert assert_displays(baseline, ["loss (train"]).count("<img") == 1


def test_the_api_resumes_with_the_saved_config(tmp_path, setting):
    short = {**setting, "max_steps": 2}
    first = resstream.train(tmp_path / "run", gate="fixed", alpha=0.5, cut_layer=1, **short)
    assert "gate fixed (α 0.5 at layer 1)" in repr(first)
    more = resstream.train(tmp_path / "run", resume=True, max_steps=4, preset=None)
    assert (more.steps, more.steps_run) == (4, 2) and "(2 trained by this call)" in repr(more)
    assert more.config["model"]["gate"] == "fixed" and more.config["run"]["max_steps"] == 4
    assert list(more.curve.steps) == [1, 2, 3, 4]
    done = resstream.train(tmp_path / "run", resume=True)
    assert done.already_complete and "already complete" in repr(done) and done.steps_run == 0
    assert done.final_val_loss == more.final_val_loss and len(done.to_pandas()) == len(more.to_pandas())


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda out: resstream.train(out, max_step=3), "parameter `max_step` (did you mean 'max_steps'?)"),
        (lambda out: resstream.train(out, progres=True), "(did you mean 'progress'?)"),
        (lambda out: resstream.train(out, gate="learned", alpha=0.5), "`alpha` only apply to `gate` fixed"),
        (lambda out: resstream.train(out, preset="huge"), "unknown preset 'huge'"),
        (lambda out: resstream.train(out, max_steps="x"), "`max_steps`: 'x' is not a valid int"),
        (lambda out: resstream.sweep(out, seed=1), "`seed` is set by the sweep for each run; use `seeds`"),
        (lambda out: resstream.sweep(out, gate="fixed"), "`gate` is set by the sweep for each run"),
        (lambda out: resstream.sweep(out, layers=[5]), "`layers`: 5 is outside [0, 2)"),
        (lambda out: resstream.sweep(out, benchmarks="nope"), "unknown benchmark 'nope'"),
        (lambda out: resstream.sweep(out, seeds=[0], max_eval_tokens=1), "`max_eval_tokens` must be >= 2"),
    ],
)
def test_bad_parameters_are_refused_by_name(tmp_path, call, message):
    with pytest.raises(UsageError) as caught:
        call(tmp_path / "out")
    assert message in str(caught.value)
    assert "--" not in str(caught.value)  # library errors name parameters, not flags
    assert not (tmp_path / "out").exists()


def test_the_sweep_api_writes_what_the_command_writes(tmp_path, setting):
    sweep = resstream.sweep(tmp_path / "api", seeds=[0], layers=[1], learned=False, alpha=0.5, **setting)
    assert [run.name for run in sweep.runs] == ["baseline", "fixed-k1"]
    assert all(math.isfinite(run.val_loss) for run in sweep.runs)
    root = sweep.root
    for name in ("sweep.json", "run.json", "sweep.csv", "sweep_val_loss.png"):
        assert (root / name).is_file(), name
    assert not (root / "learned_gate_heatmap.png").exists()  # no learned gate
    for run in ("baseline", "fixed-k1"):
        assert (root / "seed-0" / run / "loss_curve.png").is_file(), run
    assert (root / "sweep.csv").read_text() == frame_csv(sweep.to_pandas())
    assert list(sweep.to_pandas().columns) == list(SWEEP_COLUMNS)
    assert load_sweep(root).to_dict() == sweep.to_dict()

    command = tmp_path / "cli"
    args = ["sweep", "--preset", "tiny", "--seeds", "0", "--layers", "1", "--no-learned", "--alpha", "0.5"]
    assert main([*args, *flags(setting), "--quiet", "--out", str(command)]) == 0
    assert {r.name: r.val_loss for r in load_sweep(command).runs} == {r.name: r.val_loss for r in sweep.runs}
