"""Tuned-lens translators: one learned affine map per layer, applied before the logit lens.

A translator of layer l maps a residual state h_l to h_l + A_l h_l + b_l (A_l: d×d, b_l: d),
after which the state is decoded like the logit lens: W_U · final_norm(·) (+ b_U, soft-capping
where the model has it). A_l and b_l start at zero, so an untrained lens *is* the logit lens,
bit for bit. Layers 0..L−1 have translators; the last state h_L is the model's own input to its
unembedding and is decoded as it is (its translator is the identity).

A lens belongs to one model: `model_signature` reads a few hundred weights of the model at
fixed places (rounded to bfloat16, so a float32 and a bfloat16 load of the same checkpoint
agree) and `TunedLens.check_model` refuses a lens loaded onto another model, naming both
fingerprints. On disk a lens is a directory holding `translators.safetensors` (the stacked A
and b) and `lens.json` (format, fingerprint, signature, model name, shapes and the training
record).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from resstream.errors import UsageError
from resstream.models.adapters.base import ModelView

FORMAT = "resstream-tuned-lens/1"
WEIGHTS_FILE = "translators.safetensors"
META_FILE = "lens.json"
#: Weights read from each parameter tensor for the model signature.
SIGNATURE_SAMPLES = 4
#: Relative tolerance when comparing signatures (bfloat16 has 8 significant bits).
SIGNATURE_RTOL = 1.0 / 64

#: Parameter name -> (shape, sampled weights, or None when the tensor is not loaded).
Signature = dict[str, tuple[tuple[int, ...], tuple[float, ...] | None]]


class Translators(nn.Module):
    """The affine translators of layers 0..L−1: `weight` (L, d, d) = A, `bias` (L, d) = b,
    both zero at construction (module docstring). Kept in float32 whatever the model's dtype."""

    def __init__(self, n_layers: int, d_model: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        if n_layers < 1 or d_model < 1:
            raise ValueError(f"translators need n_layers >= 1 and d_model >= 1, got {n_layers}, {d_model}")
        self.weight = nn.Parameter(torch.zeros(n_layers, d_model, d_model, device=device))
        self.bias = nn.Parameter(torch.zeros(n_layers, d_model, device=device))

    @property
    def n_layers(self) -> int:
        """L: the number of layers of the model (the translators cover 0..L−1)."""
        return int(self.weight.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.weight.shape[1])

    def translate(self, h: Tensor, layer: int) -> Tensor:
        """h + A_layer h + b_layer for states h (..., d) of `layer` in 0..L (layer L: h itself):
        the reading path, computed in float64 and rounded to h's dtype, so that a state's
        translation does not depend on how many others share its batch (a float32 product
        rounds differently with the kernel's blocking, which could flip near-tied ranks)."""
        if not 0 <= layer <= self.n_layers:
            raise ValueError(f"layer {layer} is outside 0..{self.n_layers}")
        if layer == self.n_layers:
            return h
        x = h.to(self.weight.device, torch.float64)
        out = x + x @ self.weight[layer].double().T + self.bias[layer].double()
        return out.to(h.dtype)

    def translate_all(self, states: Tensor) -> Tensor:
        """Translate stacked states (L', ..., d) of layers 0..L'−1 (L' ≤ L) in one batched
        product, float32 out: the training path (`translate` is the reading path)."""
        depth, shape = states.shape[0], states.shape
        x = states.reshape(depth, -1, shape[-1]).float()
        out = torch.baddbmm(self.bias[:depth, None, :], x, self.weight[:depth].transpose(1, 2)) + x
        return out.reshape(shape)


@dataclass(eq=False)
class TunedLens:
    """Translators for one model, with the model's fingerprint and how they were trained."""

    translators: Translators
    fingerprint: str
    signature: Signature
    model: str
    record: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def zero(cls, view: ModelView, model: str) -> TunedLens:
        """An untrained lens for `view` (every translator zero: the logit lens)."""
        fingerprint, signature = model_signature(view)
        return cls(Translators(view.n_layers, view.d_model, view.W_U.device), fingerprint, signature, model)

    def check_model(self, view: ModelView, source: str = "the lens") -> None:
        """UsageError unless `view` is the model this lens was trained on (shapes and weights),
        naming both fingerprints and the first parameter tensor that differs."""
        fingerprint, signature = model_signature(view)
        shape = (view.n_layers, view.d_model)
        differs = _first_difference(signature, self.signature)
        if shape != (self.translators.n_layers, self.translators.d_model) or differs is not None:
            where = f"; first difference: {differs}" if differs else ""
            raise UsageError(
                f"{source} was trained on another model: it expects fingerprint {self.fingerprint} "
                f"({self.model}, {self.translators.n_layers} layers, d_model {self.translators.d_model}); "
                f"this model has fingerprint {fingerprint} ({view.n_layers} layers, d_model {view.d_model})"
                f"{where}"
            )

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write `translators.safetensors` and `lens.json` into `directory` (created)."""
        from resstream.io import write_json

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        write_tensors(out / WEIGHTS_FILE, self.translators.state_dict())
        write_json(out / META_FILE, self.metadata())
        return out

    def metadata(self) -> dict[str, Any]:
        """The content of lens.json."""
        return {
            "format": FORMAT,
            "model": self.model,
            "fingerprint": self.fingerprint,
            "n_layers": self.translators.n_layers,
            "d_model": self.translators.d_model,
            "signature": {name: [list(shape), values] for name, (shape, values) in self.signature.items()},
            "training": self.record,
        }


def write_tensors(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write float32 CPU copies of `tensors` as one safetensors file, atomically (`io.atomic_path`)."""
    from resstream.io import write_safetensors

    write_safetensors(path, {name: t.detach().float() for name, t in tensors.items()}, metadata)


def load_lens(directory: str | os.PathLike[str]) -> TunedLens:
    """The lens saved in `directory`; UsageError (one line) when it is missing or corrupt."""
    path = Path(directory)
    where = f"tuned lens {str(path)!r}"
    if not path.is_dir():
        raise UsageError(f"{where} does not exist (train one with `resstream tune-lens --out DIR`)")
    for name in (META_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise UsageError(
                f"{where} holds no {name}: not a lens directory (written by `resstream tune-lens`)"
            )
    meta = _read_meta(path / META_FILE, where)
    translators = Translators(meta["n_layers"], meta["d_model"])
    translators.load_state_dict(_read_weights(path / WEIGHTS_FILE, meta, where))
    signature = _signature_from_json(meta["signature"], where)
    return TunedLens(
        translators, str(meta["fingerprint"]), signature, str(meta["model"]), meta.get("training", {})
    )


def _read_meta(path: Path, where: str) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{where}: {META_FILE} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise UsageError(f"{where}: {META_FILE} has format {found!r}, expected {FORMAT!r}")
    checks = (("n_layers", int), ("d_model", int), ("fingerprint", str), ("signature", dict), ("model", str))
    for key, kind in checks:
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise UsageError(f"{where}: {META_FILE} lacks a valid {key!r}")
    if not isinstance(meta.get("training", {}), dict):
        raise UsageError(f"{where}: {META_FILE} lacks a valid 'training' record")
    if meta["n_layers"] < 1 or meta["d_model"] < 1:
        raise UsageError(f"{where}: {META_FILE} has n_layers {meta['n_layers']}, d_model {meta['d_model']}")
    return meta


def _read_weights(path: Path, meta: dict[str, Any], where: str) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UsageError(f"{where}: {WEIGHTS_FILE} is corrupt ({exc})") from None
    layers, d = meta["n_layers"], meta["d_model"]
    want = {"weight": (layers, d, d), "bias": (layers, d)}
    got = {name: tuple(t.shape) for name, t in tensors.items()}
    if got != want:
        raise UsageError(f"{where}: {WEIGHTS_FILE} holds {got}, expected {want} from {META_FILE}")
    if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
        raise UsageError(f"{where}: {WEIGHTS_FILE} holds non-finite values")
    return {name: t.float() for name, t in tensors.items()}


def model_signature(view: ModelView) -> tuple[str, Signature]:
    """(fingerprint, signature) of a model. The signature maps every parameter tensor's name to
    its shape and SIGNATURE_SAMPLES weights at fixed places, rounded to bfloat16 (None for a
    tensor on the meta device, i.e. not loaded or offloaded); the fingerprint hashes them with
    the family and the shapes."""
    signature: Signature = {}
    with torch.no_grad():
        for name, param in sorted(view.model.named_parameters(), key=lambda item: item[0]):
            values = None
            if param.device.type != "meta" and param.numel() > 0:
                flat = param.detach().reshape(-1)
                last = flat.numel() - 1  # integer positions: a float linspace overshoots past 2**24
                places = [i * last // (SIGNATURE_SAMPLES - 1) for i in range(SIGNATURE_SAMPLES)]
                index = torch.tensor(places, dtype=torch.long, device=flat.device)
                values = tuple(flat[index].to(torch.bfloat16).float().cpu().tolist())
            signature[name] = (tuple(param.shape), values)
    head = f"{view.family}|{view.n_layers}|{view.d_model}|{tuple(view.W_U.shape)}"
    digest = hashlib.sha256((head + json.dumps(sorted(signature.items()))).encode())
    return digest.hexdigest()[:16], signature


def _first_difference(found: Signature, expected: Signature) -> str | None:
    """The first parameter (by name) whose shape or sampled weights differ, or one present on
    one side only; None when the signatures agree (a tensor not loaded on either side, e.g.
    offloaded by a device map, is compared by shape only)."""
    for name in sorted(set(found) | set(expected)):
        if name not in found or name not in expected:
            return f"{name} is {'missing from this model' if name not in found else 'not in the lens model'}"
        (shape_a, values_a), (shape_b, values_b) = found[name], expected[name]
        if shape_a != shape_b:
            return f"{name} has shape {shape_a}, the lens model {shape_b}"
        if values_a is None or values_b is None:
            continue
        a, b = torch.tensor(values_a, dtype=torch.float64), torch.tensor(values_b, dtype=torch.float64)
        if not bool(torch.allclose(a, b, rtol=SIGNATURE_RTOL, atol=1e-6)):
            return f"{name} holds other weights"
    return None


def _signature_from_json(raw: dict[str, Any], where: str) -> Signature:
    """The signature kept in lens.json ({name: [shape, values or null]}); UsageError if malformed."""
    signature: Signature = {}
    for name, entry in raw.items():
        try:
            shape, values = entry
            parsed = None if values is None else tuple(float(v) for v in values)
            signature[str(name)] = (tuple(int(n) for n in shape), parsed)
        except (TypeError, ValueError):
            raise UsageError(f"{where}: {META_FILE} has a malformed signature entry for {name!r}") from None
    return signature


__all__ = ["FORMAT", "Translators", "TunedLens", "load_lens", "model_signature", "write_tensors"]
