"""Checkpoints and run directories, stored as safetensors + JSON (never pickle).

A run directory holds:

    run.json                  resolved config, seed, versions, device, git, data fingerprint
    metrics.jsonl             one JSON record per logged step / evaluation
    tokenizer/                the tokenizer the model was trained with
    model.safetensors         final weights; model.json its config and training summary
    checkpoints/latest.json   {"step": N, "dir": "step-0000N"}: the checkpoint a resume continues
                              from: the newest complete one (or the good one a resume went back to)
    checkpoints/step-0000N/   model.safetensors, trainer.safetensors (optimizer + RNG), state.json,
                              and verified.json or diverged.json once the step after N was run

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
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from resstream import rundir
from resstream.data.tokenizer import STAGING_PREFIX as TOKENIZER_STAGING_PREFIX
from resstream.errors import RunError, UsageError, short_reason
from resstream.io import (
    atomic_path,
    check_inside,
    file_fingerprint,
    folder_inside,
    is_real_directory,
    is_temporary_name,
    kind_of,
    write_json,
)
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
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")
#: The files a run writes at the top of its folder.
RUN_FILES = (MODEL_FILE, MODEL_META, RUN_RECORD, METRICS_FILE)
#: Elements per slice when non-finite values are counted (bounds the temporary mask).
_COUNT_CHUNK = 1 << 22


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


@dataclass(frozen=True)
class CheckpointRef:
    """Where one checkpoint of a run lies."""

    step: int
    path: Path


@dataclass(frozen=True)
class NonFinite:
    """The first tensor of a set that holds NaN or infinite values, and how many."""

    tensor: str
    count: int
    total: int

    def __str__(self) -> str:
        values = "value" if self.count == 1 else "values"
        return f"tensor {self.tensor!r} holds {self.count} non-finite {values} of {self.total}"


class NonFiniteState(RunError):
    """A checkpoint (or final model) was not written: its `part` holds non-finite values."""

    def __init__(self, what: str, part: str, found: NonFinite) -> None:
        super().__init__(f"{what} was not written: non-finite values in its {part} ({found})")
        self.part, self.found = part, found


def first_non_finite(named: Iterable[tuple[str, torch.Tensor]]) -> NonFinite | None:
    """The first floating-point tensor holding NaN or ±inf, with its count; None if all are finite.

    One cheap pass: a tensor whose sum is finite holds no NaN or inf (either would make the sum
    non-finite); only a non-finite sum (which may also be an overflow of finite values) is
    counted exactly, in slices so that no mask of the whole tensor is made.
    """
    for name, tensor in named:
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        flat = tensor.detach().reshape(-1)
        if bool(torch.isfinite(flat.sum())):
            continue
        count = sum(int((~torch.isfinite(part)).sum()) for part in flat.split(_COUNT_CHUNK))
        if count:
            return NonFinite(name, count, tensor.numel())
    return None


def check_finite_weights(named: Iterable[tuple[str, torch.Tensor]], model: str) -> None:
    """Refuse (UsageError) a model whose floating-point weights hold NaN or inf, naming the tensor."""
    found = first_non_finite(named)
    if found is not None:
        raise UsageError(
            f"the weights of model {model!r} are not finite: {found}; allowed: a model whose "
            f"weights are all finite (retrain, or resume its run from a good checkpoint)"
        )


def _refuse_non_finite(what: str, parts: dict[str, dict[str, torch.Tensor]]) -> None:
    for part, tensors in parts.items():
        found = first_non_finite(tensors.items())
        if found is not None:
            raise NonFiniteState(what, part, found)


def save_tensors(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write a safetensors file atomically (contiguous CPU copies of the tensors)."""
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(cpu, str(tmp), metadata=metadata)


def check_readable(path: str | os.PathLike[str]) -> None:
    """UsageError `cannot read PATH: permission denied` when this user may not read the file
    `path` (or, for a directory, any file directly in it).

    safetensors reports a file it may not open as "No such file or directory"; opening it
    first tells the two apart.
    """
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    for file in files:
        try:
            with open(file, "rb"):
                pass
        except PermissionError:
            raise UsageError(f"cannot read {str(file)!r}: permission denied") from None


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Read a weights file: safetensors, or a torch file only if it loads without unpickling code."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"weights file {str(path)!r} does not exist")
    check_readable(path)
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
    """Write checkpoint `step` and make it the latest; keep the newest `keep` checkpoints
    (and the newest good one).

    Non-finite weights or optimizer state are never written: `NonFiniteState` (a RunError)
    names the first such tensor, and nothing changes on disk.
    """
    opt_tensors, groups = _flatten_optimizer(optimizer_state)
    _refuse_non_finite(f"checkpoint step {step}", {"weights": model_state, "optimizer state": opt_tensors})
    root = folder_inside(run_dir, Path(run_dir) / CHECKPOINTS)
    name = _step_name(step)
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
    write_json(Path(run_dir) / CHECKPOINTS / LATEST, {"step": step, "dir": _step_name(step)})


def _step_name(step: int) -> str:
    return f"step-{step:07d}"


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


def _step_dirs(root: Path) -> dict[int, Path]:
    """The complete checkpoints under `root`, by step (a link named like one is not one)."""
    found = {}
    for path in root.glob("step-*"):
        match = re.fullmatch(r"step-(\d+)", path.name)
        if match and is_real_directory(path):
            found[int(match.group(1))] = path
    return found


def _prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints up to the latest, and the newest good one.

    Checkpoints newer than the latest belong to a future that a resumed run abandoned (a
    divergence, an interrupted save) and go, as do diverged ones and interrupted saves.
    """
    latest = latest_checkpoint_step(root.parent)
    steps = _step_dirs(root)
    usable = [s for s in sorted(steps) if (latest is None or s <= latest) and not _diverged(steps[s])]
    kept = set(usable[-keep:])
    good = newest_good_checkpoint(root.parent)
    if good is not None:
        kept.add(good.step)
    for step, path in steps.items():
        if step not in kept:
            _remove_dir(path)
    _remove_hidden_dirs(root)


def _remove_hidden_dirs(root: Path) -> None:
    """Interrupted saves (`.step-*.<hex>`) and removals (`.step-*.<hex>.trash`); a link at such
    a name is unlinked, never followed."""
    for stale in root.glob(".step-*"):
        rundir.remove_entry(stale)


# ------------------------------------------------------------------ verification
def mark_verified(run_dir: Path, step: int, *, loss: float, grad_norm: float) -> None:
    """Record that the step after checkpoint `step`, computed from its weights, was finite."""
    path = Path(run_dir) / CHECKPOINTS / _step_name(step)
    if is_real_directory(path):
        write_json(path / VERIFIED, {"step": step + 1, "loss": loss, "grad_norm": grad_norm})


def mark_diverged(run_dir: Path, step: int, reason: str) -> CheckpointRef | None:
    """Record that the step computed from checkpoint `step`'s weights was not finite (`reason`);
    return the newest good checkpoint, which a resume will continue from (None if there is none)."""
    path = Path(run_dir) / CHECKPOINTS / _step_name(step)
    if is_real_directory(path) and not (path / VERIFIED).exists():
        write_json(path / DIVERGED, {"step": step + 1, "reason": reason})
    return newest_good_checkpoint(run_dir)


def _diverged(path: Path) -> bool:
    return (path / DIVERGED).exists()


def newest_good_checkpoint(run_dir: Path) -> CheckpointRef | None:
    """The newest verified checkpoint of a run (see the module docstring), or None."""
    steps = _step_dirs(Path(run_dir) / CHECKPOINTS)
    good = [step for step, path in steps.items() if (path / VERIFIED).is_file()]
    return CheckpointRef(max(good), steps[max(good)]) if good else None


# ------------------------------------------------------------------ leftovers
#: Files that atomic writers (`io.atomic_path`: `.NAME.<random>.tmp`) write, per directory.
_CHECKPOINT_FILES = (LATEST,)
_MARKER_FILES = (VERIFIED, DIVERGED)
#: safetensors' own temporary file beside its target (Rust `tempfile`: `.tmp` + 6 characters).
_SAFETENSORS_TMP = re.compile(r"\.tmp[A-Za-z0-9]{6}")
#: `data.save_tokenizer`'s staging folder (`tempfile.mkdtemp` with its prefix).
_TOKENIZER_STAGING = re.compile(re.escape(TOKENIZER_STAGING_PREFIX) + r"[A-Za-z0-9_]{8}")


def _atomic_tmp(name: str, files: Iterable[str]) -> bool:
    """Whether `name` is `io.atomic_path`'s temporary file for one of `files`."""
    return is_temporary_name(name) and any(name.startswith(f".{f}.") for f in files)


def remove_leftovers(run_dir: Path) -> None:
    """Remove every temporary or trash name that an interrupted writer of a run leaves, and
    nothing else: half-written files of the atomic writers, safetensors' temporary file, the
    tokenizer's staging folder, interrupted checkpoint saves and removals.

    Called by the trainer once its checks have passed, and by `distributed.run_lock` as soon
    as it holds a folder that already holds a run (`rundir.previous_command`), before any
    check, so a refused resume cleans up too. Nothing else writes into `run_dir` then. Each
    name is removed only as the kind of entry its writer makes (a temporary file is never a
    folder); a link at such a name is removed, never followed, and a `checkpoints` that is a
    link is not entered.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    rundir.remove_leftovers(run_dir)  # the atomic writers' temporaries, as in any --out
    for path in run_dir.iterdir():
        kind = kind_of(path)
        safetensors_tmp = _SAFETENSORS_TMP.fullmatch(path.name) and kind != "a directory"
        staging = _TOKENIZER_STAGING.fullmatch(path.name) and kind in ("a directory", "a symbolic link")
        if safetensors_tmp or staging:
            rundir.remove_entry(path)
    root = run_dir / CHECKPOINTS
    if not is_real_directory(root):  # a link is never followed (and a run refuses it: `folder_inside`)
        return
    _remove_hidden_dirs(root)
    for path in root.iterdir():
        if _atomic_tmp(path.name, _CHECKPOINT_FILES) and not is_real_directory(path):
            rundir.remove_entry(path)
    for step_dir in _step_dirs(root).values():
        for path in step_dir.iterdir():
            if _atomic_tmp(path.name, _MARKER_FILES) and not is_real_directory(path):
                rundir.remove_entry(path)


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
        if latest["dir"] != _step_name(step):
            raise ValueError(f"checkpoint {step} is in {_step_name(step)!r}, not {latest['dir']!r}")
        _check_resume_entries(run_dir, [(root / _step_name(step), "a directory")])
        path = _resume_dir(root, step, root / _step_name(step))
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


def check_run_folders(run_dir: Path, files: Iterable[str] = ()) -> None:
    """UsageError, before a run starts, when a name the run writes in `run_dir` is a link or
    the wrong kind of entry: a folder (`checkpoints`, `tokenizer`) that is a link or a file
    (written through, it would put the run's files, and its pruning, outside `run_dir`), or
    a file (its own and `files`) that is a link or a folder (a link would be read on resume; a
    folder would stop the run at its end)."""
    entries = [(CHECKPOINTS, "a directory"), (TOKENIZER_DIR, "a directory")]
    entries += [(name, "a regular file") for name in (*RUN_FILES, *files)]
    try:
        for name, expected in entries:
            check_inside(run_dir, Path(run_dir) / name, expected)
    except UsageError as exc:
        raise UsageError(f"`out_dir` {str(run_dir)!r}: {exc}") from None


def _check_resume_entries(run_dir: Path, entries: Iterable[tuple[Path, str]]) -> None:
    """UsageError naming the first (path, expected kind) of `entries` that is reached through a
    link or is another kind (`io.check_inside`): a run's checkpoints are resstream's own files,
    and a link could lead a resume out of the run."""
    try:
        for path, expected in entries:
            check_inside(run_dir, path, expected)
    except UsageError as exc:
        raise UsageError(f"cannot resume from `out_dir` {str(run_dir)!r}: {exc}") from None


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
        optimizer_state=_unflatten_optimizer(trainer, groups),
        rng_state=rng,
        state=state,
        path=path,
        verified=(path / VERIFIED).is_file(),
    )


def _resume_dir(root: Path, step: int, latest: Path) -> Path:
    """`latest` (checkpoint `step`), or the newest good checkpoint when the step after it diverged."""
    if not _diverged(latest):
        return latest
    good = newest_good_checkpoint(root.parent)
    if good is None:
        reason = json.loads((latest / DIVERGED).read_text(encoding="utf-8")).get("reason", "diverged")
        raise UsageError(
            f"cannot resume: checkpoint step {step} in {str(latest)!r} diverged ({reason}) and the "
            f"run has no good checkpoint; start a fresh run (with a lower `lr`) in another `out_dir`"
        )
    return good.path


def save_model(run_dir: Path, model_state: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write the final weights and their description (`model.json`) into a run directory;
    non-finite weights are never written (`NonFiniteState`)."""
    _refuse_non_finite("the final model", {"weights": model_state})
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
    """Load a state dict; missing, unexpected or mis-shaped tensors are a UsageError.

    A tensor that is not floating-point where the model holds floating-point weights (int64,
    bool, ...) is refused rather than converted: resstream writes float weights, so such a
    file was not written by a resstream run, and integers cast to floats would load silently
    as a different model.
    """
    expected = model.state_dict()
    for name, tensor in state.items():
        if name in expected and expected[name].is_floating_point() and not tensor.is_floating_point():
            dtype = str(tensor.dtype).removeprefix("torch.")
            raise UsageError(
                f"weights in {str(where)!r}: tensor {name!r} has dtype {dtype}; the model needs "
                f"floating-point weights"
            )
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


def weights_fingerprint(run_dir: str | os.PathLike[str]) -> str | None:
    """sha256 (16 hex) of a finished run's weights file, None without one: which weights a
    benchmark score is of."""
    path = Path(run_dir) / MODEL_FILE
    return file_fingerprint(path) if path.is_file() else None


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
    state = load_tensors(_weights_file(root))
    load_weights(model, state, root)
    check_finite_weights(state.items(), str(root))
    model.to(device).eval()
    tokenizer = load_tokenizer(str(root / TOKENIZER_DIR))
    return TrainedModel(model=model, tokenizer=tokenizer, config=config, meta=meta, path=root)
