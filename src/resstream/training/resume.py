"""Stopping and resuming a run: what a checkpoint must agree with, what it restores, the
learning-rate schedule a resumed run keeps, and which checkpoint a stopped run continues from.

A run folder starts a fresh run or resumes from its latest checkpoint (`checkpoint_to_resume`).
A resume refuses a config whose model, data or tokenizer section differs from the checkpoint's
(`refuse_identity_changes`), or another tokenizer or corpus text (`check_resume_compatible`),
or a `max_steps` below the checkpoint's step (`check_resume_steps`);
it restores the random-number state dropout draws from (`rng_state`), and keeps the schedule of
the original run (`schedule_steps`). A run stopped by non-finite values or a full disk names
the checkpoint `resume=True` continues from (`good_checkpoint_text`, `resume_point_text`,
`out_of_space`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from resstream.data.tokenizer import tokenizer_fingerprint
from resstream.errors import RunError, UsageError
from resstream.io import final_name
from resstream.resources import format_bytes
from resstream.rundir import DISK_FULL, free_bytes, mount_point, refuse_another_commands_run
from resstream.training import checkpoint as ckpt
from resstream.training.config import TrainConfig, from_dict, identity_diff

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from resstream.data import CorpusStream
    from resstream.data.shards import StoredCorpus


# ------------------------------------------------------------------ what a resume must keep
def checkpoint_to_resume(out_dir: Path, resume: bool) -> ckpt.Checkpoint | None:
    """The checkpoint the run in `out_dir` continues from with `resume` (its latest one), None
    for a fresh run; refuses a file, a folder another command wrote, and a fresh run into a
    folder that already holds one."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"`out_dir` {str(out_dir)!r} is a file; give a directory")
    ckpt.check_run_folders(out_dir)
    has_run = ckpt.latest_checkpoint_step(out_dir) is not None or (out_dir / ckpt.MODEL_FILE).exists()
    refuse_another_commands_run(out_dir, "train", "out_dir")
    if resume:
        return ckpt.load_checkpoint(out_dir)
    if has_run:
        raise UsageError(
            f"`out_dir` {str(out_dir)!r} already holds a run; pass `resume=True` to continue "
            f"it or choose another `out_dir`"
        )
    return None


def check_resume_steps(step: int | None, max_steps: int, out_dir: Path) -> None:
    """Refuse to resume the run in `out_dir` from checkpoint `step` (None: a fresh run) with a
    `max_steps` below it: the weights are those of `step`, and a run never goes back."""
    if step is not None and max_steps < step:
        raise UsageError(
            f"`max_steps` {max_steps} is below step {step} of the checkpoint in `out_dir` "
            f"{str(out_dir)!r}, which a resume continues from; give `max_steps` {step} or more"
        )


def refuse_identity_changes(saved: dict[str, Any], config: TrainConfig, extra: Sequence[str] = ()) -> None:
    """Refuse to resume with a model, data or tokenizer section other than the saved one."""
    diffs = identity_diff(from_dict(saved), config) + list(extra)
    if diffs:
        raise UsageError(
            "cannot resume: the checkpoint was trained with a different config: " + "; ".join(diffs)
        )


def check_resume_compatible(
    checkpoint: ckpt.Checkpoint | None,
    config: TrainConfig,
    tokenizer: PreTrainedTokenizerFast,
    corpus: CorpusStream | StoredCorpus,
) -> None:
    """Refuse to resume from `checkpoint` with another config identity, tokenizer or corpus text
    (the last two by the fingerprints the checkpoint saved, when it saved them)."""
    if checkpoint is None:
        return
    state = checkpoint.state
    diffs = []
    if state.get("tokenizer_fingerprint") not in (None, tokenizer_fingerprint(tokenizer)):
        diffs.append("tokenizer fingerprint differs")
    if state.get("corpus_fingerprint") not in (None, corpus.fingerprint):
        diffs.append("corpus text differs (fingerprint)")
    refuse_identity_changes(state["config"], config, diffs)


# ------------------------------------------------------------------ what a resume restores
def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The random-number state that dropout draws from."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore a state `rng_state` saved (the CUDA part only on a CUDA device)."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def schedule_steps(config: TrainConfig, checkpoint: ckpt.Checkpoint | None) -> int:
    """The `max_steps` the learning-rate schedule runs over: the run's own, or, on resume, the
    one of the original run (saved with its checkpoints; older checkpoints: their config's)."""
    if checkpoint is None:
        return config.run.max_steps
    saved = checkpoint.state.get("schedule_steps")
    return int(saved) if saved is not None else int(checkpoint.state["config"]["run"]["max_steps"])


# ------------------------------------------------------------------ where a stopped run resumes
def good_checkpoint_text(out_dir: Path) -> str:
    """The newest good checkpoint of the run in `out_dir`, which `resume=True` continues from
    after a divergence, in words (or why there is none)."""
    good = ckpt.newest_good_checkpoint(out_dir)
    if good is not None:
        where = str(good.path)
        return f"last good checkpoint: step {good.step} in {where!r} (`resume=True` continues from it)"
    if ckpt.latest_checkpoint_step(out_dir) is None:
        return "no checkpoint had been saved yet"
    return "no good checkpoint (none was followed by a finite step): start again with a lower `lr`"


def resume_point_text(out_dir: Path) -> str:
    """Which checkpoint `resume=True` continues from, after a stop that is not a divergence."""
    try:
        path, state = ckpt.resume_state(out_dir)
    except UsageError:
        return f"no checkpoint to resume from; {good_checkpoint_text(out_dir)}"
    which = "last good checkpoint" if (path / ckpt.VERIFIED).is_file() else "last complete checkpoint"
    return f"{which}: step {state['step']} in {str(path)!r} (`resume=True` continues from it)"


def out_of_space(
    exc: OSError, out_dir: Path, checkpoint_bytes: int, written: str | None = None
) -> RunError | None:
    """The one line for a disk that filled up while writing `written` (default: the file the
    error names) into the run in `out_dir`: what a checkpoint needs (`checkpoint_bytes`), what is
    free, and the checkpoint a resume continues from; None for another error."""
    reason = DISK_FULL.get(exc.errno or -1)
    if reason is None:
        return None
    if written is None:
        name = final_name(Path(os.fsdecode(exc.filename)).name) if exc.filename else None
        written = repr(name) if name else "the run's files"
    return RunError(
        f"{reason} on {mount_point(out_dir)} while writing {written} in `out_dir` "
        f"{str(out_dir)!r}: a checkpoint needs ~{format_bytes(checkpoint_bytes)}, "
        f"{format_bytes(free_bytes(out_dir))} free; stopped, {resume_point_text(out_dir)}"
    )
