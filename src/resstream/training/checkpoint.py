"""Checkpoints written atomically, marked good or diverged, and pruned; stored as safetensors +
JSON (never pickle). The run directory's layout is `resstream.training.checkpoint_layout`.

A checkpoint is written into a temporary directory, renamed into place, and only then does
`latest.json` (replaced atomically) point to it; an interrupted save leaves the previous
checkpoint as the one that loads. A directory is removed by renaming it to a hidden name first
(`.step-*`), so an interrupted removal never leaves a half-deleted `step-*` that looks like a
checkpoint; `remove_leftovers` clears what interrupted writers leave.

Good checkpoints. A checkpoint is written only if its weights and optimizer state are all
finite (`save_checkpoint` refuses otherwise). The trainer computes the next step's loss from
exactly the checkpoint's weights; when that loss and its gradient norm are finite the
checkpoint is *verified* (`mark_verified`), when they are not it *diverged* (`mark_diverged`).
A good checkpoint is a verified one. Pruning never removes the newest good checkpoint, and
`load_checkpoint` resumes from the newest complete checkpoint unless that one diverged, in
which case it resumes from the newest good one. (The gradient norm is part of the test:
with `lr` 1e6 a checkpoint's next loss can be finite while its gradient is not, and resuming
from it fails again.)

This module is also where the rest of a run's checkpoint handling is imported from: reading
it back (`resstream.training.run_loading`), the weight files (`resstream.training.weights`)
and the run folder's checks (`resstream.training.run_folder`) are re-exported here.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import torch

from resstream import rundir
from resstream.io import folder_inside, is_real_directory, write_json, write_safetensors
from resstream.training.checkpoint_layout import (
    CHECKPOINTS,
    DIVERGED,
    LATEST,
    MODEL_FILE,
    RUN_FILES,
    RUN_RECORD,
    STATE_FILE,
    TOKENIZER_DIR,
    TRAINER_FILE,
    VERIFIED,
    CheckpointRef,
    flatten_optimizer,
    is_diverged,
    latest_checkpoint_step,
    newest_good_checkpoint,
    remove_hidden_dirs,
    step_dirs,
    step_name,
)
from resstream.training.records import MODEL_META
from resstream.training.run_folder import check_run_folders, remove_leftovers
from resstream.training.run_loading import (
    Checkpoint,
    TrainedModel,
    load_checkpoint,
    load_run,
    read_run,
    resume_state,
    weights_fingerprint,
)
from resstream.training.weights import (
    PICKLE_SUFFIXES,
    NonFinite,
    NonFiniteState,
    check_finite_weights,
    check_readable,
    first_non_finite,
    load_tensors,
    load_weights,
    refuse_non_finite,
)

__all__ = [
    "CHECKPOINTS",
    "DIVERGED",
    "LATEST",
    "MODEL_FILE",
    "PICKLE_SUFFIXES",
    "RUN_FILES",
    "RUN_RECORD",
    "STATE_FILE",
    "TOKENIZER_DIR",
    "TRAINER_FILE",
    "VERIFIED",
    "Checkpoint",
    "CheckpointRef",
    "NonFinite",
    "NonFiniteState",
    "TrainedModel",
    "check_finite_weights",
    "check_readable",
    "check_run_folders",
    "first_non_finite",
    "latest_checkpoint_step",
    "load_checkpoint",
    "load_run",
    "load_tensors",
    "load_weights",
    "mark_diverged",
    "mark_verified",
    "newest_good_checkpoint",
    "read_run",
    "remove_leftovers",
    "resume_state",
    "save_checkpoint",
    "save_model",
    "save_tensors",
    "set_latest",
    "weights_fingerprint",
]


def save_tensors(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write a safetensors file atomically (`io.write_safetensors`; a name of its own so that
    tests can make a checkpoint's save fail)."""
    write_safetensors(path, tensors, metadata)


def save_checkpoint(
    run_dir: Path,
    *,
    step: int,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    rng_state: dict[str, torch.Tensor],
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint `step` and make it the latest; keep the newest `keep` checkpoints
    (and the newest good one).

    Non-finite weights or optimizer state are never written: `NonFiniteState` (a RunError)
    names the first such tensor, and nothing changes on disk.
    """
    opt_tensors, groups = flatten_optimizer(optimizer_state)
    refuse_non_finite(f"checkpoint step {step}", {"weights": model_state, "optimizer state": opt_tensors})
    root = folder_inside(run_dir, Path(run_dir) / CHECKPOINTS)
    name = step_name(step)
    tmp = _hidden_dir(root, name)
    try:
        save_tensors(tmp / MODEL_FILE, model_state)
        save_tensors(tmp / TRAINER_FILE, {**opt_tensors, **{f"rng.{k}": v for k, v in rng_state.items()}})
        write_json(tmp / STATE_FILE, {**state, "step": step, "param_groups": groups})
        final = root / name
        old = _to_trash(final) if os.path.lexists(final) else None  # a resumed run saving a step again
        os.replace(tmp, final)
        if old is not None:
            rundir.remove_entry(old)
    finally:
        if tmp.exists():
            _remove_dir(tmp)
    set_latest(run_dir, step)
    _prune(root, keep)
    return final


def set_latest(run_dir: Path, step: int) -> None:
    """Point `latest.json` (atomically) to checkpoint `step`: the one a resume continues from."""
    write_json(Path(run_dir) / CHECKPOINTS / LATEST, {"step": step, "dir": step_name(step)})


def _hidden_dir(root: Path, name: str) -> Path:
    """A new, uniquely named hidden directory `.NAME.<hex>` in `root`, with the umask's mode."""
    path = root / f".{name}.{uuid.uuid4().hex[:12]}"
    path.mkdir()  # os.mkdir follows the umask (tempfile.mkdtemp would make it 0700)
    return path


def _to_trash(path: Path) -> Path:
    """Rename a directory (atomically) to a hidden trash name beside it; return that name."""
    trash = path.with_name(f".{path.name.lstrip('.')}.{uuid.uuid4().hex[:12]}.trash")
    os.replace(path, trash)
    return trash


def _remove_dir(path: Path) -> None:
    """Remove a directory so that an interruption never leaves it half-deleted under its name:
    trash it first, then delete (`remove_leftovers` finishes an interrupted deletion)."""
    rundir.remove_entry(_to_trash(path))


def _prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints up to the latest, and the newest good one.

    Checkpoints newer than the latest belong to a future that a resumed run abandoned (a
    divergence, an interrupted save) and go, as do diverged ones and interrupted saves.
    """
    latest = latest_checkpoint_step(root.parent)
    steps = step_dirs(root)
    usable = [s for s in sorted(steps) if (latest is None or s <= latest) and not is_diverged(steps[s])]
    kept = set(usable[-keep:])
    good = newest_good_checkpoint(root.parent)
    if good is not None:
        kept.add(good.step)
    for step, path in steps.items():
        if step not in kept:
            _remove_dir(path)
    remove_hidden_dirs(root)


# ------------------------------------------------------------------ verification
def mark_verified(run_dir: Path, step: int, *, loss: float, grad_norm: float) -> None:
    """Record that the step after checkpoint `step`, computed from its weights, was finite."""
    path = Path(run_dir) / CHECKPOINTS / step_name(step)
    if is_real_directory(path):
        write_json(path / VERIFIED, {"step": step + 1, "loss": loss, "grad_norm": grad_norm})


def mark_diverged(run_dir: Path, step: int, reason: str) -> CheckpointRef | None:
    """Record that the step computed from checkpoint `step`'s weights was not finite (`reason`);
    return the newest good checkpoint, which a resume will continue from (None if there is none)."""
    path = Path(run_dir) / CHECKPOINTS / step_name(step)
    if is_real_directory(path) and not (path / VERIFIED).exists():
        write_json(path / DIVERGED, {"step": step + 1, "reason": reason})
    return newest_good_checkpoint(run_dir)


def save_model(run_dir: Path, model_state: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write the final weights and their description (`model.json`) into a run directory;
    non-finite weights are never written (`NonFiniteState`)."""
    refuse_non_finite("the final model", {"weights": model_state})
    save_tensors(Path(run_dir) / MODEL_FILE, model_state, metadata={"format": "resstream-gpt"})
    write_json(Path(run_dir) / MODEL_META, meta)
