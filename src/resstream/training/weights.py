"""Weight files read safely, and weights checked: safetensors (or pickle-free torch files),
all tensors finite, each of the dtype and shape the model needs.

resstream never unpickles: a torch file loads only if it is a flat dict of tensors that loads
with ``weights_only=True``. A tensor set holding NaN or ±inf is found in one cheap pass
(`first_non_finite`), so that non-finite weights are never written (`NonFiniteState`) nor loaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from resstream.errors import RunError, UsageError, short_reason
from resstream.training.checkpoint_layout import MODEL_FILE

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")
#: Elements per slice when non-finite values are counted (bounds the temporary mask).
_COUNT_CHUNK = 1 << 22


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


def refuse_non_finite(what: str, parts: dict[str, dict[str, torch.Tensor]]) -> None:
    """`NonFiniteState` naming the first of `parts` (name -> tensors) that holds a non-finite
    value: `what` (a checkpoint, the final model) is then not written."""
    for part, tensors in parts.items():
        found = first_non_finite(tensors.items())
        if found is not None:
            raise NonFiniteState(what, part, found)


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


def weights_file(root: Path) -> Path:
    """model.safetensors, else a torch weights file (loaded only if it needs no unpickling)."""
    if (root / MODEL_FILE).is_file():
        return root / MODEL_FILE
    for suffix in PICKLE_SUFFIXES:
        candidates = sorted(root.glob(f"*{suffix}"))
        if candidates:
            return candidates[0]
    raise UsageError(f"{str(root)!r} has no weights ({MODEL_FILE} is missing)")
