"""Ctrl-C keeps training progress: the first SIGINT/SIGTERM finishes the step, checkpoints it and
stops with KeyboardInterrupt (exit 130); a resume then equals an uninterrupted run bit for bit.

The signals are real (`signal.raise_signal` from inside the step the run is taking), so they go
through the handlers `resstream.interrupts.stop_requests` installs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from resstream.cli.main import main
from resstream.training import checkpoint as ckpt
from resstream.training import loop
from resstream.training import sweep as sw
from resstream.training.loop import train
from resstream.training.metrics import iter_metrics
from tests.test_cli_train import TINY, run_train
from tests.test_sweep import tiny_config as sweep_config
from tests.test_sweep import write_corpus
from tests.test_train import corpus_text, tiny_config

#: Metrics fields that measure time, not training: they differ between any two runs.
TIMING = ("time", "tokens_per_s", "mfu")


pytestmark = pytest.mark.usefixtures("default_signal_handlers")


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


def signal_at(monkeypatch, step: int, *signals: signal.Signals, run: str | None = None) -> None:
    """Raise `signals` in this process when the trainer (of the run folder named `run`, if
    given) starts step `step` (0-based), as a Ctrl-C at that moment would."""
    real = loop.Trainer.train_step

    def signalling(self, at, **kwargs):
        if at == step and (run is None or self.out_dir.name == run):
            for sig in signals:
                signal.raise_signal(sig)
        return real(self, at, **kwargs)

    monkeypatch.setattr(loop.Trainer, "train_step", signalling)


def metric_rows(run_dir) -> list[dict]:
    """The metrics log without the fields that measure time."""
    return [{k: v for k, v in rec.items() if k not in TIMING} for rec in iter_metrics(run_dir)]


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def assert_same_run(a: Path, b: Path) -> None:
    """Final weights, final optimizer and random state, and the metrics log are equal, bit for bit."""
    assert_same_tensors(ckpt.load_run(a).model.state_dict(), ckpt.load_run(b).model.state_dict())
    last_a, last_b = ckpt.load_checkpoint(a), ckpt.load_checkpoint(b)
    assert last_a.step == last_b.step
    assert last_a.optimizer_state["param_groups"] == last_b.optimizer_state["param_groups"]
    state_a, state_b = last_a.optimizer_state["state"], last_b.optimizer_state["state"]
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert_same_tensors(state_a[key], state_b[key])
    assert_same_tensors(last_a.rng_state, last_b.rng_state)
    assert metric_rows(a) == metric_rows(b)


def hidden_entries(run_dir: Path) -> list[str]:
    """What a half-finished save would leave in the checkpoints folder."""
    return [p.name for p in (run_dir / ckpt.CHECKPOINTS).iterdir() if p.name.startswith(".")]


@pytest.fixture
def whole(corpus, tmp_path):
    """An uninterrupted run of 8 steps (checkpoints at 4 and 8, dropout on: the random state counts)."""
    config = tiny_config(corpus, tmp_path, dropout=0.1)
    return config, train(config, tmp_path / "whole", progress=False)


@pytest.mark.parametrize(
    ("sig", "at_step"),
    [
        pytest.param(signal.SIGINT, 5, id="sigint-between-checkpoints"),  # checkpoint 6 saved for the stop
        pytest.param(signal.SIGTERM, 5, id="sigterm-between-checkpoints"),
        pytest.param(signal.SIGINT, 3, id="sigint-at-an-interval-checkpoint"),  # 4 is not saved twice
        pytest.param(signal.SIGINT, 7, id="sigint-at-the-last-step"),  # checkpoint 8 saved, no final model
    ],
)
def test_a_stop_checkpoints_the_step_and_the_resume_equals_an_uninterrupted_run(
    whole, tmp_path, monkeypatch, sig, at_step
):
    config, uninterrupted = whole
    run = tmp_path / "parts"
    lines: list[str] = []
    saves: list[int] = []
    real_save = loop.ckpt.save_checkpoint

    def counted(*args, **kwargs):
        saves.append(kwargs["step"])
        return real_save(*args, **kwargs)

    with monkeypatch.context() as patch:
        signal_at(patch, at_step, sig)
        patch.setattr(loop.ckpt, "save_checkpoint", counted)
        with pytest.raises(KeyboardInterrupt):
            train(config, run, progress=False, log=lines.append)
    done = at_step + 1
    assert saves == sorted({s for s in (4, done) if s <= done}), saves
    assert ckpt.latest_checkpoint_step(run) == done
    assert not (run / ckpt.MODEL_FILE).exists() and not hidden_entries(run)
    assert lines == [f"stopped at step {done} of 8; checkpoint {done} saved; `resume=True` continues from it"]
    assert max(rec["step"] for rec in iter_metrics(run)) == done
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers came back

    resumed = train(config, run, resume=True, progress=False)
    assert resumed.train_losses == uninterrupted.train_losses[done:]
    assert resumed.final_val_loss == uninterrupted.final_val_loss
    assert_same_run(tmp_path / "whole", run)


def test_a_second_ctrl_c_stops_at_once_without_a_new_checkpoint(whole, tmp_path, monkeypatch):
    config, _ = whole
    run = tmp_path / "parts"
    lines: list[str] = []
    with monkeypatch.context() as patch:
        signal_at(patch, 5, signal.SIGINT, signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            train(config, run, progress=False, log=lines.append)
    assert lines == []
    assert ckpt.latest_checkpoint_step(run) == 4  # the interval checkpoint stays the latest
    assert sorted(p.name for p in (run / ckpt.CHECKPOINTS).iterdir()) == [ckpt.LATEST, "step-0000004"]
    train(config, run, resume=True, progress=False)
    assert_same_run(tmp_path / "whole", run)


def test_a_stop_checkpoint_is_verified_by_the_step_after_it(whole, tmp_path, monkeypatch):
    config, _ = whole
    run = tmp_path / "parts"
    with monkeypatch.context() as patch:
        signal_at(patch, 4, signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            train(config, run, progress=False)
    assert not ckpt.load_checkpoint(run).verified  # no step has run from checkpoint 5 yet
    assert ckpt.newest_good_checkpoint(run) is not None and ckpt.newest_good_checkpoint(run).step == 4
    train(config, run, resume=True, progress=False)
    good = ckpt.newest_good_checkpoint(run)  # step 6 ran from checkpoint 5's weights
    assert good is not None and good.step == 5


def test_train_command_ctrl_c_exits_130_and_resume_continues(tmp_path, corpus, capsys, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        signal_at(patch, 1, signal.SIGINT)
        code = run_train(tmp_path, corpus, "--max-steps", "5")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130, err
    assert err == [
        f"stopped at step 2 of 5; checkpoint 2 saved; continue with: resstream train --resume --out {out}",
        "resstream: error: interrupted; nothing half-written was kept",
    ]
    assert ckpt.latest_checkpoint_step(out) == 2
    assert not (out / "loss_curve.png").exists()  # the run is not finished
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 0
    assert "trained 3 more steps (3 to 5)" in capsys.readouterr().out


def test_sweep_ctrl_c_checkpoints_the_current_run_and_a_rerun_equals_an_uninterrupted_sweep(
    tmp_path, monkeypatch
):
    write_corpus(tmp_path)
    plan = sw.plan_sweep(sweep_config(tmp_path, max_steps=4, checkpoint_interval=4, dropout=0.1), layers=(0,))
    assert [run.name for run in plan.runs] == ["baseline", "fixed-k0", "learned"]
    whole = sw.run_sweep(plan, tmp_path / "whole", progress=False)

    out = tmp_path / "parts"
    lines: list[str] = []
    with monkeypatch.context() as patch:
        signal_at(patch, 1, signal.SIGINT, run="fixed-k0")
        with pytest.raises(KeyboardInterrupt):
            sw.run_sweep(plan, out, progress=False, log=lines.append)
    assert lines == ["sweep [1/3] seed 0 baseline: training", "sweep [2/3] seed 0 fixed-k0: training"]
    assert ckpt.latest_checkpoint_step(out / "seed-0" / "fixed-k0") == 2
    assert not (out / "seed-0" / "learned").exists()

    lines.clear()
    again = sw.run_sweep(plan, out, progress=False, log=lines.append)
    assert lines[1:] == ["sweep [2/3] seed 0 fixed-k0: resuming", "sweep [3/3] seed 0 learned: training"]
    assert [(r.name, r.val_loss) for r in again.runs] == [(r.name, r.val_loss) for r in whole.runs]
    for run in plan.runs:
        assert_same_run(run.path(tmp_path / "whole"), run.path(out))


def test_sweep_command_ctrl_c_exits_130_and_the_same_command_continues(tmp_path, corpus, monkeypatch, capsys):
    out = tmp_path / "out"
    args = ["sweep", "--dataset", str(corpus), "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]
    args += [*TINY, "--max-steps", "3", "--layers", "0", "--no-learned"]
    with monkeypatch.context() as patch:
        signal_at(patch, 0, signal.SIGTERM, run="fixed-k0")
        code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130, err
    assert err == [
        "stopped at step 1 of 3; checkpoint 1 saved; "
        "the same sweep, run again, resumes seed 0 fixed-k0 from it",
        "resstream: error: interrupted; nothing half-written was kept",
    ]
    assert ckpt.latest_checkpoint_step(out / "seed-0" / "fixed-k0") == 1
    assert not (out / "sweep.json").exists()
    assert main(args) == 0
    assert "sweep of 2 runs finished" in capsys.readouterr().out


#: A torchrun worker whose rank 1 alone gets SIGINT at step 1 (0-based); each rank writes its
#: exit code to EXIT_DIR/rank-<r> before it exits.
RANK_ONE_INTERRUPTED = """
import os, signal, sys
from pathlib import Path
from resstream.training import loop

real = loop.Trainer.train_step

def signalling(self, step, **kwargs):
    if step == 1 and self.dist.rank == 1:
        signal.raise_signal(signal.SIGINT)
    return real(self, step, **kwargs)

loop.Trainer.train_step = signalling
from resstream.cli.main import main

code = main(sys.argv[1:])
Path(os.environ["EXIT_DIR"], "rank-" + os.environ["RANK"]).write_text(str(code))
sys.stdout.flush(); sys.stderr.flush()
os._exit(code)
"""


@pytest.mark.slow
def test_under_torchrun_every_rank_stops_after_the_same_step(tmp_path, corpus, capsys):
    """Only rank 1 gets the signal; rank 0 (which saves) learns of it from the per-step all-reduce."""
    worker = tmp_path / "worker.py"
    worker.write_text(RANK_ONE_INTERRUPTED, encoding="utf-8")
    out, exits = tmp_path / "run", tmp_path / "exits"
    exits.mkdir()
    args = ["train", "--dataset", str(corpus), "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*launch, str(worker), *args, *TINY, "--max-steps", "5", "--device", "cpu", "--threads", "1"],
        env={**os.environ, "OMP_NUM_THREADS": "1", "EXIT_DIR": str(exits)},
        capture_output=True,
        text=True,
        timeout=150,  # ranks that disagree about the stop wait for each other until killed
    )
    assert {p.name: p.read_text() for p in exits.iterdir()} == {"rank-0": "130", "rank-1": "130"}, done.stderr
    assert ckpt.latest_checkpoint_step(out) == 2, done.stderr
    stopped = [line for line in done.stderr.splitlines() if line.startswith("stopped at")]
    assert stopped == [
        f"stopped at step 2 of 5; checkpoint 2 saved; continue with: resstream train --resume --out {out}"
    ]
    assert max(rec["step"] for rec in iter_metrics(out)) == 2
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 0  # one process continues it
    assert "trained 3 more steps (3 to 5)" in capsys.readouterr().out


def wait_for_a_step(metrics: Path, process: subprocess.Popen, timeout: float) -> None:
    """Return once `metrics` holds a training step's record (the run is inside its step loop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics.is_file() and '"loss"' in metrics.read_text(encoding="utf-8"):
            return
        if process.poll() is not None:
            pytest.fail(f"train ended with {process.returncode} before its first step")
        time.sleep(0.05)
    process.kill()
    pytest.fail("no training step within the timeout")


def ctrl_c_after_a_step(launcher: list[str], tmp_path: Path, corpus: Path, *extra: str) -> tuple[int, str]:
    """Start `launcher` `train` of a run too long to finish, whose only checkpoint is the stop's;
    send the launched process SIGINT once the metrics log shows a step; check that the run stopped
    after the step its one stop line names, with that step's checkpoint the latest and its metrics
    the last. Returns the exit code and stderr."""
    out = tmp_path / "run"
    args = ["train", "--dataset", str(corpus), "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]
    steps = ["--max-steps", "100000", "--log-interval", "1", "--checkpoint-interval", "100000"]
    process = subprocess.Popen(
        [*launcher, *args, *TINY, *steps, *extra],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_a_step(out / "metrics.jsonl", process, timeout=180)
    os.kill(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=120)
    step = ckpt.latest_checkpoint_step(out)
    assert step is not None and step >= 1, err
    stopped = [line for line in err.splitlines() if line.startswith("stopped at")]
    assert stopped == [
        f"stopped at step {step} of 100000; checkpoint {step} saved; continue with: "
        f"resstream train --resume --out {out}"
    ], err
    assert max(rec["step"] for rec in iter_metrics(out)) == step
    assert not hidden_entries(out)
    return process.returncode, err


@pytest.mark.slow
def test_a_real_ctrl_c_to_the_train_process_checkpoints_and_exits_130(tmp_path, corpus):
    """`python -m resstream train` gets SIGINT from outside once it has taken a step (about 4 s
    on 2 cores, most of it importing torch)."""
    code, err = ctrl_c_after_a_step([sys.executable, "-m", "resstream"], tmp_path, corpus)
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "resstream: error: interrupted; nothing half-written was kept"


@pytest.mark.slow
def test_a_real_ctrl_c_to_torchrun_stops_every_rank_after_the_same_step(tmp_path, corpus):
    """SIGINT to `torchrun` itself, as a terminal's Ctrl-C sends it (the workers run in their own
    session: torchrun passes the signal on). 7 s on 2 quiet cores, 25 s on busy ones."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    _, err = ctrl_c_after_a_step(
        [*launch, "-m", "resstream.cli.main"], tmp_path, corpus, "--device", "cpu", "--threads", "1"
    )
    assert err.count("resstream: error: interrupted") == 2, err  # both ranks
