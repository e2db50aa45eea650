"""A folder resstream is given never makes it write, remove or rename anything outside it (issue 21).

Each writer meets a link (or another kind of file) planted at a name it writes, removes or
renames, and must either replace the link itself, remove only the link, or refuse in one line;
someone's file or folder that the link points at is never changed. The command-line refusals
are rows of tests/test_hostile_inputs.py (FOLDER_CASES); these are the writers one by one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from resstream import rundir
from resstream.errors import UsageError
from resstream.io import (
    append_line,
    check_inside,
    folder_inside,
    is_plain_name,
    kind_of,
    not_a_plain_name,
    open_in_folder,
    write_json,
)
from resstream.training import checkpoint as ckpt
from resstream.training.metrics import MetricsLog

NOTES = "someone's notes\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    """Someone's file outside the folder under test."""
    path = tmp_path / "victim.txt"
    path.write_text(NOTES, encoding="utf-8")
    return path


@pytest.fixture
def victim_folder(tmp_path) -> Path:
    """Someone's folder outside the folder under test, with a file and a hidden folder."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "notes.txt").write_text(NOTES, encoding="utf-8")
    (folder / ".step-0000001.abcdef123456").mkdir()
    (folder / ".latest.json.abcdefgh.tmp").write_text(NOTES, encoding="utf-8")
    return folder


def untouched(folder: Path) -> bool:
    """Whether the victim folder still holds exactly what the fixture put there."""
    names = sorted(p.name for p in folder.iterdir())
    expected = [".latest.json.abcdefgh.tmp", ".step-0000001.abcdef123456", "notes.txt"]
    return names == expected and (folder / "notes.txt").read_text(encoding="utf-8") == NOTES


# ------------------------------------------------------------------ the primitives (io.py)
def test_kind_of_never_follows_a_link(tmp_path, victim):
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "pipe")
    assert kind_of(victim) == "a regular file"
    assert kind_of(tmp_path / "link") == "a symbolic link"
    assert kind_of(tmp_path / "dangling") == "a symbolic link"
    assert kind_of(tmp_path / "pipe") == "a named pipe"
    assert kind_of(tmp_path) == "a directory"
    assert kind_of(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("plant", "found"),
    [
        ("link", "a symbolic link, not a regular file"),
        ("directory", "a directory, not a regular file"),
        ("pipe", "a named pipe, not a regular file"),
        ("hard link", "a file with other hard links, not a file of its own"),
    ],
)
def test_open_in_folder_opens_only_a_regular_file_of_its_own(tmp_path, victim, plant, found):
    path = tmp_path / "lock"
    {
        "link": lambda: path.symlink_to(victim),
        "directory": path.mkdir,
        "pipe": lambda: os.mkfifo(path),  # opening it for writing would block without the check
        "hard link": lambda: os.link(victim, path),
    }[plant]()
    with pytest.raises(
        UsageError, match=f"{path}' is {found}: resstream follows no link inside a folder it is given"
    ):
        open_in_folder(path, os.O_RDWR | os.O_CREAT, single_link=True)
    assert victim.read_text(encoding="utf-8") == NOTES


def test_open_in_folder_creates_and_opens_a_regular_file(tmp_path):
    fd = open_in_folder(tmp_path / "new", os.O_RDWR | os.O_CREAT, single_link=True)
    os.write(fd, b"x")
    os.close(fd)
    assert (tmp_path / "new").read_bytes() == b"x"


def test_a_log_is_never_appended_through_a_link(tmp_path, victim):
    log = tmp_path / "metrics.jsonl"
    append_line(log, "one")
    log.unlink()
    log.symlink_to(victim)
    with pytest.raises(UsageError, match=r"metrics\.jsonl' is a symbolic link"):
        append_line(log, "two")
    assert victim.read_text(encoding="utf-8") == NOTES


def test_metrics_log_writes_never_through_a_link(tmp_path, victim):
    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=True, resume_step=None)
    log.write({"step": 1, "loss": 2.0})
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "metrics.jsonl").symlink_to(victim)  # planted while the run trains
    with pytest.raises(UsageError, match="is a symbolic link"):
        log.write({"step": 2, "loss": 1.0})
    assert victim.read_text(encoding="utf-8") == NOTES


def test_an_atomic_write_replaces_a_link_and_never_writes_through_it(tmp_path, victim):
    (tmp_path / "run.json").symlink_to(victim)
    write_json(tmp_path / "run.json", {"a": 1})
    assert kind_of(tmp_path / "run.json") == "a regular file"
    assert json.loads((tmp_path / "run.json").read_text()) == {"a": 1}
    assert victim.read_text(encoding="utf-8") == NOTES


def test_folder_inside_refuses_a_link_on_the_way(tmp_path, victim_folder):
    root = tmp_path / "out"
    root.mkdir()
    (root / "seed-0").symlink_to(victim_folder, target_is_directory=True)
    with pytest.raises(UsageError, match="seed-0' is a symbolic link, not a directory"):
        folder_inside(root, root / "seed-0" / "baseline")
    assert untouched(victim_folder)
    (root / "file").write_text("x")
    with pytest.raises(UsageError, match="file' is a regular file, not a directory"):
        folder_inside(root, root / "file" / "below")
    assert folder_inside(root, root / "a" / "b").is_dir()


def test_the_given_folder_itself_may_be_a_link(tmp_path):
    """The user chose the folder: a link there is theirs to give (`--out runs/latest`)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "given").symlink_to(tmp_path / "real", target_is_directory=True)
    folder_inside(tmp_path / "given", tmp_path / "given" / "checkpoints")
    assert (tmp_path / "real" / "checkpoints").is_dir()
    check_inside(tmp_path / "given", tmp_path / "given", "a directory")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "not a file name"),
        (None, "not a file name"),
        (3, "not a file name"),
        (".", "a directory"),
        ("..", "a directory"),
        ("a/b", "a path, not a plain name"),
        ("../x", "a path, not a plain name"),
        ("a\\b", "a path, not a plain name"),
        ("/etc/passwd", "an absolute path"),
        ("C:foo", "an absolute path"),
        ("\\\\server\\share", "an absolute path"),
        ("nul\x00", "it holds a NUL character"),
    ],
)
def test_plain_names_have_no_way_out(name, why):
    assert not_a_plain_name(name) == why and not is_plain_name(name)


def test_a_plain_name_is_one():
    assert is_plain_name("shift.json") and is_plain_name(".hidden") and is_plain_name("...")


# ------------------------------------------------------------ rundir.py: leftovers, output sets, nesting
def test_leftover_names_that_are_links_are_unlinked_not_followed(tmp_path, victim, victim_folder):
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{rundir.STAGING_PREFIX}4711").symlink_to(victim_folder, target_is_directory=True)
    (out / ".shift.json.abcdefgh.tmp").symlink_to(victim)
    removed = rundir.remove_leftovers(out)
    assert sorted(p.name for p in removed) == [".resstream-staging-4711", ".shift.json.abcdefgh.tmp"]
    assert list(out.iterdir()) == []
    assert untouched(victim_folder) and victim.read_text(encoding="utf-8") == NOTES


def test_a_previous_run_json_cannot_make_a_commit_remove_anything_else(tmp_path, victim):
    """Item 5: names in a previous run.json that are not plain file names are ignored (it crashed
    after committing: '..' and a folder were unlinked); a link it lists is unlinked, not followed."""
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "kept.txt").write_text("x")
    (out / "link.png").symlink_to(victim)
    (out / "old.png").write_text("old")
    listed = ["..", ".", "sub", "../victim.txt", str(victim), "", None, 3, "link.png", "old.png", "run.json"]
    (out / "run.json").write_text(json.dumps({"config": {"command": "t"}, "files": listed}))
    with rundir.output_set(out, "t") as outputs:
        (outputs / "new.json").write_text("{}")
        outputs.write_record({"config": {"command": "t"}})
    assert sorted(p.name for p in out.iterdir()) == ["new.json", "run.json", "sub"]
    assert (out / "sub" / "kept.txt").read_text() == "x"
    assert victim.read_text(encoding="utf-8") == NOTES


def test_a_folder_below_a_held_one_is_never_reached_through_a_link(tmp_path, victim_folder):
    root = tmp_path / "sweep"
    root.mkdir()
    (root / "seed-0").symlink_to(victim_folder, target_is_directory=True)
    with rundir.locked_directory(root, "sweep"):
        inside = rundir.locked_directory(root / "seed-0" / "baseline", "train", param=None)
        with pytest.raises(UsageError, match="seed-0' is a symbolic link, not a directory"), inside:
            pass
        with rundir.locked_directory(root / "seed-1" / "baseline", "train", param=None):
            pass  # a folder of its own is fine
    assert untouched(victim_folder)


def test_a_lock_file_link_is_refused_and_its_target_kept(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    (out / rundir.LOCK_FILE).symlink_to(victim)
    refused = r"`out` '.*out': its lock file '.*\.resstream\.lock' is a symbolic"
    with pytest.raises(UsageError, match=refused), rundir.locked_directory(out, "t"):
        pass
    assert victim.read_text(encoding="utf-8") == NOTES


# ------------------------------------------------------------------ checkpoints
def _state() -> dict:
    from resstream.training.config import TrainConfig

    return {"config": TrainConfig().to_dict()}


def save(run: Path, step: int) -> Path:
    """A small checkpoint `step` of a fake run in `run`."""
    return ckpt.save_checkpoint(
        run,
        step=step,
        model_state={"w": torch.ones(2)},
        optimizer_state={"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        rng_state={"cpu": torch.get_rng_state()},
        state=_state(),
    )


def test_a_checkpoints_folder_that_is_a_link_is_refused(tmp_path, victim_folder):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(victim_folder, target_is_directory=True)
    with pytest.raises(UsageError, match="checkpoints' is a symbolic link, not a directory"):
        save(run, 1)
    with pytest.raises(UsageError, match="checkpoints' is a symbolic link, not a directory"):
        ckpt.check_run_folders(run)
    ckpt.remove_leftovers(run)  # does not enter the link to remove "leftovers" there
    assert untouched(victim_folder)


def test_pruning_never_removes_through_a_link(tmp_path, victim_folder):
    run = tmp_path / "run"
    save(run, 1)
    (run / "checkpoints" / "step-0000002").symlink_to(victim_folder, target_is_directory=True)
    (run / "checkpoints" / ".step-0000009.abcdef123456").symlink_to(victim_folder, target_is_directory=True)
    for step in (3, 4, 5):
        save(run, step)
    ckpt.mark_verified(run, 2, loss=1.0, grad_norm=1.0)  # a link is not a checkpoint: no marker
    ckpt.remove_leftovers(run)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["latest.json", "step-0000002", "step-0000004", "step-0000005"]
    assert kind_of(run / "checkpoints" / "step-0000002") == "a symbolic link"  # not ours: left alone
    assert untouched(victim_folder)


def test_saving_over_a_link_at_the_checkpoints_name_replaces_only_the_link(tmp_path, victim_folder):
    run = tmp_path / "run"
    save(run, 1)
    (run / "checkpoints" / "step-0000002").symlink_to(victim_folder, target_is_directory=True)
    path = save(run, 2)
    assert kind_of(path) == "a directory" and (path / ckpt.MODEL_FILE).is_file()
    ckpt.remove_leftovers(run)
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert untouched(victim_folder)


def test_resume_never_reads_a_checkpoint_through_a_link_or_a_path(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    save(other, 1)
    save(run, 1)
    latest = run / "checkpoints" / ckpt.LATEST
    latest.write_text(json.dumps({"step": 1, "dir": "../../other/checkpoints/step-0000001"}))
    with pytest.raises(UsageError, match=r"is corrupt .*'step-0000001', not '\.\./\.\./other"):
        ckpt.load_checkpoint(run)
    ckpt.set_latest(run, 1)
    step = run / "checkpoints" / "step-0000001"
    ckpt.rundir.remove_entry(step)
    step.symlink_to(other / "checkpoints" / "step-0000001", target_is_directory=True)
    with pytest.raises(UsageError, match="step-0000001' is a symbolic link, not a directory"):
        ckpt.load_checkpoint(run)


def test_a_checkpoint_file_that_is_a_link_is_refused(tmp_path, victim):
    run = tmp_path / "run"
    path = save(run, 1)
    (path / ckpt.MODEL_FILE).unlink()
    (path / ckpt.MODEL_FILE).symlink_to(victim)
    with pytest.raises(UsageError, match=r"model\.safetensors' is a symbolic link, not a regular file"):
        ckpt.load_checkpoint(run)


# ------------------------------------------------------------------ sweeps and reproductions
def test_a_sweep_json_cannot_name_run_folders_outside_the_sweep(tmp_path, victim_folder):
    from resstream.training.records import SWEEP_FILE, SWEEP_FORMAT, find_runs

    root = tmp_path / "sweep"
    root.mkdir()
    for where, why in [
        ("../victim", "names run folder '../victim'"),
        (str(victim_folder), "names run folder '/"),
        ("seed-0/../../victim", "names run folder 'seed-0/../../victim'"),
    ]:
        record = {"format": SWEEP_FORMAT, "runs": {"0": {"baseline": {"dir": where, "gate": "none"}}}}
        (root / SWEEP_FILE).write_text(json.dumps(record))
        with pytest.raises(UsageError, match=why):
            find_runs(root)
    (root / "seed-0").symlink_to(victim_folder, target_is_directory=True)
    record = {"format": SWEEP_FORMAT, "runs": {"0": {"baseline": {"dir": "seed-0/baseline", "gate": "none"}}}}
    (root / SWEEP_FILE).write_text(json.dumps(record))
    with pytest.raises(UsageError, match="seed-0' is a symbolic link, not a directory"):
        find_runs(root)
    (root / SWEEP_FILE).unlink()
    with pytest.raises(UsageError, match=r"no sweep\.json and no seed-<s> folders"):
        find_runs(root)  # a linked seed folder is not one of the sweep's
    assert untouched(victim_folder)


def test_a_reproductions_log_is_never_written_through_a_link(tmp_path, victim, victim_folder):
    from resstream.study import run_command
    from tests.test_reproduce import plan_of

    out = tmp_path / "rep"
    out.mkdir()
    plan = plan_of("tiny", out)
    log = out / "logs" / "simulate.log"
    (out / "logs").symlink_to(victim_folder, target_is_directory=True)
    with pytest.raises(UsageError, match="logs' is a symbolic link, not a directory"):
        run_command(["simulate", "--help"], plan, log)
    (out / "logs").unlink()
    (out / "logs").mkdir()
    log.symlink_to(victim)
    with pytest.raises(UsageError, match=r"simulate\.log' is a symbolic link, not a regular file"):
        run_command(["simulate", "--help"], plan, log)
    assert untouched(victim_folder) and victim.read_text(encoding="utf-8") == NOTES


# ------------------------------------------------------------------ the command line
def test_a_previous_run_json_listing_dotdot_and_a_folder_does_not_fail_a_committed_run(tmp_path, capsys):
    """Item 5, end to end: the set was committed, then the command crashed with a traceback
    and exit code 1 while removing '..' and a folder the old run.json listed."""
    from resstream.cli.main import main

    out = tmp_path / "sim"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "mine.png").write_bytes(b"x")
    record = {"config": {"command": "simulate"}, "files": ["..", "figures", "run.json"]}
    (out / "run.json").write_text(json.dumps(record))
    args = ["simulate", "--layers", "2", "--tokens", "5", "--dim", "4", "--sims", "20", "--quiet"]
    assert main([*args, "--out", str(out)]) == 0, capsys.readouterr().err
    assert (out / "figures" / "mine.png").read_bytes() == b"x"
    assert "figures" not in json.loads((out / "run.json").read_text())["files"]


def test_a_refused_resume_removes_what_a_killed_first_save_left(tmp_path, capsys):
    """Item 7: `kill -9` during the very first checkpoint save leaves a hidden, half-written
    checkpoint folder and no latest.json; `--resume` is refused (there is no checkpoint) and
    now removes it, as the docs promise of the next start."""
    from resstream.cli.main import main

    run = tmp_path / "run"
    half = run / "checkpoints" / ".step-0000003.0123456789ab"
    half.mkdir(parents=True)
    (half / ".model.safetensors.k2j4_9ab.tmp").write_bytes(b"\x00" * 64)
    (run / ".tmpQ1w2E3").write_bytes(b"\x00" * 8)  # safetensors' own temporary file
    (run / "notes.txt").write_text("a user's file")
    assert main(["train", "--resume", "--out", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot resume: no checkpoint in" in err, err
    assert sorted(p.name for p in run.rglob("*")) == ["checkpoints", "notes.txt"]


def test_a_reproduction_step_never_writes_through_a_linked_stage_folder(tmp_path, victim_folder):
    """A step's --out below the reproduction's folder (a torchrun child holds no lock of ours
    that would check it) must be reached without a link."""
    from resstream.study import run_command
    from tests.test_reproduce import plan_of

    out = tmp_path / "rep"
    out.mkdir()
    (out / "sweep").symlink_to(victim_folder, target_is_directory=True)
    plan = plan_of("tiny", out)
    with pytest.raises(UsageError, match="sweep' is a symbolic link, not a directory"):
        run_command(["simulate", "--out", "{out}/sweep/seed-0"], plan, plan.path("logs", "x.log"))
    assert untouched(victim_folder)


# ------------------------------------------------------------------ what the review found
def test_a_refused_train_never_removes_a_folder_named_like_a_leftover(tmp_path, capsys):
    """Leftovers are cleaned before the checks only in a folder that holds a run, and a
    temporary name is removed only as the kind of entry its writer makes (never a folder)."""
    from resstream.cli.main import main

    out = tmp_path / "eval-out"
    (out / ".tmpAbc123").mkdir(parents=True)
    (out / ".tmpAbc123" / "notes.txt").write_text("keep me")
    (out / ".tokenizer.abcdefgh").write_text("keep me too")  # a file, where staging is a folder
    (out / "run.json").write_text(json.dumps({"config": {"command": "eval"}, "files": ["run.json"]}))
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 2
    assert "cannot resume: no checkpoint in" in capsys.readouterr().err
    assert (out / ".tmpAbc123" / "notes.txt").read_text() == "keep me"
    ckpt.remove_leftovers(out)
    assert (out / ".tmpAbc123" / "notes.txt").read_text() == "keep me"
    assert (out / ".tokenizer.abcdefgh").read_text() == "keep me too"


def test_a_folder_at_an_outputs_name_is_refused_before_the_commit(tmp_path):
    """A directory where an output goes: refused in one line before anything is moved (it
    stopped the commit half-way with a traceback: a.csv in place, run.json not)."""
    out = tmp_path / "out"
    (out / "b.csv").mkdir(parents=True)
    refused = pytest.raises(UsageError, match=r"b\.csv' is a directory, not a regular file")
    with refused, rundir.output_set(out, "t") as outputs:
        (outputs / "a.csv").write_text("a")
        (outputs / "b.csv").write_text("b")
        outputs.write_record({"config": {"command": "t"}})
    assert sorted(p.name for p in out.iterdir()) == ["b.csv"]
    with pytest.raises(UsageError, match=r"b\.csv' is a directory, not a regular file"):
        write_json(out / "b.csv", {})


def test_a_folder_at_a_runs_file_name_is_refused_before_training(tmp_path, capsys):
    from resstream.cli.main import main
    from tests.test_hostile_inputs import fill

    (tmp_path / "corpus.txt").write_text("a b c d e f g h i j k l m n o p " * 200)
    (tmp_path / "run" / "loss_curve.png").mkdir(parents=True)
    args = fill("train --dataset {corpus} {train} --max-steps 2 --out {tmp}/run", tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "loss_curve.png' is a directory, not a regular file" in err, err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["loss_curve.png"]


def test_a_reproductions_own_files_are_never_reached_through_a_link(tmp_path, victim_folder):
    from tests.test_reproduce import plan_of

    out = tmp_path / "rep"
    out.mkdir()
    (out / "misalignment").symlink_to(victim_folder, target_is_directory=True)
    plan = plan_of("tiny", out)
    with pytest.raises(UsageError, match="misalignment' is a symbolic link"):
        plan.path("misalignment", "misalignment.json")
    assert plan.path("shift", "seed-0") == out / "shift" / "seed-0"


def test_a_store_manifest_that_is_a_link_is_refused(tmp_path):
    from resstream.data.shards import read_manifest

    (tmp_path / "elsewhere.json").write_text("{}")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "manifest.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UsageError, match=r"manifest\.json is a symbolic link, not a regular file"):
        read_manifest(tmp_path / "store")
