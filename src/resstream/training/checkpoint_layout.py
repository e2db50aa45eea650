"""Where a run's files and checkpoints lie, and finding the checkpoints: the latest, the good ones.

A run directory holds:

    run.json                  resolved config, seed, versions, device, git, data fingerprint
    metrics.jsonl             one JSON record per logged step / evaluation
    tokenizer/                the tokenizer the model was trained with
    model.safetensors         final weights; model.json its config and training summary
    checkpoints/latest.json   {"step": N, "dir": "step-0000N"}: the checkpoint a resume continues
                              from: the newest complete one (or the good one a resume went back to)
    checkpoints/step-0000N/   model.safetensors, trainer.safetensors (optimizer + RNG), state.json,
                              and verified.json or diverged.json once the step after N was run

A complete checkpoint is a real folder named ``step-<7 digits>`` (a link named like one is not
one); hidden ``.step-*`` names are interrupted saves and removals (`resstream.training.checkpoint`).
A checkpoint is *good* when it holds ``verified.json``: the step computed from its weights was
finite. The optimizer state is stored as flat tensors (`flatten_optimizer`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from resstream import rundir
from resstream.io import is_real_directory
from resstream.training.metrics import METRICS_FILE
from resstream.training.records import MODEL_META

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
MODEL_FILE = "model.safetensors"
TRAINER_FILE = "trainer.safetensors"
STATE_FILE = "state.json"
VERIFIED = "verified.json"
DIVERGED = "diverged.json"
RUN_RECORD = rundir.RUN_FILE
TOKENIZER_DIR = "tokenizer"
#: The files a run writes at the top of its folder.
RUN_FILES = (MODEL_FILE, MODEL_META, RUN_RECORD, METRICS_FILE)


@dataclass(frozen=True)
class CheckpointRef:
    """Where one checkpoint of a run lies."""

    step: int
    path: Path


def step_name(step: int) -> str:
    """The folder name of checkpoint `step`: ``step-0000012``."""
    return f"step-{step:07d}"


def step_dirs(root: Path) -> dict[int, Path]:
    """The complete checkpoints under `root`, by step (a link named like one is not one)."""
    found = {}
    for path in root.glob("step-*"):
        match = re.fullmatch(r"step-(\d+)", path.name)
        if match and is_real_directory(path):
            found[int(match.group(1))] = path
    return found


def is_diverged(path: Path) -> bool:
    """Whether the step computed from the checkpoint in `path` was not finite."""
    return (path / DIVERGED).exists()


def latest_checkpoint_step(run_dir: Path) -> int | None:
    """Step of the checkpoint `latest.json` points to (the newest complete one, or the good one a
    resumed run went back to), or None when there is none."""
    pointer = Path(run_dir) / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return None
    try:
        return int(json.loads(pointer.read_text())["step"])
    except (ValueError, KeyError, TypeError):
        return None


def newest_good_checkpoint(run_dir: Path) -> CheckpointRef | None:
    """The newest verified checkpoint of a run (see the module docstring), or None."""
    steps = step_dirs(Path(run_dir) / CHECKPOINTS)
    good = [step for step, path in steps.items() if (path / VERIFIED).is_file()]
    return CheckpointRef(max(good), steps[max(good)]) if good else None


def remove_hidden_dirs(root: Path) -> None:
    """Interrupted saves (`.step-*.<hex>`) and removals (`.step-*.<hex>.trash`); a link at such
    a name is unlinked, never followed."""
    for stale in root.glob(".step-*"):
        rundir.remove_entry(stale)


def flatten_optimizer(opt_state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """An optimizer's `state_dict` as flat tensors (``state.<param>.<key>``, for
    trainer.safetensors) and its parameter groups (JSON, for state.json)."""
    tensors = {}
    for index, per_param in opt_state["state"].items():
        for key, value in per_param.items():
            tensors[f"state.{index}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    groups = [dict(g) for g in opt_state["param_groups"]]
    return tensors, groups


def unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The optimizer `state_dict` that `flatten_optimizer` stored (other tensors are ignored)."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if not name.startswith("state."):
            continue
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": groups}
