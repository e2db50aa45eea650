"""Run directories (issue 9): one writer at a time, checked before work, outputs complete or absent.

Locks are tested with real processes (a second `resstream` on a directory in use, a holder
killed with SIGKILL); interrupts with real SIGINTs sent to a real `resstream` process at
several moments of its life, imports included. A full disk, a read-only file system and a
missing permission are simulated by making the writer's system call fail with that errno
(these tests run as root, where chmod denies nothing), and on a real small tmpfs where the
test may mount one.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import resstream.rundir as rundir
from resstream import interrupts
from resstream.cli.main import main
from resstream.errors import RunError, UsageError
from resstream.io import write_json, write_text
from tests.cli_support import assert_complete_files, assert_nothing_written
from tests.test_train import corpus_text

SIMULATE = ["simulate", "--layers", "2", "--tokens", "5", "--dim", "4", "--sims", "20", "--quiet"]
HOLD_LOCK = """
import sys, time
from resstream.rundir import locked_directory
with locked_directory(sys.argv[1], "train"):
    print("held", flush=True)
    time.sleep(60)
"""


def resstream_process(*args: str, **kwargs) -> subprocess.Popen:
    """`python -m resstream ARGS` as a real process (the console script's entry point)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "resstream", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kwargs,
    )


def hold_lock(directory: Path) -> subprocess.Popen:
    """Another process that holds the lock of `directory` until killed."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(directory)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


# ---------------------------------------------------------------------------- locks


def test_a_second_process_is_refused_with_the_holders_pid(tmp_path):
    out = tmp_path / "out"
    holder = hold_lock(out)
    try:
        second = resstream_process(*SIMULATE, "--out", str(out))
        _, err = second.communicate(timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 2, err
    line = err.strip()
    assert len(line.splitlines()) == 1, err
    assert f"--out {str(out)!r} is in use by another resstream process (pid {holder.pid}" in line, line
    assert "resstream train" in line and "wait for it to finish" in line, line
    assert [p.name for p in out.iterdir()] == [rundir.LOCK_FILE]  # the holder's, untouched


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path, capsys):
    out = tmp_path / "out"
    holder = hold_lock(out)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (out / rundir.LOCK_FILE).is_file()  # left behind by kill -9
    assert main([*SIMULATE, "--out", str(out)]) == 0
    assert not (out / rundir.LOCK_FILE).exists()
    assert_complete_files(out)


def test_training_into_a_directory_in_use_is_refused_before_any_work(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b c\n" * 100, encoding="utf-8")
    out = tmp_path / "run"
    holder = hold_lock(out)
    try:
        code = main(["train", "--resume", "--out", str(out), "--dataset", str(corpus)])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip()
    assert code == 2 and "is in use by another resstream process" in err and f"pid {holder.pid}" in err, err


def test_locks_are_reentrant_within_a_process(tmp_path):
    with rundir.locked_directory(tmp_path / "d", "sweep"), rundir.locked_directory(tmp_path / "d", "train"):
        assert (tmp_path / "d" / rundir.LOCK_FILE).is_file()
    assert not (tmp_path / "d").exists()  # created for the lock, nothing written: removed again


def test_a_failed_command_removes_the_directories_it_created(tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    with pytest.raises(UsageError), rundir.locked_directory(deep, "shift"):
        raise UsageError("bad input")
    assert not (tmp_path / "a").exists()


def test_leftovers_of_interrupted_writers_are_removed_and_nothing_else(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    leftovers = [out / ".shift.json.k2x_9qab.tmp", out / ".model.safetensors.abcdefgh.tmp"]
    keep = [out / ".hidden", out / "notes.tmp", out / ".shift.json.tmp", out / "shift.json"]
    for path in leftovers + keep:
        path.write_text("x")
    (out / f"{rundir.STAGING_PREFIX}abc").mkdir()
    (out / f"{rundir.STAGING_PREFIX}abc" / "shift.json").write_text("{}")
    with rundir.locked_directory(out, "shift"):
        pass
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in keep)


# ---------------------------------------------------------------------------- output sets


def write_set(directory: Path, names: list[str], command: str = "shift") -> None:
    with rundir.output_set(directory, command) as outputs:
        for name in names:
            write_text(outputs / name, name)
        outputs.write_record({"config": {"command": command}})


def test_an_output_set_replaces_the_previous_set_whole(tmp_path):
    out = tmp_path / "out"
    write_set(out, ["shift.json", "match_rates_0.png", "match_rates_1.png", "comparison.png"])
    (out / "notes.md").write_text("the user's own file")
    write_set(out, ["shift.json", "match_rates.png"])
    assert sorted(p.name for p in out.iterdir()) == ["match_rates.png", "notes.md", "run.json", "shift.json"]
    record = json.loads((out / "run.json").read_text())
    assert record["files"] == ["match_rates.png", "shift.json", "run.json"]


def test_a_corpus_analysis_records_its_process_count_whatever_the_command_records(tmp_path):
    """`analysis_outputs` (the commands that may run under torchrun) puts `processes` in the
    run.json it stages: 1 run directly (2 under torchrun: tests/test_data_parallel.py)."""
    from resstream.cli.options import analysis_outputs, write_run_record

    with analysis_outputs(tmp_path / "out", "shift", "cpu") as outputs:
        assert outputs is not None
        write_run_record(outputs, "shift", {"top_k": 5}, "cpu", 0, "abc")
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["processes"] == 1 and record["config"]["top_k"] == 5 and record["files"] == ["run.json"]


def test_a_run_that_does_not_list_its_files_is_not_mixed_with_a_new_set(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "match_rates_0.png").write_text("an older resstream's plot")
    (out / "run.json").write_text(json.dumps({"config": {"command": "shift"}}))  # no "files"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(
        UsageError, match=r"holds a resstream shift run whose run\.json does not list its files"
    ):
        write_set(out, ["shift.json"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_output_set_that_fails_leaves_the_previous_set_untouched(tmp_path):
    out = tmp_path / "out"
    write_set(out, ["shift.json"])
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupted_run():
        with rundir.output_set(out, "shift") as outputs:
            write_text(outputs / "shift.json", "new")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_run()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def ctrl_c_now() -> None:
    """What CPython does in the main thread for a Ctrl-C that reaches it here: call the SIGINT
    handler in effect. Sending a real SIGINT (`os.kill`, `signal.raise_signal`) leaves the moment
    to the process's state: with SIGINT blocked in the main thread, a process-directed signal is
    handled by whichever other thread the kernel picks, whenever it runs (under load, after the
    commit), and a thread-directed one waits until the mask lifts: "DID NOT RAISE" in some full
    runs, never alone. Real signals at real moments: `test_ctrl_c_is_never_lost`."""
    signal.getsignal(signal.SIGINT)(signal.SIGINT, None)


def test_ctrl_c_during_the_commit_waits_until_the_set_is_in_place(tmp_path, default_signal_handlers):
    out = tmp_path / "out"
    moved = []
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).parent == out:  # the commit, not a write into the staging folder
            moved.append(Path(dst).name)
            if len(moved) == 1:
                ctrl_c_now()  # Ctrl-C after the first of three files
        real_replace(src, dst)

    try:
        os.replace = replace
        with pytest.raises(KeyboardInterrupt):
            write_set(out, ["a.json", "b.json"])
    finally:
        os.replace = real_replace
        interrupts.reset()
    assert moved == ["a.json", "b.json", "run.json"]
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "b.json", "run.json"]


def test_outputs_are_not_written_over_another_commands_run(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    write_json(run / "model.json", {"config": {}})
    write_json(run / "run.json", {"config": {"model": {}}})
    before = (run / "run.json").read_bytes()
    code = main([*SIMULATE, "--out", str(run)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"--out {str(run)!r} holds the outputs of resstream train" in err, err
    assert (run / "run.json").read_bytes() == before


def test_output_files_follow_the_umask(tmp_path, capsys):
    old = os.umask(0o002)
    try:
        assert main([*SIMULATE, "--out", str(tmp_path / "out")]) == 0
    finally:
        os.umask(old)
    for path in (tmp_path / "out").iterdir():
        assert path.stat().st_mode & 0o777 == 0o664, (path.name, oct(path.stat().st_mode))


# ---------------------------------------------------------------------------- unwritable destinations


def failing(errno_code: int, where: Path, real):
    """`real` (an os function taking a path first) failing with `errno_code` under `where`."""

    def call(path, *args, **kwargs):
        if str(where) in os.fsdecode(path):
            raise OSError(errno_code, os.strerror(errno_code), os.fsdecode(path))
        return real(path, *args, **kwargs)

    return call


@pytest.mark.parametrize(
    ("code", "reason"),
    [(errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied")],
)
def test_an_unwritable_out_is_refused_before_work(tmp_path, capsys, monkeypatch, code, reason):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(os, "open", failing(code, out, os.open))
    monkeypatch.setattr("resstream.api.simulate.run_simulation", lambda *a, **k: pytest.fail("work started"))
    exit_code = main([*SIMULATE, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert exit_code == 2 and err == f"resstream: error: cannot write to --out {str(out)!r}: {reason}", err
    assert_nothing_written(out)


def test_an_out_that_cannot_be_created_is_refused(tmp_path, capsys, monkeypatch):
    out = tmp_path / "ro" / "out"
    monkeypatch.setattr(os, "mkdir", failing(errno.EROFS, tmp_path / "ro", os.mkdir))
    exit_code = main([*SIMULATE, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert exit_code == 2 and "read-only file system" in err and "--out" in err, err
    assert not (tmp_path / "ro").exists()


def test_a_full_disk_while_writing_keeps_nothing_of_the_run(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main([*SIMULATE, "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    import resstream.io

    real = resstream.io.write_text
    calls = []

    def write_text_disk_full(path, text):
        calls.append(path)
        if len(calls) == 2:  # a write() fails: atomic_path names the file it was writing
            with resstream.io.atomic_path(path):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, text)

    monkeypatch.setattr(resstream.io, "write_text", write_text_disk_full)
    exit_code = main([*SIMULATE, "--seed", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert exit_code == 1 and len(err.splitlines()) == 1, err
    assert "no space left on device on /" in err and f"--out {str(out)!r}" in err and "needs ~" in err, err
    assert "nothing of it was kept" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_too_little_free_space_is_refused_before_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(rundir, "free_bytes", lambda path: 1_000)
    monkeypatch.setattr("resstream.api.simulate.run_simulation", lambda *a, **k: pytest.fail("work started"))
    exit_code = main([*SIMULATE, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert exit_code == 1 and "needs ~16.8 MB, 1.0 KB free; nothing was written" in err, err
    assert_nothing_written(tmp_path / "out")


def test_write_failures_elsewhere_are_not_blamed_on_out(tmp_path):
    error = OSError(errno.EACCES, "Permission denied", "/etc/somewhere/else")
    assert rundir.write_failure(error, tmp_path, "out") is None
    inside = OSError(errno.EACCES, "Permission denied", str(tmp_path / "x.json"))
    assert isinstance(rundir.write_failure(inside, tmp_path, "out"), UsageError)
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.json"))
    assert isinstance(rundir.write_failure(full, tmp_path, "out"), RunError)
    unnamed = OSError(errno.ENOSPC, "No space left on device")  # could be any file: not blamed
    assert rundir.write_failure(unnamed, tmp_path, "out") is None


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 64 kB tmpfs (needs root and mount rights; skipped where it cannot be mounted)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_real_small_file_system_is_refused_before_work(small_tmpfs, capsys):
    exit_code = main([*SIMULATE, "--out", str(small_tmpfs / "out")])
    err = capsys.readouterr().err.strip()
    assert exit_code == 1 and f"no space left on {small_tmpfs}" in err and "needs ~16.8 MB" in err, err
    assert_nothing_written(small_tmpfs / "out")


def test_a_real_file_system_that_fills_up_while_writing(small_tmpfs, capsys, monkeypatch):
    monkeypatch.setattr(rundir, "check_free_space", lambda *args: None)  # as if it filled up later
    exit_code = main([*SIMULATE, "--tokens", "40", "--out", str(small_tmpfs / "out")])
    err = capsys.readouterr().err.strip()
    assert exit_code == 1 and len(err.splitlines()) == 1, err
    assert f"no space left on device on {small_tmpfs}" in err and "nothing of it was kept" in err, err
    assert_nothing_written(small_tmpfs / "out")


# ---------------------------------------------------------------------------- real Ctrl-C


def interrupted_after(delay: float, out: Path) -> tuple[int, str]:
    process = resstream_process(*SIMULATE, "--sims", "20000000", "--out", str(out))
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    return process.returncode, err


def check_real_interrupt(delay: float, out: Path) -> None:
    code, err = interrupted_after(delay, out)
    assert code == 130, (delay, err)
    assert err.strip() == "resstream: error: interrupted; nothing half-written was kept", (delay, err)
    assert_nothing_written(out)


@pytest.mark.parametrize("delay", [0.4, 2.5])
def test_ctrl_c_is_never_lost(tmp_path, delay):
    """During the imports (0.4 s) and during the work: exit 130, one line, nothing written.

    (Before ~0.1 s the Python interpreter itself is still starting: an interrupt there ends
    with Python's own message, before any of resstream runs.)"""
    check_real_interrupt(delay, tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
def test_ctrl_c_at_any_moment(tmp_path, delay):
    check_real_interrupt(delay, tmp_path / "out")


# ---------------------------------------------------------------------------- the trial's race


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)


@pytest.mark.slow
def test_resume_while_the_run_trains_is_refused_and_nothing_is_lost(tmp_path):
    """The adversarial trial's race: `train --resume` started while the run still trains."""
    from tests.test_hostile_inputs import TINY_TRAIN, fill

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(), encoding="utf-8")
    out = tmp_path / "race"
    train = ["train", "--dataset", str(corpus), "--out", str(out), *fill(TINY_TRAIN, tmp_path)]
    first = resstream_process(*train, "--max-steps", "400", "--checkpoint-interval", "5")
    wait_for(out / "checkpoints" / "latest.json", first)
    second = resstream_process("train", "--resume", "--out", str(out), "--quiet")
    _, err = second.communicate(timeout=120)
    assert second.returncode == 2, err
    assert f"is in use by another resstream process (pid {first.pid}, resstream train" in err, err
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 401))  # none missing or twice


# ---------------------------------------------------------------------------- training on a full disk


def train_args(tmp_path: Path, *extra: str) -> list[str]:
    from tests.test_hostile_inputs import TINY_TRAIN, fill

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(), encoding="utf-8")
    return [
        "train",
        "--dataset",
        str(corpus),
        "--out",
        str(tmp_path / "run"),
        *fill(TINY_TRAIN, tmp_path),
        *extra,
    ]


def test_training_without_room_for_its_checkpoints_is_refused_before_it_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(rundir, "free_bytes", lambda path: 50_000)
    code = main(train_args(tmp_path, "--max-steps", "6"))
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err
    assert f"--out {str(tmp_path / 'run')!r}: this run needs ~" in err and "50.0 KB free" in err, err
    assert not (tmp_path / "run").exists()


def test_a_disk_that_fills_up_during_a_checkpoint_names_the_last_good_one(tmp_path, capsys, monkeypatch):
    from resstream.training import checkpoint as ckpt

    real = ckpt.save_tensors
    saves = []

    def save_tensors(path, tensors, metadata=None):
        saves.append(path)
        if len(saves) > 4:  # the third checkpoint (two files each)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, tensors, metadata)

    monkeypatch.setattr(ckpt, "save_tensors", save_tensors)
    code = main(train_args(tmp_path, "--max-steps", "12"))
    err = capsys.readouterr().err.strip()
    run = tmp_path / "run"
    assert code == 1 and len(err.splitlines()) == 1, err
    where = f"no space left on device on {rundir.mount_point(run)} while writing checkpoint 9 in --out"
    assert f"{where} {str(run)!r}: a checkpoint needs ~" in err, err
    good = run / "checkpoints" / "step-0000006"
    assert f"last good checkpoint: step 6 in {str(good)!r} (--resume continues from it)" in err, err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "latest.json",
        "step-0000003",
        "step-0000006",
    ]
    monkeypatch.setattr(ckpt, "save_tensors", real)  # room again: the run continues from step 6
    code = main([*train_args(tmp_path, "--max-steps", "12"), "--resume"])
    assert code == 0, capsys.readouterr().err


def test_a_disk_that_fills_up_between_checkpoints_names_what_resumes(tmp_path, capsys, monkeypatch):
    """The disk fills up while a checkpoint's verification marker is written (not during the
    save itself): the line says what a checkpoint needs, what is free, and which checkpoint
    --resume continues from (it was garbled: 'this run 0 B free; its complete checkpoints')."""
    from resstream.io import atomic_path
    from resstream.training import checkpoint as ckpt
    from resstream.training import resume

    real, markers = ckpt.write_json, []

    def write_json(path, obj):
        if Path(path).name == ckpt.VERIFIED:
            markers.append(path)
            if len(markers) == 2:  # checkpoint 6's marker: a real write whose error names its temporary
                with atomic_path(path):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, obj)

    monkeypatch.setattr(ckpt, "write_json", write_json)
    monkeypatch.setattr(resume, "free_bytes", lambda path: 0)  # full after the check before the start
    code = main(train_args(tmp_path, "--max-steps", "12"))
    err = capsys.readouterr().err.strip()
    run = tmp_path / "run"
    assert code == 1 and len(err.splitlines()) == 1, err
    assert f"while writing 'verified.json' in --out {str(run)!r}: a checkpoint needs ~" in err, err
    assert "KB, 0 B free; stopped, last complete checkpoint: step 6 in " in err, err
    assert "(--resume continues from it)" in err and "this run" not in err, err
    monkeypatch.undo()
    assert main([*train_args(tmp_path, "--max-steps", "12"), "--resume"]) == 0, capsys.readouterr().err
    assert ckpt.latest_checkpoint_step(run) == 12


def test_a_sweeps_run_folder_is_locked_like_any_training_run(tmp_path, capsys):
    """The sweep trains its runs itself: each run folder is held as `train` holds its own."""
    sweep = tmp_path / "sweep"
    holder = hold_lock(sweep / "seed-0" / "baseline")  # e.g. a `train --resume` on that run
    try:
        args = train_args(tmp_path, "--max-steps", "3", "--layers", "0", "--no-learned")
        args[0] = "sweep"
        args[args.index("--out") + 1] = str(sweep)
        code = main(args)
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert (
        f"{str(sweep / 'seed-0' / 'baseline')!r} is in use by another resstream process (pid {holder.pid}"
        in err
    )


def test_a_full_cache_disk_names_the_cache_dir(tmp_path, capsys, monkeypatch):
    import resstream.data.tokens as tokens

    class FullDisk:
        """A token chunk whose write fails as numpy's `tofile` does on a full disk."""

        def __len__(self):
            return 1000

        def astype(self, dtype):
            return self

        def tofile(self, handle):
            raise OSError("125234 requested and 32768 written")  # no errno

    monkeypatch.setattr(tokens, "token_chunks", lambda *args: iter([FullDisk()]))
    code = main(train_args(tmp_path, "--max-steps", "3"))
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err
    assert f"cannot write the token cache into --cache-dir {str(tmp_path / 'cache')!r}" in err, err
    assert "125234 requested and 32768 written" in err and " free)" in err, err


STRESS = """
import sys, time
from resstream.rundir import locked_directory
from resstream.errors import UsageError
held = refused = 0
start = time.time()
while time.time() - start < 3:
    try:
        with locked_directory(f"{sys.argv[1]}/{int(time.time() * 50)}/x", "stress"):
            held += 1
    except UsageError:
        refused += 1
print(held, refused)
"""


@pytest.mark.slow
def test_processes_creating_and_removing_the_same_folders_get_a_lock_or_a_refusal(tmp_path):
    """Eight processes lock fresh folders that the others create and remove meanwhile: each
    attempt ends in the lock or the one-line refusal, never in another exception."""
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", STRESS, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        held, refused = map(int, out.split())
        assert held > 0 and refused > 0, out
