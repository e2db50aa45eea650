"""Reading a run back: the checkpoint a resume continues from, and a finished run's model.

Everything read is checked first: a checkpoint's folder and files are resstream's own (never
reached through a link: `io.check_inside`), `latest.json` and `state.json` parse and agree,
and the tensors are safetensors and finite (`resstream.training.weights`). A resume continues
from the newest complete checkpoint unless that one diverged, in which case it goes back to
the newest good one (`resstream.training.checkpoint_layout`). Each failure is a UsageError
that names the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from resstream.errors import UsageError, short_reason
from resstream.io import check_inside, file_fingerprint
from resstream.training.checkpoint_layout import (
    CHECKPOINTS,
    DIVERGED,
    LATEST,
    MODEL_FILE,
    STATE_FILE,
    TOKENIZER_DIR,
    TRAINER_FILE,
    VERIFIED,
    is_diverged,
    newest_good_checkpoint,
    step_name,
    unflatten_optimizer,
)
from resstream.training.records import MODEL_META
from resstream.training.weights import (
    check_finite_weights,
    first_non_finite,
    load_tensors,
    load_weights,
    weights_file,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from resstream.training.config import TrainConfig
    from resstream.training.model import GPT


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint restores."""

    step: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    rng_state: dict[str, torch.Tensor]
    state: dict[str, Any]  # config, fingerprints, best values: JSON data
    path: Path
    verified: bool = False  # the step computed from these weights was finite


def resume_state(run_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The folder and `state.json` (step, config, fingerprints, ...) of the checkpoint a resume
    continues from, without reading its tensors. UsageError if it is missing or corrupt."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / LATEST
    if not pointer.is_file():
        raise UsageError(f"cannot resume: no checkpoint in {str(run_dir)!r} ({str(pointer)!r} is missing)")
    _check_resume_entries(run_dir, [(pointer, "a regular file")])
    try:
        latest = json.loads(pointer.read_text(encoding="utf-8"))
        step = int(latest["step"])
        if latest["dir"] != step_name(step):
            raise ValueError(f"checkpoint {step} is in {step_name(step)!r}, not {latest['dir']!r}")
        _check_resume_entries(run_dir, [(root / step_name(step), "a directory")])
        path = _resume_dir(root, step, root / step_name(step))
        files = (STATE_FILE, MODEL_FILE, TRAINER_FILE)
        _check_resume_entries(run_dir, [(path / name, "a regular file") for name in files])
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        if "step" not in state or "config" not in state or "param_groups" not in state:
            raise KeyError("step, config and param_groups are required")
    except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"cannot resume: checkpoint in {str(root)!r} is corrupt "
            f"({type(exc).__name__}: {short_reason(exc)})"
        ) from None
    return path, state


def _check_resume_entries(run_dir: Path, entries: Iterable[tuple[Path, str]]) -> None:
    """UsageError naming the first (path, expected kind) of `entries` that is reached through a
    link or is another kind (`io.check_inside`): a run's checkpoints are resstream's own files,
    and a link could lead a resume out of the run."""
    try:
        for path, expected in entries:
            check_inside(run_dir, path, expected)
    except UsageError as exc:
        raise UsageError(f"cannot resume from `out_dir` {str(run_dir)!r}: {exc}") from None


def _resume_dir(root: Path, step: int, latest: Path) -> Path:
    """`latest` (checkpoint `step`), or the newest good checkpoint when the step after it diverged."""
    if not is_diverged(latest):
        return latest
    good = newest_good_checkpoint(root.parent)
    if good is None:
        reason = json.loads((latest / DIVERGED).read_text(encoding="utf-8")).get("reason", "diverged")
        raise UsageError(
            f"cannot resume: checkpoint step {step} in {str(latest)!r} diverged ({reason}) and the "
            f"run has no good checkpoint; start a fresh run (with a lower `lr`) in another `out_dir`"
        )
    return good.path


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """Load the checkpoint a resume continues from: the newest complete one, or the newest good
    one when that diverged. UsageError if it is missing, corrupt or not finite."""
    path, state = resume_state(run_dir)
    groups = state.pop("param_groups")
    model_state = load_tensors(path / MODEL_FILE)
    trainer = load_tensors(path / TRAINER_FILE)
    rng = {k.removeprefix("rng."): v for k, v in trainer.items() if k.startswith("rng.")}
    optimizer = {k: v for k, v in trainer.items() if k.startswith("state.")}
    for part, tensors in (("weights", model_state), ("optimizer state", optimizer)):
        found = first_non_finite(tensors.items())
        if found is not None:
            raise UsageError(
                f"cannot resume from {str(path)!r}: non-finite values in its {part} ({found}); "
                f"allowed: a checkpoint written by resstream, which writes only finite ones"
            )
    return Checkpoint(
        step=int(state["step"]),
        model_state=model_state,
        optimizer_state=unflatten_optimizer(trainer, groups),
        rng_state=rng,
        state=state,
        path=path,
        verified=(path / VERIFIED).is_file(),
    )


# ------------------------------------------------------------------ finished runs
@dataclass(frozen=True)
class TrainedModel:
    """A finished run loaded back: the model (eval mode), its tokenizer and config."""

    model: GPT
    tokenizer: PreTrainedTokenizerFast
    config: TrainConfig
    meta: dict[str, Any]
    path: Path


def weights_fingerprint(run_dir: str | os.PathLike[str]) -> str | None:
    """sha256 (16 hex) of a finished run's weights file, None without one: which weights a
    benchmark score is of."""
    path = Path(run_dir) / MODEL_FILE
    return file_fingerprint(path) if path.is_file() else None


def read_run(run_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], TrainConfig]:
    """The description (`model.json`) of a finished run and its config (a `TrainConfig`),
    checked, without reading the weights."""
    from resstream.training.config import from_dict

    root = Path(run_dir)
    meta_path = root / MODEL_META
    if not root.is_dir():
        raise UsageError(f"model directory {str(root)!r} does not exist")
    if not meta_path.is_file():
        raise UsageError(
            f"{str(root)!r} is not a finished resstream run (no {MODEL_META}; "
            f"an unfinished run can be continued with train `resume=True`)"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        return meta, from_dict(meta["config"], source=repr(str(meta_path)))
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"{str(meta_path)!r} is corrupt ({type(exc).__name__}: {short_reason(exc)})"
        ) from None


def load_run(run_dir: str | os.PathLike[str], *, device: str | torch.device = "cpu") -> TrainedModel:
    """Load the final model of a run directory (or the built-in reference model's folder)."""
    from resstream.data import load_tokenizer
    from resstream.training.budget import check_model_fits
    from resstream.training.model import GPT

    root = Path(run_dir)
    meta, config = read_run(root)
    check_model_fits(config.model, repr(str(root / MODEL_META)), device)
    model = GPT(config.model)
    state = load_tensors(weights_file(root))
    load_weights(model, state, root)
    check_finite_weights(state.items(), str(root))
    model.to(device).eval()
    tokenizer = load_tokenizer(str(root / TOKENIZER_DIR))
    return TrainedModel(model=model, tokenizer=tokenizer, config=config, meta=meta, path=root)
