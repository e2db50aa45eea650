"""The checkpoint of a tuned-lens training run: everything a resumed run needs to continue
bit for bit like one that was never interrupted.

After k optimiser steps a run is its translators, the optimiser's momentum buffers, the KL
curve so far and its settings; nothing else changes from step to step: step k trains on
windows the settings fix (the seeded split), its learning rate depends on k alone
(`LensOptimiser.build(start=k)`), and training draws no random numbers. One file holds it all,
`tune-lens-checkpoint.safetensors` in the run's folder: the tensors `translators.weight`,
`translators.bias`, `momentum.weight`, `momentum.bias` (no momentum before the first step) and,
in the file's metadata, the rest as JSON. It is replaced atomically (`io.atomic_path`), so an
interrupted save leaves the previous checkpoint; never pickle.

A resume must run with the settings of the checkpointed run (`check_same_settings` names the
first that differs): the model (by its fingerprint) and its dtype, the corpus (by name and
fingerprint), the window length, seed, tokens, steps, held-out windows, micro-batch size and
the optimiser. The device is not a setting: a run resumed on another device continues, but
bit-identity holds on the same device (and the same number of CPU threads) only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from resstream.analysis.decoding.tuned_lens import write_tensors
from resstream.errors import UsageError
from resstream.io import kind_of, strict_json
from resstream.rundir import remove_entry

CHECKPOINT_FILE = "tune-lens-checkpoint.safetensors"
FORMAT = "resstream-tune-lens-checkpoint/1"
#: The parameters of the translators, by name (`Translators.named_parameters`).
PARAMETERS = ("weight", "bias")
#: Settings a message names in words: they are not parameters of `tune_lens`.
_NAMED = {
    "model": "the model's fingerprint",
    "dataset_fingerprint": "the corpus's fingerprint",
    "momentum": "the optimiser's momentum",
    "weight_decay": "the optimiser's weight decay",
    "max_grad_norm": "the optimiser's gradient-norm clip",
}


@dataclass(frozen=True)
class LensCheckpoint:
    """A tuned-lens training run after `step` of its `settings["steps"]` optimiser steps."""

    step: int
    settings: dict[str, Any]
    history: tuple[float, ...]  # mean KL over layers per step, bits
    translators: dict[str, Tensor]  # by parameter name
    momentum: dict[str, Tensor] = field(default_factory=dict)  # empty before the first step
    resumed: tuple[int, ...] = ()  # the steps earlier resumes continued from

    @property
    def steps(self) -> int:
        """The run's optimiser steps in all."""
        return int(self.settings["steps"])

    @property
    def finished(self) -> bool:
        """Whether the run had trained all its steps (only its evaluation was left)."""
        return self.step >= self.steps


def checkpoint_path(directory: str | os.PathLike[str]) -> Path:
    """Where the checkpoint of a run in `directory` lies."""
    return Path(directory) / CHECKPOINT_FILE


def save_checkpoint(directory: str | os.PathLike[str], checkpoint: LensCheckpoint) -> Path:
    """Write `checkpoint` into `directory`, replacing the previous one atomically."""
    tensors = {f"translators.{name}": t for name, t in checkpoint.translators.items()}
    tensors |= {f"momentum.{name}": t for name, t in checkpoint.momentum.items()}
    state = {
        "step": checkpoint.step,
        "settings": checkpoint.settings,
        "history": list(checkpoint.history),
        "resumed": list(checkpoint.resumed),
    }
    path = checkpoint_path(directory)
    write_tensors(path, tensors, {"format": FORMAT, "state": strict_json(state)})
    return path


def load_checkpoint(directory: str | os.PathLike[str]) -> LensCheckpoint | None:
    """The checkpoint in `directory`, None when there is none; UsageError (one line) for an
    entry at its name that is not a regular file, or a file that is not a whole checkpoint."""
    path = checkpoint_path(directory)
    found = kind_of(path)
    if found is None:
        return None
    if found != "a regular file":
        raise UsageError(f"the tune-lens checkpoint {str(path)!r} is {found}, not a regular file")
    try:
        metadata, tensors = _read(path)
        state = json.loads(metadata["state"])
        return LensCheckpoint(
            step=int(state["step"]),
            settings=dict(state["settings"]),
            history=tuple(float(v) for v in state["history"]),
            translators={name: tensors[f"translators.{name}"] for name in PARAMETERS},
            momentum={
                name: tensors[f"momentum.{name}"] for name in PARAMETERS if f"momentum.{name}" in tensors
            },
            resumed=tuple(int(s) for s in state.get("resumed", [])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(
            f"the tune-lens checkpoint {str(path)!r} is incomplete ({type(exc).__name__}: {exc}); "
            "remove it to start the run again"
        ) from None


def _read(path: Path) -> tuple[dict[str, str], dict[str, Tensor]]:
    """The metadata and tensors of a checkpoint file; UsageError when it is not one."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise UsageError(f"the tune-lens checkpoint {str(path)!r} is corrupt ({exc})") from None
    if metadata.get("format") != FORMAT:
        raise UsageError(
            f"the tune-lens checkpoint {str(path)!r} has format {metadata.get('format')!r}, "
            f"expected {FORMAT!r}"
        )
    return metadata, tensors


def remove_checkpoint(directory: str | os.PathLike[str]) -> None:
    """Remove the checkpoint in `directory`, if any (a link at its name is unlinked, not followed)."""
    remove_entry(checkpoint_path(directory))


def check_same_settings(checkpoint: LensCheckpoint, settings: dict[str, Any], where: str) -> None:
    """UsageError naming the first of `settings` that differs from the checkpointed run's
    (settings the checkpoint does not hold are not compared)."""
    current = json.loads(strict_json(settings))  # as the checkpoint holds them: JSON values
    for key, value in current.items():
        if key in checkpoint.settings and checkpoint.settings[key] != value:
            name = _NAMED.get(key, f"`{key}`")
            raise UsageError(
                f"cannot resume the tune-lens run in {where}: it was trained with {name} "
                f"{checkpoint.settings[key]!r}, this run has {value!r}; resume with the settings of "
                f"the interrupted run (step {checkpoint.step} of {checkpoint.steps})"
            )


def momentum_of(optimiser: torch.optim.Optimizer, parameters: dict[str, Tensor]) -> dict[str, Tensor]:
    """The momentum buffers an SGD optimiser holds for `parameters` (by name; none before a step)."""
    found = {}
    for name, param in parameters.items():
        buffer = optimiser.state.get(param, {}).get("momentum_buffer")
        if buffer is not None:
            found[name] = buffer
    return found


def restore_momentum(
    optimiser: torch.optim.Optimizer, parameters: dict[str, Tensor], momentum: dict[str, Tensor]
) -> None:
    """Give an SGD optimiser the momentum buffers `momentum_of` read (by parameter name)."""
    for name, buffer in momentum.items():
        param = parameters[name]
        optimiser.state[param]["momentum_buffer"] = buffer.to(param.device, param.dtype).clone()


__all__ = [
    "CHECKPOINT_FILE",
    "LensCheckpoint",
    "check_same_settings",
    "checkpoint_path",
    "load_checkpoint",
    "momentum_of",
    "remove_checkpoint",
    "restore_momentum",
    "save_checkpoint",
]
