"""Checkpoints and run directories, stored as safetensors + JSON (never pickle).

A run directory holds:

    run.json                  resolved config, seed, versions, device, git, data fingerprint
    metrics.jsonl             one JSON record per logged step / evaluation
    tokenizer/                the tokenizer the model was trained with
    model.safetensors         final weights; model.json its config and training summary
    checkpoints/latest.json   {"step": N, "dir": "step-0000N"}: the newest complete checkpoint
    checkpoints/step-0000N/   model.safetensors, trainer.safetensors (optimizer + RNG), state.json

A checkpoint is written into a temporary directory, renamed into place, and only then does
`latest.json` (replaced atomically) point to it; an interrupted save leaves the previous
checkpoint as the one that loads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from resstream.errors import UsageError, short_reason
from resstream.io import atomic_path, write_json
from resstream.training.records import MODEL_META

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
MODEL_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint restores."""

    step: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    rng_state: dict[str, torch.Tensor]
    state: dict[str, Any]  # config, fingerprints, best values: JSON data
    path: Path


def save_tensors(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write a safetensors file atomically (contiguous CPU copies of the tensors)."""
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(cpu, str(tmp), metadata=metadata)


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Read a weights file: safetensors, or a torch file only if it loads without unpickling code."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"weights file {str(path)!r} does not exist")
    if path.suffix in PICKLE_SUFFIXES:
        return _load_torch_weights_only(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UsageError(
            f"weights file {str(path)!r} is corrupt or not safetensors: {short_reason(exc)}"
        ) from None


def _load_torch_weights_only(path: Path) -> dict[str, torch.Tensor]:
    import pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        reason = short_reason(exc)
        raise UsageError(
            f"torch checkpoint {str(path)!r} would need unsafe unpickling to load; resstream only "
            f"loads safetensors or plain tensor dicts ({reason})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UsageError(f"torch checkpoint {str(path)!r} is not a flat dict of tensors")
    return state


def _flatten_optimizer(opt_state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    tensors = {}
    for index, per_param in opt_state["state"].items():
        for key, value in per_param.items():
            tensors[f"state.{index}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    groups = [dict(g) for g in opt_state["param_groups"]]
    return tensors, groups


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list[dict[str, Any]]) -> dict[str, Any]:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if not name.startswith("state."):
            continue
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": groups}


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
    """Write checkpoint `step` and make it the latest; keep the newest `keep` checkpoints."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:07d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        opt_tensors, groups = _flatten_optimizer(optimizer_state)
        save_tensors(tmp / MODEL_FILE, model_state)
        save_tensors(
            tmp / "trainer.safetensors", {**opt_tensors, **{f"rng.{k}": v for k, v in rng_state.items()}}
        )
        write_json(tmp / "state.json", {**state, "step": step, "param_groups": groups})
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    write_json(root / LATEST, {"step": step, "dir": name})
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".step-*"):
        shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint_step(run_dir: Path) -> int | None:
    """Step of the newest complete checkpoint, or None when there is none."""
    pointer = Path(run_dir) / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return None
    try:
        return int(json.loads(pointer.read_text())["step"])
    except (ValueError, KeyError, TypeError):
        return None


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """Load the newest complete checkpoint of a run; UsageError if missing or corrupt."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / LATEST
    if not pointer.is_file():
        raise UsageError(f"cannot resume: no checkpoint in {str(run_dir)!r} ({str(pointer)!r} is missing)")
    try:
        latest = json.loads(pointer.read_text(encoding="utf-8"))
        path = root / latest["dir"]
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        groups = state.pop("param_groups")
        if "step" not in state or "config" not in state:
            raise KeyError("step and config are required")
    except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"cannot resume: checkpoint in {str(root)!r} is corrupt "
            f"({type(exc).__name__}: {short_reason(exc)})"
        ) from None
    model_state = load_tensors(path / MODEL_FILE)
    trainer = load_tensors(path / "trainer.safetensors")
    rng = {k.removeprefix("rng."): v for k, v in trainer.items() if k.startswith("rng.")}
    optimizer_state = _unflatten_optimizer(trainer, groups)
    return Checkpoint(
        step=int(state["step"]),
        model_state=model_state,
        optimizer_state=optimizer_state,
        rng_state=rng,
        state=state,
        path=path,
    )


def save_model(run_dir: Path, model_state: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write the final weights and their description (`model.json`) into a run directory."""
    save_tensors(Path(run_dir) / MODEL_FILE, model_state, metadata={"format": "resstream-gpt"})
    write_json(Path(run_dir) / MODEL_META, meta)


@dataclass(frozen=True)
class TrainedModel:
    """A finished run loaded back: the model (eval mode), its tokenizer and config."""

    model: Any  # resstream.training.model.GPT
    tokenizer: Any  # transformers.PreTrainedTokenizerFast
    config: Any  # resstream.training.config.TrainConfig
    meta: dict[str, Any]
    path: Path


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> None:
    """Load a state dict; missing, unexpected or mis-shaped tensors are a UsageError."""
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        detail = short_reason(exc)
        raise UsageError(f"weights in {str(where)!r} do not match the model's config: {detail}") from None


def _weights_file(root: Path) -> Path:
    """model.safetensors, else a torch weights file (loaded only if it needs no unpickling)."""
    if (root / MODEL_FILE).is_file():
        return root / MODEL_FILE
    for suffix in PICKLE_SUFFIXES:
        candidates = sorted(root.glob(f"*{suffix}"))
        if candidates:
            return candidates[0]
    raise UsageError(f"{str(root)!r} has no weights ({MODEL_FILE} is missing)")


def read_run(run_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], Any]:
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
    load_weights(model, load_tensors(_weights_file(root)), root)
    model.to(device).eval()
    tokenizer = load_tokenizer(str(root / TOKENIZER_DIR))
    return TrainedModel(model=model, tokenizer=tokenizer, config=config, meta=meta, path=root)
