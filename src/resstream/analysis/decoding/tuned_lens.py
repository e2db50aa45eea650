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

`load_lens` also reads a lens saved by the `tuned-lens` package (`config.json` + `params.pt`,
`resstream.analysis.decoding.tuned_lens_package`: the same formula, the same layers), and
`TunedLens.save(..., layout="tuned-lens")` writes one. Such a lens records no signature of its
model: `check_model` then compares the shapes (layers, d_model) and, where the config records
the package's `unembed_hash`, says in a notice when the model's differs (the package warns
too; the hash is of the unembedding printed at one decimal, which a change of dtype can
alter). A lens resstream exported keeps its signature beside the package's files
(`resstream-lens.json`, which the package ignores), so it reads back as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from resstream.analysis.decoding import tuned_lens_package as package
from resstream.errors import UsageError, check_choice
from resstream.models.adapters.base import ModelView
from resstream.notices import notify
from resstream.reprs import summary

FORMAT = "resstream-tuned-lens/1"
WEIGHTS_FILE = "translators.safetensors"
META_FILE = "lens.json"
#: resstream's record of an exported lens's model, beside the package's files.
EXPORT_META_FILE = "resstream-lens.json"
#: The layouts a lens is saved in: resstream's own, or the tuned-lens package's.
Layout = Literal["resstream", "tuned-lens"]
LAYOUTS: tuple[Layout, ...] = ("resstream", "tuned-lens")
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
        """d: the width of the residual states the translators map."""
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
    """Translators for one model, with the model's fingerprint and how they were trained.

    A lens read from the tuned-lens package's files has an empty `signature` (its model's
    weights were not recorded), the package's `unembed_hash` (None if its config has none)
    and a `fingerprint` made of that hash ("unrecorded" without one); `bound` gives it a
    model's signature."""

    translators: Translators
    fingerprint: str
    signature: Signature
    model: str
    record: dict[str, Any] = field(default_factory=dict)
    unembed_hash: str | None = None
    _noticed: set[str] = field(default_factory=set, init=False, repr=False)

    def __repr__(self) -> str:
        layers, d = self.translators.n_layers, self.translators.d_model
        checks = "shapes and unembed_hash" if self.unembed_hash else "shapes"
        model = (
            f"fingerprint {self.fingerprint}"
            if self.signature
            else f"tuned-lens package lens, checked by {checks}"
        )
        trained = self.record.get("train_tokens")
        data = (
            f"trained on {trained:,} tokens of {self.record.get('dataset')}"
            if isinstance(trained, int)
            else ""
        )
        return summary(self, self.model, f"{layers} layers × d_model {d}", model, data)

    @classmethod
    def zero(cls, view: ModelView, model: str) -> TunedLens:
        """An untrained lens for `view` (every translator zero: the logit lens)."""
        fingerprint, signature = model_signature(view)
        return cls(Translators(view.n_layers, view.d_model, view.W_U.device), fingerprint, signature, model)

    def check_model(self, view: ModelView, source: str = "the lens") -> None:
        """UsageError unless `view` is the model this lens was trained on (shapes and weights),
        naming both fingerprints and the first parameter tensor that differs. A lens without a
        signature (from the tuned-lens package) is checked by its shapes, naming both, and by
        its `unembed_hash` (a notice, once per model, when it differs)."""
        if not self.signature:
            self._check_shapes(view, source)
            self._check_unembed_hash(view, source)
            return
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

    def _check_shapes(self, view: ModelView, source: str) -> None:
        """UsageError naming both shapes when the translators do not fit `view`."""
        lens = (self.translators.n_layers, self.translators.d_model)
        if lens != (view.n_layers, view.d_model):
            raise UsageError(
                f"{source} was made for another model: {lens[0]} layers, d_model {lens[1]} ({self.model}); "
                f"this model has {view.n_layers} layers, d_model {view.d_model}"
            )

    def _check_unembed_hash(self, view: ModelView, source: str) -> None:
        """A notice (once per model) when the model's unembedding hash is not the lens's (not
        checked when the unembedding is not loaded, e.g. offloaded by a device map)."""
        if self.unembed_hash is None or view.W_U.device.type == "meta":
            return
        found = package.unembed_hash(view.W_U)
        if found != self.unembed_hash and found not in self._noticed:
            self._noticed.add(found)
            notify(
                f"{source} records the unembedding hash {self.unembed_hash[:16]} ({self.model}); this "
                f"model's is {found[:16]}: the lens may have been trained on another model (or on "
                "another dtype of this one)"
            )

    def bound(self, view: ModelView, source: str = "the lens") -> TunedLens:
        """This lens, checked against `view` (`check_model`), carrying `view`'s fingerprint and
        signature: a lens without one (from the tuned-lens package) is then refused on any
        other model, as a lens resstream trained is. A lens with a signature is returned as
        it is."""
        self.check_model(view, source)
        if self.signature:
            return self
        fingerprint, signature = model_signature(view)
        return replace(self, fingerprint=fingerprint, signature=signature)

    def save(self, directory: str | os.PathLike[str], layout: Layout = "resstream") -> Path:
        """Write the lens into `directory` (created): `translators.safetensors` and `lens.json`,
        or with `layout` "tuned-lens" the tuned-lens package's `config.json` and `params.pt`
        (plus `resstream-lens.json`, this lens's `metadata`, which the package ignores)."""
        from resstream.io import write_json

        check_choice("layout", layout, LAYOUTS)
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        if layout == "tuned-lens":
            weights = self.translators.state_dict()
            package.write_package_lens(out, weights["weight"], weights["bias"], self.model, self.unembed_hash)
            write_json(out / EXPORT_META_FILE, self.metadata())
            return out
        write_tensors(out / WEIGHTS_FILE, self.translators.state_dict())
        write_json(out / META_FILE, self.metadata())
        return out

    def metadata(self) -> dict[str, Any]:
        """The content of lens.json."""
        meta = {
            "format": FORMAT,
            "model": self.model,
            "fingerprint": self.fingerprint,
            "n_layers": self.translators.n_layers,
            "d_model": self.translators.d_model,
            "signature": {name: [list(shape), values] for name, (shape, values) in self.signature.items()},
            "training": self.record,
        }
        return meta if self.unembed_hash is None else {**meta, "unembed_hash": self.unembed_hash}


def write_tensors(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write float32 CPU copies of `tensors` as one safetensors file, atomically (`io.atomic_path`)."""
    from resstream.io import write_safetensors

    write_safetensors(path, {name: t.detach().float() for name, t in tensors.items()}, metadata)


def load_lens(directory: str | os.PathLike[str]) -> TunedLens:
    """The lens saved in `directory`, by `resstream tune-lens` (lens.json) or by the tuned-lens
    package (config.json + params.pt or params.safetensors), told apart by those files;
    UsageError (one line) when it is missing, corrupt, or neither."""
    path = Path(directory)
    where = f"tuned lens {str(path)!r}"
    if not path.is_dir():
        raise UsageError(f"{where} does not exist (train one with `resstream tune-lens --out DIR`)")
    if not (path / META_FILE).is_file():
        if package.is_package_lens(path):
            return _from_package(path, where)
        raise UsageError(
            f"{where} holds no {META_FILE}: not a lens directory (expected {META_FILE} + {WEIGHTS_FILE} "
            f"written by `resstream tune-lens`, or the tuned-lens package's {package.CONFIG_FILE} + "
            f"{package.PARAMS_FILE})"
        )
    if not (path / WEIGHTS_FILE).is_file():
        raise UsageError(
            f"{where} holds no {WEIGHTS_FILE}: not a lens directory (written by `resstream tune-lens`)"
        )
    meta = _read_meta(path / META_FILE, where)
    translators = Translators(meta["n_layers"], meta["d_model"])
    translators.load_state_dict(_read_weights(path / WEIGHTS_FILE, meta, where))
    return _lens_of(translators, meta, where)


def _lens_of(translators: Translators, meta: dict[str, Any], where: str) -> TunedLens:
    """The lens of `translators` described by lens.json's content `meta` (checked)."""
    signature = _signature_from_json(meta["signature"], where)
    return TunedLens(
        translators,
        str(meta["fingerprint"]),
        signature,
        str(meta["model"]),
        meta.get("training", {}),
        meta.get("unembed_hash"),
    )


def _from_package(path: Path, where: str) -> TunedLens:
    """A lens in the tuned-lens package's layout; with resstream's record beside it (an
    export), the lens that was exported."""
    found = package.read_package_lens(path, where)
    translators = Translators(found.config["num_hidden_layers"], found.config["d_model"])
    translators.load_state_dict({"weight": found.weight, "bias": found.bias})
    if (path / EXPORT_META_FILE).is_file():
        meta = _read_meta(path / EXPORT_META_FILE, where, EXPORT_META_FILE)
        shapes = (meta["n_layers"], meta["d_model"])
        if shapes != (translators.n_layers, translators.d_model):
            raise UsageError(
                f"{where}: {EXPORT_META_FILE} describes {shapes[0]} layers, d_model {shapes[1]}; "
                f"{package.CONFIG_FILE} {translators.n_layers} layers, d_model {translators.d_model}"
            )
        return _lens_of(translators, meta, where)
    hashed = found.unembed_hash
    fingerprint = f"unembed:{hashed[:16]}" if hashed else "unrecorded"
    record = {"tuned_lens_config": found.config}
    return TunedLens(translators, fingerprint, {}, found.base_model, record, hashed)


def _read_meta(path: Path, where: str, name: str = META_FILE) -> dict[str, Any]:
    """lens.json's content (or an export's `name`), checked."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{where}: {name} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise UsageError(f"{where}: {name} has format {found!r}, expected {FORMAT!r}")
    checks = (("n_layers", int), ("d_model", int), ("fingerprint", str), ("signature", dict), ("model", str))
    for key, kind in checks:
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise UsageError(f"{where}: {name} lacks a valid {key!r}")
    if not isinstance(meta.get("training", {}), dict):
        raise UsageError(f"{where}: {name} lacks a valid 'training' record")
    if not isinstance(meta.get("unembed_hash"), str | None):
        raise UsageError(f"{where}: {name} has an invalid 'unembed_hash'")
    if meta["n_layers"] < 1 or meta["d_model"] < 1:
        raise UsageError(f"{where}: {name} has n_layers {meta['n_layers']}, d_model {meta['d_model']}")
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


__all__ = [
    "EXPORT_META_FILE",
    "FORMAT",
    "LAYOUTS",
    "Layout",
    "Translators",
    "TunedLens",
    "load_lens",
    "model_signature",
    "write_tensors",
]
