"""Checkpoints: round trip, interrupted saves, corrupt files, refusal of pickled code."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from resstream.errors import RunError, UsageError
from resstream.training import checkpoint as ckpt


def _save(run_dir, step, value):
    model_state = {"w": torch.full((3, 2), float(value))}
    optimizer_state = {
        "state": {0: {"step": torch.tensor(float(step)), "exp_avg": torch.ones(3, 2) * value}},
        "param_groups": [{"lr": 0.1, "params": [0], "name": "decay"}],
    }
    return ckpt.save_checkpoint(
        run_dir,
        step=step,
        model_state=model_state,
        optimizer_state=optimizer_state,
        rng_state={"cpu": torch.get_rng_state()},
        state={"config": {"x": 1}},
    )


def test_round_trip_and_latest_pointer(tmp_path):
    _save(tmp_path, 5, 1.0)
    _save(tmp_path, 10, 2.0)
    loaded = ckpt.load_checkpoint(tmp_path)
    assert loaded.step == 10
    assert torch.equal(loaded.model_state["w"], torch.full((3, 2), 2.0))
    assert torch.equal(loaded.optimizer_state["state"][0]["exp_avg"], torch.full((3, 2), 2.0))
    assert loaded.optimizer_state["param_groups"] == [{"lr": 0.1, "params": [0], "name": "decay"}]
    assert torch.equal(loaded.rng_state["cpu"], torch.get_rng_state())
    assert loaded.state["config"] == {"x": 1}


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, step)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["step-0000003", "step-0000004"]


_KILLED_WRITER = textwrap.dedent(
    """
    import sys, time, torch
    from resstream.training import checkpoint as ckpt

    run_dir = sys.argv[1]
    def save(step, value):
        ckpt.save_checkpoint(run_dir, step=step, model_state={"w": torch.full((4,), value)},
                             optimizer_state={"state": {}, "param_groups": []},
                             rng_state={"cpu": torch.get_rng_state()}, state={"config": {}})
    save(1, 1.0)
    real = ckpt.save_tensors
    def slow_save(path, tensors, metadata=None):
        real(path, tensors, metadata)
        print("writing", flush=True)
        time.sleep(60)  # killed here, in the middle of saving step 2
    ckpt.save_tensors = slow_save
    save(2, 2.0)
    """
)


def test_killing_the_process_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
        time.sleep(0.2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    loaded = ckpt.load_checkpoint(tmp_path)
    assert loaded.step == 1
    assert torch.equal(loaded.model_state["w"], torch.full((4,), 1.0))
    # The next save cleans up the interrupted one.
    _save(tmp_path, 3, 3.0)
    assert not list((tmp_path / "checkpoints").glob(".step-*"))


def test_missing_checkpoint_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no checkpoint in"):
        ckpt.load_checkpoint(tmp_path)


def test_corrupt_checkpoint_is_a_usage_error(tmp_path):
    path = _save(tmp_path, 1, 1.0)
    (path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(UsageError, match="corrupt or not safetensors"):
        ckpt.load_checkpoint(tmp_path)
    (tmp_path / "checkpoints" / "latest.json").write_text("{not json")
    with pytest.raises(UsageError, match="is corrupt"):
        ckpt.load_checkpoint(tmp_path)


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_torch_checkpoint_needing_unpickling_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "payload": _Payload()}, path)
    with pytest.raises(UsageError, match="would need unsafe unpickling"):
        ckpt.load_tensors(path)


def test_plain_torch_tensor_dict_loads(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.arange(3.0)}, path)
    assert torch.equal(ckpt.load_tensors(path)["w"], torch.arange(3.0))


def test_latest_step_reads_the_pointer(tmp_path):
    assert ckpt.latest_checkpoint_step(tmp_path) is None
    _save(tmp_path, 7, 1.0)
    assert ckpt.latest_checkpoint_step(tmp_path) == 7
    assert json.loads((tmp_path / "checkpoints" / "latest.json").read_text())["dir"] == "step-0000007"


# ------------------------------------------------------------------ good checkpoints (issue 9)
def _optimizer_state(value: float) -> dict:
    return {
        "state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.full((3, 2), value)}},
        "param_groups": [{"lr": 0.1, "params": [0], "name": "decay"}],
    }


@pytest.mark.parametrize(
    ("weights", "optimizer", "part", "tensor"),
    [
        (float("nan"), 1.0, "weights", "'w'"),
        (1.0, float("inf"), "optimizer state", "'state.0.exp_avg'"),
    ],
)
def test_a_non_finite_checkpoint_is_never_written(tmp_path, weights, optimizer, part, tensor):
    _save(tmp_path, 1, 1.0)
    written = rf"checkpoint step 2 was not written: non-finite values in its {part} \(tensor {tensor} holds 6"
    with pytest.raises(RunError, match=written):
        ckpt.save_checkpoint(
            tmp_path,
            step=2,
            model_state={"w": torch.full((3, 2), weights)},
            optimizer_state=_optimizer_state(optimizer),
            rng_state={"cpu": torch.get_rng_state()},
            state={"config": {"x": 1}},
        )
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest.json", "step-0000001"]
    assert ckpt.latest_checkpoint_step(tmp_path) == 1


def _poison(path, file_name, key):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / file_name))
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] = float("nan")
    save_file(tensors, str(path / file_name))


@pytest.mark.parametrize(
    ("file_name", "key", "part"),
    [("trainer.safetensors", "state.0.exp_avg", "optimizer state"), ("model.safetensors", "w", "weights")],
)
def test_resuming_from_a_non_finite_checkpoint_is_refused(tmp_path, file_name, key, part):
    _poison(_save(tmp_path, 1, 1.0), file_name, key)
    refused = rf"cannot resume from .*0001': non-finite values in its {part} \(tensor '{key}' holds 1 "
    with pytest.raises(UsageError, match=refused):
        ckpt.load_checkpoint(tmp_path)


def test_pruning_keeps_the_newest_good_checkpoint(tmp_path):
    _save(tmp_path, 1, 1.0)
    ckpt.mark_verified(tmp_path, 1, loss=5.0, grad_norm=1.0)
    for step in (2, 3, 4):
        _save(tmp_path, step, float(step))
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["step-0000001", "step-0000003", "step-0000004"]
    good = ckpt.newest_good_checkpoint(tmp_path)
    assert (good.step, good.path.name) == (1, "step-0000001")


def test_resume_skips_a_checkpoint_known_to_diverge(tmp_path):
    _save(tmp_path, 1, 1.0)
    ckpt.mark_verified(tmp_path, 1, loss=5.0, grad_norm=1.0)
    _save(tmp_path, 2, 2.0)
    good = ckpt.mark_diverged(tmp_path, 2, "non-finite training loss (nan) at step 3")
    assert good.step == 1
    loaded = ckpt.load_checkpoint(tmp_path)
    assert (loaded.step, loaded.verified) == (1, True)
    assert torch.equal(loaded.model_state["w"], torch.full((3, 2), 1.0))
    # The next save belongs to the resumed run: the diverged future is pruned.
    _save(tmp_path, 2, 5.0)
    assert ckpt.load_checkpoint(tmp_path).step == 2
    assert not (tmp_path / "checkpoints" / "step-0000002" / ckpt.DIVERGED).exists()


def test_resume_without_a_good_checkpoint_is_refused(tmp_path):
    _save(tmp_path, 1, 1.0)
    assert ckpt.mark_diverged(tmp_path, 1, "non-finite gradient norm (inf) at step 2") is None
    with pytest.raises(
        UsageError, match=r"cannot resume: checkpoint step 1 .* diverged .*no good checkpoint"
    ):
        ckpt.load_checkpoint(tmp_path)


def _interrupt_after_one_file(real):
    """A stand-in for shutil.rmtree that deletes one file and is then interrupted (Ctrl-C)."""

    def rmtree(path, *args, **kwargs):
        next(p for p in sorted(path.rglob("*")) if p.is_file()).unlink()
        raise KeyboardInterrupt

    return rmtree


def _step_dirs(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))


def test_an_interrupted_prune_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    for step in (1, 2):
        _save(tmp_path, step, float(step))
    monkeypatch.setattr(shutil, "rmtree", _interrupt_after_one_file(shutil.rmtree))
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 3, 3.0)
    monkeypatch.undo()
    assert _step_dirs(tmp_path) == ["step-0000002", "step-0000003"]
    for name in _step_dirs(tmp_path):
        assert {p.name for p in (tmp_path / "checkpoints" / name).iterdir()} >= {
            "model.safetensors",
            "trainer.safetensors",
            "state.json",
        }
    ckpt.remove_leftovers(tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "latest.json",
        "step-0000002",
        "step-0000003",
    ]


def test_an_interrupted_replacement_of_a_step_directory_leaves_no_half_deleted_checkpoint(
    tmp_path, monkeypatch
):
    _save(tmp_path, 1, 1.0)
    monkeypatch.setattr(shutil, "rmtree", _interrupt_after_one_file(shutil.rmtree))
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 1, 2.0)  # a resumed run saving a step again replaces its directory
    monkeypatch.undo()
    assert _step_dirs(tmp_path) == ["step-0000001"]
    assert torch.equal(ckpt.load_checkpoint(tmp_path).model_state["w"], torch.full((3, 2), 2.0))


def _leave_leftovers(run_dir, monkeypatch):
    """Run every writer of a training run as if killed between writing and renaming.

    Renames and clean-ups are switched off, so each writer leaves its temporary name behind.
    """
    from resstream.data import save_tokenizer, train_bpe
    from resstream.io import write_json

    tokenizer = train_bpe(["a b c d e f"] * 10, 270)
    (run_dir / "tokenizer").mkdir()  # saved by an earlier run: the interrupted save adds a staging folder
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", lambda *args, **kwargs: None)
        patch.setattr(ckpt.os, "replace", lambda *args, **kwargs: None)
        patch.setattr(type(run_dir), "unlink", lambda *args, **kwargs: None)
        patch.setattr(shutil, "rmtree", lambda *args, **kwargs: None)
        _save(run_dir, 2, 2.0)
        ckpt.mark_verified(run_dir, 1, loss=1.0, grad_norm=1.0)
        ckpt.save_model(run_dir, {"w": torch.ones(2)}, {"config": {}})
        write_json(run_dir / "run.json", {})
        write_json(run_dir / "metrics.jsonl", {})
        save_tokenizer(tokenizer, run_dir / "tokenizer")


def _all_names(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_remove_leftovers_removes_what_interrupted_writers_leave_and_nothing_else(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _save(run, 1, 1.0)
    mine = [
        "notes.tmp",
        ".hidden",
        ".run.json.bak",
        "model.safetensors.tmp",
        "checkpoints/my.step-0000001",
        "checkpoints/.notes",
        "checkpoints/step-0000001/.my-notes.tmp",
    ]
    for name in mine:
        (run / name).write_text("a user's file")
    (run / ".step-0000005").mkdir()  # a user's folder outside checkpoints/
    before = [*_all_names(run), "tokenizer"]
    _leave_leftovers(run, monkeypatch)
    left = set(_all_names(run)) - set(before)
    expected = {
        r"checkpoints/\.step-0000002\.\w+$",
        r"checkpoints/\.latest\.json\.\w+\.tmp$",
        r"checkpoints/step-0000001/\.verified\.json\.\w+\.tmp$",
        r"\.model\.safetensors\.\w+\.tmp$",
        r"\.model\.json\.\w+\.tmp$",
        r"\.run\.json\.\w+\.tmp$",
        r"\.metrics\.jsonl\.\w+\.tmp$",
        r"\.tokenizer\.\w+$",
    }
    for pattern in expected:  # the real names the writers leave (a pattern the test could miss fails)
        assert any(re.match(pattern, name) for name in left), (pattern, sorted(left))
    (run / ".tmpAb12Cd").write_bytes(b"\x00" * 8)  # safetensors' own temporary file (see below)
    ckpt.remove_leftovers(run)
    assert _all_names(run) == before


_KILLED_IN_SAFETENSORS = textwrap.dedent(
    """
    import sys, torch
    from resstream.training import checkpoint as ckpt
    print("writing", flush=True)
    ckpt.save_model(sys.argv[1], {"w": torch.ones(int(sys.argv[2]))}, {"config": {}})
    """
)


def _kill_while_writing(run: Path, numel: int) -> bool:
    """SIGKILL a process saving `numel` floats into `run` once its temporary file shows;
    False if the save finished first."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_IN_SAFETENSORS, str(run), str(numel)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 30
        while not list(run.glob(".tmp*")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.001)
    finally:
        finished = proc.poll() is not None
        proc.kill()  # SIGKILL (a no-op for a process already reaped)
        proc.wait()
    return not finished


def test_kill_inside_safetensors_leaves_a_name_remove_leftovers_knows(tmp_path):
    """safetensors writes `.tmpXXXXXX` beside its target and renames it: killed, that name stays."""
    for attempt, numel in enumerate((40_000_000, 120_000_000, 240_000_000)):
        run = tmp_path / f"run-{attempt}"
        run.mkdir()
        if _kill_while_writing(run, numel):
            break  # else the writer finished before the poll saw it (a loaded machine): a bigger write
    leftovers = [p.name for p in run.iterdir() if not p.name.startswith(".model.safetensors.")]
    assert any(re.fullmatch(r"\.tmp[A-Za-z0-9]{6}", name) for name in leftovers), sorted(leftovers)
    ckpt.remove_leftovers(run)
    assert list(run.iterdir()) == []


def test_checkpoint_directories_follow_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        path = _save(tmp_path, 1, 1.0)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o750


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: chmod 000 does not deny")
def test_an_unreadable_weights_file_is_reported_as_permission_denied(tmp_path):
    path = tmp_path / "model.safetensors"
    ckpt.save_tensors(path, {"w": torch.ones(2)})
    path.chmod(0)
    with pytest.raises(UsageError, match=r"cannot read .*model\.safetensors': permission denied"):
        ckpt.load_tensors(path)


def test_first_non_finite_names_the_tensor_and_counts_its_values():
    big = torch.full((4,), 3e38)  # finite, but its sum overflows: not a false alarm
    half = torch.full((100,), 60000.0, dtype=torch.float16)
    assert ckpt.first_non_finite({"big": big, "half": half, "ids": torch.arange(3)}.items()) is None
    bad = torch.zeros(10)
    bad[[2, 5]] = torch.tensor([float("nan"), float("-inf")])
    found = ckpt.first_non_finite({"big": big, "bad": bad, "worse": bad}.items())
    assert (found.tensor, found.count, found.total) == ("bad", 2, 10)
    assert str(found) == "tensor 'bad' holds 2 non-finite values of 10"


def test_integer_weights_are_refused_not_converted(tmp_path):
    model = torch.nn.Linear(2, 2)
    state = {"weight": torch.ones(2, 2, dtype=torch.int64), "bias": torch.zeros(2)}
    with pytest.raises(UsageError, match=r"tensor 'weight' has dtype int64; .*floating-point"):
        ckpt.load_weights(model, state, tmp_path)
