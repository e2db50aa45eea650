"""Lenses in the layout of the `tuned-lens` package (Belrose et al., EleutherAI): read and written.

The package saves a lens as a directory holding

* ``config.json``: ``base_model_name_or_path``, ``d_model``, ``num_hidden_layers``, ``bias``,
  ``base_model_revision``, ``unembed_hash`` and ``lens_type`` (``"linear_tuned_lens"``);
* ``params.pt``: ``torch.save`` of its ``layer_translators`` state dict, one ``nn.Linear(d, d)``
  per layer: ``"{i}.weight"`` (d, d) and ``"{i}.bias"`` (d,) for i = 0..num_hidden_layers − 1.

Its lens decodes hidden state ``hidden_states[i]`` of a Hugging Face model (i < L; index 0 is
the embedding output) as ``unembed(h + translator_i(h))`` = W_U · final_norm(h + W_i h + b_i)
(+ b_U), and the last state through the model's own logits. ``hidden_states[i]`` for i < L is
resstream's h_i (the input of block i), so the package's translator i is resstream's translator
of layer i, with A_i = W_i (an ``nn.Linear`` computes x W^T + b, as `Translators.translate`
does) and b_i its bias; both leave h_L as it is. The two formulas are one.

Parameters are read without running code: ``params.safetensors`` when present, else
``params.pt`` through ``torch.load(weights_only=True)``, which refuses any pickle that would
build an object other than tensors and plain containers. Anything else is refused in one line
naming the file. Keys may carry the ``layer_translators.`` prefix (the whole lens's state
dict); its ``unembed.`` entries are ignored (resstream decodes with the model's own
unembedding).

``unembed_hash`` is the package's fingerprint of the unembedding matrix: SHA-256 of
``numpy.array_str(W_U, precision=1)`` under numpy's default print options (a summary of its
corners). `unembed_hash` computes it from those corners alone, so a large matrix is never
copied off its device.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from resstream.errors import UsageError

CONFIG_FILE = "config.json"
PARAMS_FILE = "params.pt"
SAFETENSORS_FILE = "params.safetensors"
#: The only kind of lens the package writes that is an affine translator per layer.
LENS_TYPE = "linear_tuned_lens"
#: numpy's default print options, under which the package's `unembed_hash` is computed.
NUMPY_PRINT_DEFAULTS: dict[str, Any] = {
    "edgeitems": 3,
    "threshold": 1000,
    "floatmode": "maxprec",
    "precision": 8,
    "suppress": False,
    "linewidth": 75,
    "nanstr": "nan",
    "infstr": "inf",
    "sign": "-",
    "formatter": None,
    "legacy": False,
}

_KEY = re.compile(r"(?:layer_translators\.)?(\d+)\.(weight|bias)")
_IGNORED_PREFIX = "unembed."


@dataclass(frozen=True, eq=False)
class PackageLens:
    """A lens as the package's files hold it: the checked config and the translators stacked
    like resstream's (`weight` (L, d, d) = A, `bias` (L, d) = b, float32 on the CPU)."""

    config: dict[str, Any]
    weight: Tensor
    bias: Tensor

    @property
    def base_model(self) -> str:
        """The config's ``base_model_name_or_path``."""
        return str(self.config["base_model_name_or_path"])

    @property
    def unembed_hash(self) -> str | None:
        """The config's ``unembed_hash`` (None when it records none)."""
        value = self.config.get("unembed_hash")
        return str(value) if value else None


def is_package_lens(path: Path) -> bool:
    """Whether directory `path` holds the package's config file (its parameters are checked
    when read)."""
    return (path / CONFIG_FILE).is_file()


def read_package_lens(path: Path, where: str) -> PackageLens:
    """The lens in directory `path`, in the package's layout; UsageError (one line, starting
    with `where`) when a file is missing, malformed or not plain tensors."""
    config = _read_config(path / CONFIG_FILE, where)
    tensors, name = _read_params(path, where)
    weight, bias = _stacked(tensors, config, name, where)
    return PackageLens(config, weight, bias)


def write_package_lens(
    directory: Path, weight: Tensor, bias: Tensor, base_model: str, unembed_hash: str | None = None
) -> None:
    """Write translators `weight` (L, d, d) and `bias` (L, d) as the package saves them:
    ``config.json`` and ``params.pt`` (``torch.save`` of a plain dict of float32 tensors),
    each written atomically (`io.atomic_path`)."""
    from resstream.io import atomic_path, write_json

    layers, d_model = int(weight.shape[0]), int(weight.shape[1])
    state = {}
    for i in range(layers):
        state[f"{i}.weight"] = weight[i].detach().float().cpu().clone()
        state[f"{i}.bias"] = bias[i].detach().float().cpu().clone()
    config = {
        "base_model_name_or_path": base_model,
        "d_model": d_model,
        "num_hidden_layers": layers,
        "bias": True,
        "base_model_revision": None,
        "unembed_hash": unembed_hash,
        "lens_type": LENS_TYPE,
    }
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / PARAMS_FILE) as tmp:
        torch.save(state, tmp)
    write_json(directory / CONFIG_FILE, config)


def unembed_hash(matrix: Tensor) -> str:
    """The package's ``unembed_hash`` of an unembedding matrix (vocab, d_model) (module
    docstring). A floating matrix is read as float32 (the digits printed at one decimal do not
    depend on the width of the float; bfloat16, which numpy lacks, is widened)."""
    if matrix.ndim != 2:
        raise ValueError(f"an unembedding matrix is 2-D, got shape {tuple(matrix.shape)}")
    summarised = matrix.numel() > NUMPY_PRINT_DEFAULTS["threshold"]
    corners = _corners(matrix.detach()) if summarised else matrix.detach()
    array = corners.float().cpu().numpy()
    import numpy

    options = dict(NUMPY_PRINT_DEFAULTS)
    if summarised:  # the corners stand in for the matrix: numpy prints only them
        options["threshold"] = array.size - 1
    with numpy.printoptions(**options):
        text = numpy.array_str(array, precision=1)
    return hashlib.sha256(text.encode()).hexdigest()


def _corners(matrix: Tensor) -> Tensor:
    """The elements numpy prints of a summarised matrix (`edgeitems` at each end of each axis
    longer than twice that), with one stand-in row or column where numpy writes "..."."""
    edge = NUMPY_PRINT_DEFAULTS["edgeitems"]
    for axis in (0, 1):
        length = matrix.shape[axis]
        if length > 2 * edge:
            index = [*range(edge), 0, *range(length - edge, length)]  # 0: the stand-in, not printed
            matrix = matrix.index_select(axis, torch.tensor(index, device=matrix.device))
    return matrix


# --------------------------------------------------------------------------- reading


def _read_config(path: Path, where: str) -> dict[str, Any]:
    """config.json, checked: the fields resstream reads, with the package's defaults."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{where}: {CONFIG_FILE} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{where}: {CONFIG_FILE} holds a {type(config).__name__}, expected an object")
    missing = [
        key for key in ("base_model_name_or_path", "d_model", "num_hidden_layers") if key not in config
    ]
    if missing:
        model = f" (a model's config: model_type {config['model_type']!r})" if "model_type" in config else ""
        raise UsageError(
            f"{where}: {CONFIG_FILE} lacks {', '.join(repr(k) for k in missing)}: not the config of a "
            f"tuned-lens package lens{model}"
        )
    lens_type = config.get("lens_type", LENS_TYPE)
    if lens_type != LENS_TYPE:
        raise UsageError(
            f"{where}: {CONFIG_FILE} has lens_type {lens_type!r}; resstream reads {LENS_TYPE!r} "
            "lenses (one affine translator per layer)"
        )
    for key in ("d_model", "num_hidden_layers"):
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{where}: {CONFIG_FILE} has {key} {value!r}, expected a positive integer")
    if not isinstance(config.get("base_model_name_or_path"), str):
        raise UsageError(f"{where}: {CONFIG_FILE} lacks a valid 'base_model_name_or_path'")
    if not isinstance(config.get("bias", True), bool):
        raise UsageError(f"{where}: {CONFIG_FILE} has bias {config['bias']!r}, expected true or false")
    if not isinstance(config.get("unembed_hash"), str | None):
        raise UsageError(f"{where}: {CONFIG_FILE} has unembed_hash {config['unembed_hash']!r}")
    return {"bias": True, "unembed_hash": None, "lens_type": LENS_TYPE, **config}


def _read_params(path: Path, where: str) -> tuple[dict[str, Tensor], str]:
    """The parameter file's tensors by name, and the file's name: params.safetensors when
    present, else params.pt loaded with ``weights_only=True`` (no code runs)."""
    if (path / SAFETENSORS_FILE).is_file():
        return _read_safetensors(path / SAFETENSORS_FILE, where), SAFETENSORS_FILE
    if not (path / PARAMS_FILE).is_file():
        raise UsageError(
            f"{where} holds {CONFIG_FILE} but no {PARAMS_FILE} or {SAFETENSORS_FILE}: "
            "not a complete tuned-lens package lens"
        )
    return _read_pickle(path / PARAMS_FILE, where), PARAMS_FILE


def _read_safetensors(path: Path, where: str) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UsageError(f"{where}: {path.name} is corrupt ({exc})") from None


def _read_pickle(path: Path, where: str) -> dict[str, Tensor]:
    """params.pt through ``torch.load(weights_only=True)``: a file that needs anything but
    tensors and plain containers is refused, naming what it asked for, and nothing in it runs."""
    import pickle

    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols; the refusal says enough
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"{where}: {path.name} is not a plain state dict of tensors ({_refusal(exc)}); it was "
            "refused without running any of it (resstream loads parameters with weights_only=True)"
        ) from None
    except OSError as exc:
        cause = "truncated or corrupt" if path.is_file() else (exc.strerror or str(exc))
        raise UsageError(f"{where}: {path.name} cannot be read ({cause})") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()
    ):
        found = type(state).__name__ if not isinstance(state, dict) else "a dict of other values"
        raise UsageError(f"{where}: {path.name} holds {found}, expected a state dict of tensors")
    return dict(state)


def _refusal(exc: BaseException) -> str:
    """What torch's weights-only unpickler refused, in a few words (its message is a page)."""
    text = str(exc)
    for pattern in (r"unsupported GLOBAL (\S+)", r"Unsupported global: GLOBAL (\S+)"):
        match = re.search(pattern, text)
        if match:
            return f"it needs {match.group(1).rstrip('.,')}, which only an unrestricted pickle load would run"
    if "Weights only load failed" in text:
        return "torch.load with weights_only=True refused it"
    return " ".join(text.split())[:120] or type(exc).__name__


def _stacked(
    tensors: dict[str, Tensor], config: dict[str, Any], name: str, where: str
) -> tuple[Tensor, Tensor]:
    """The per-layer translators stacked into (L, d, d) and (L, d), checked against the config."""
    layers, d = config["num_hidden_layers"], config["d_model"]
    found: dict[tuple[int, str], Tensor] = {}
    unknown = []
    for key, tensor in tensors.items():
        match = _KEY.fullmatch(key)
        if match:
            found[(int(match.group(1)), match.group(2))] = tensor
        elif not key.startswith(_IGNORED_PREFIX):
            unknown.append(key)
    if unknown:
        shown = ", ".join(repr(k) for k in sorted(unknown)[:3]) + (", ..." if len(unknown) > 3 else "")
        raise UsageError(f"{where}: {name} holds entries that are not layer translators ({shown})")
    kinds = ("weight", "bias") if config["bias"] else ("weight",)
    indices = sorted({i for i, _ in found})
    if indices != list(range(layers)) or any(kind not in kinds for _, kind in found):
        held = f"layers {indices[0]}..{indices[-1]}" if indices else "no layers"
        raise UsageError(
            f"{where}: {name} holds translators for {len(indices)} layers ({held}), {CONFIG_FILE} "
            f"num_hidden_layers {layers} (bias {str(config['bias']).lower()}) expects layers 0..{layers - 1}"
        )
    missing = [f"{i}.{kind}" for i in range(layers) for kind in kinds if (i, kind) not in found]
    if missing:
        raise UsageError(f"{where}: {name} lacks {missing[0]} (bias {str(config['bias']).lower()})")
    shapes = {"weight": (d, d), "bias": (d,)}
    for (i, kind), tensor in sorted(found.items()):
        if tuple(tensor.shape) != shapes[kind]:
            raise UsageError(
                f"{where}: {name} has {i}.{kind} of shape {tuple(tensor.shape)}, expected "
                f"{shapes[kind]} for d_model {d} in {CONFIG_FILE}"
            )
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise UsageError(f"{where}: {name} has {i}.{kind} with non-finite or non-float values")
    weight, bias = torch.empty(layers, d, d), torch.zeros(layers, d)  # filled layer by layer: one copy
    for i in range(layers):
        weight[i].copy_(found.pop((i, "weight")))
        if config["bias"]:
            bias[i].copy_(found.pop((i, "bias")))
    return weight, bias


__all__ = [
    "CONFIG_FILE",
    "LENS_TYPE",
    "PARAMS_FILE",
    "SAFETENSORS_FILE",
    "PackageLens",
    "is_package_lens",
    "read_package_lens",
    "unembed_hash",
    "write_package_lens",
]
