"""Directions on disk: resstream's safetensors file and llama.cpp's control-vector GGUF.

directions.safetensors (`save_directions`, read back by `load_directions`): one float32
tensor per layer and method, named ``L6.resid/diffmean`` (the site, then the method), holding
the raw vector (`resstream.analysis.steering.directions`: the class means' separation along the
unit direction; its unit direction is it divided by its norm), and the probe as a classifier of
a state, ``L6.resid/probe.weight`` (d,) and ``L6.resid/probe.bias`` (1,): σ(weight·h + bias) is
the probability that h is a positive's (read with the file's position rule). The header's metadata (strings)
says what they are: ``format`` "resstream.directions" and ``format_version``, ``model``,
``model_fingerprint`` ("" when not known), ``family``, ``position`` (the position rule),
``layer_convention``, ``methods``, ``n_layers``, ``d_model``, ``held_out``, ``seed``,
``source``, ``vector`` (what a tensor holds), ``auc`` (JSON: site/method -> held-out AUC) and
``resstream_version``.

directions.gguf (`export_control_vector`): the layout llama.cpp reads with
``--control-vector FILE`` / ``--control-vector-scaled FILE S``. Checked against llama.cpp's
source (ggml-org/llama.cpp): common/common.cpp `common_control_vector_load_one` reads every
tensor named ``direction.<k>``, refuses k = 0, a tensor that is not F32 or not 1-D, and stores
direction k at row k−1 (multiplied by the strength; tensors of several files add up);
src/llama-adapter.cpp `llama_adapter_cvec` keeps a tensor per block il = 1..n_layer−1
("there's never a tensor for layer 0") and `apply_to(cur, il)` adds it, for start ≤ il ≤ end
of ``--control-vector-layer-range`` (default 1..n_layer), where every model's graph calls
`build_cvec(cur, il)`: on block il's output, after its residual additions, before the next
block (the "l_out" tensor). So direction.k lands on the output of 0-based block k, resstream's
h_{k+1} = ``L{k+1}.resid``: the file holds direction.1 .. direction.{L−1} from
``L2.resid`` .. ``L{L}.resid``; h_0 and h_1 have no slot in llama.cpp. The loader reads no
metadata; the keys written are those of llama.cpp's own writer (tools/cvector-generator
`export_gguf`): ``general.architecture`` = "controlvector", ``controlvector.model_hint`` (the
model's architecture name: the Hugging Face `model_type`, as repeng writes it) and
``controlvector.layer_count`` (int32 there: the number of directions; repeng writes uint32),
plus ``controlvector.method`` (as repeng-derived writers do) and ``resstream.*`` keys
naming the model, its fingerprint, the position rule and the scale. (The cvector-generator
itself names the direction it reads at block il's output direction.{il+1}, one block later
than where llama.cpp then adds it; here every direction is placed where it was read.)
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from torch import Tensor

from resstream.analysis.steering.directions import (
    LAYER_CONVENTION,
    METHODS,
    DirectionsResult,
    Method,
    site_name,
    unit,
)
from resstream.errors import UsageError, check_choice, short_reason
from resstream.io import atomic_path, library_versions, write_safetensors

#: The `format` and `format_version` a directions file states.
FORMAT = "resstream.directions"
FORMAT_VERSION = "1"
#: What a tensor of directions.safetensors holds, as its metadata says.
VECTOR_NOTE = (
    "raw vector: the training split's (mean(positive) - mean(negative)) projected on the "
    "method's unit direction; the unit direction is it divided by its norm"
)
#: The keys a directions file's metadata must have.
REQUIRED_KEYS = ("model", "position", "layer_convention", "methods", "n_layers", "d_model")
#: How an exported control vector is scaled: the raw vector, or the unit direction.
Scale = Literal["raw", "unit"]
SCALES: tuple[Scale, ...] = ("raw", "unit")

_TENSOR_NAME = re.compile(r"L(\d+)\.resid/([a-z]+)(\.weight|\.bias)?")


def save_directions(result: DirectionsResult, path: str | os.PathLike[str]) -> Path:
    """Write every method's raw vector at every layer, with the metadata of the module
    docstring, as one safetensors file (atomically)."""
    tensors = {
        f"{site_name(layer)}/{method}": result.raw[m, j].float()
        for j, layer in enumerate(result.layers)
        for m, method in enumerate(result.methods)
    }
    for j, layer in enumerate(result.layers):
        tensors[f"{site_name(layer)}/probe.weight"] = result.probe_weight[j].float()
        tensors[f"{site_name(layer)}/probe.bias"] = result.probe_bias[j : j + 1].float()
    auc = {
        f"{site_name(layer)}/{method}": float(result.auc[m, j])
        for j, layer in enumerate(result.layers)
        for m, method in enumerate(result.methods)
    }
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": result.model,
        "model_fingerprint": result.model_fingerprint or "",
        "family": result.family,
        "position": result.position,
        "layer_convention": LAYER_CONVENTION,
        "methods": ",".join(result.methods),
        "n_layers": str(len(result.layers) - 1),
        "d_model": str(result.d_model),
        "held_out": repr(result.held_out),
        "seed": str(result.seed),
        "source": result.source,
        "vector": VECTOR_NOTE,
        "auc": json.dumps(auc),
        "resstream_version": library_versions()["resstream"],
    }
    return write_safetensors(path, tensors, metadata)


@dataclass(frozen=True, eq=False)
class SavedDirections:
    """A directions file read back: its `metadata` (strings, as written), the raw vectors by
    (layer, method) and the probe's (weight, bias) by layer."""

    path: Path
    metadata: dict[str, str]
    vectors: dict[tuple[int, str], Tensor] = field(repr=False)
    probes: dict[int, tuple[Tensor, float]] = field(default_factory=dict, repr=False)

    @property
    def model(self) -> str:
        """The model the directions were read from."""
        return self.metadata["model"]

    @property
    def model_fingerprint(self) -> str | None:
        """What identified the model's weights (None when it was not known)."""
        return self.metadata.get("model_fingerprint") or None

    @property
    def position(self) -> str:
        """The position rule the states were read with."""
        return self.metadata["position"]

    @property
    def d_model(self) -> int:
        """The width of every vector."""
        return int(self.metadata["d_model"])

    @property
    def n_layers(self) -> int:
        """The model's blocks L (the file's layers are h_0..h_L)."""
        return int(self.metadata["n_layers"])

    @property
    def layers(self) -> tuple[int, ...]:
        """The layers the file holds vectors for, ascending."""
        return tuple(sorted({layer for layer, _ in self.vectors}))

    @property
    def sites(self) -> list[str]:
        """The sites (``L6.resid``) the file holds vectors for, by layer."""
        return [site_name(layer) for layer in self.layers]

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods the file holds vectors of."""
        return tuple(self.metadata["methods"].split(","))

    @property
    def auc(self) -> dict[str, float]:
        """The held-out AUC of each tensor, by its name (``L6.resid/diffmean``)."""
        return {name: float(value) for name, value in json.loads(self.metadata.get("auc", "{}")).items()}

    @property
    def has_probe(self) -> bool:
        """Whether the file holds the probe as a classifier (weight and bias) at its layers."""
        return bool(self.probes)

    def vector(self, layer: int | str, method: str = "diffmean", *, raw: bool = True) -> Tensor:
        """The raw vector (or, `raw=False`, the unit direction) of `method` at h_`layer` (a
        layer number or its site, ``L6.resid``); UsageError for a layer or method the file
        does not hold."""
        check_choice("`method`", method, self.methods)
        found = self.vectors.get((self._layer(layer), method))
        if found is None:
            raise UsageError(f"{str(self.path)!r} holds no {method} vector at {layer!r}")
        return found if raw else unit(found)

    def direction(self, layer: int | str, method: str = "diffmean") -> Tensor:
        """The unit direction of `method` at `layer` (a number or a site, ``L6.resid``)."""
        return self.vector(layer, method, raw=False)

    def probe(self, layer: int | str) -> tuple[str, Tensor, float]:
        """(site, weight, bias) of the probe at `layer`: σ(weight·h + bias) is the probability
        that the state h there (read with the file's position rule) is a positive's."""
        number = self._layer(layer)
        if number not in self.probes:
            raise UsageError(f"{str(self.path)!r} holds no probe at {site_name(number)}")
        weight, bias = self.probes[number]
        return site_name(number), weight, bias

    def _layer(self, layer: int | str) -> int:
        """The layer number of `layer` (a number, or a site ``L6.resid``); UsageError for one
        the file does not hold."""
        match = re.fullmatch(r"L(\d+)\.resid", layer) if isinstance(layer, str) else None
        number = int(match.group(1)) if match else layer
        if not isinstance(number, int) or number not in self.layers:
            raise UsageError(
                f"`layer` {layer!r} is not in {str(self.path)!r}; allowed: "
                f"{self.sites[0]}..{self.sites[-1]} (or their numbers)"
            )
        return number


def load_directions(path: str | os.PathLike[str], *, fingerprint: str | None = None) -> SavedDirections:
    """The directions file at `path` (`save_directions`), its metadata checked: the format
    and version, every required key, every tensor's name (``L{l}.resid/<method>``, l within
    0..n_layers, a known method) and shape (d_model,). Given `fingerprint`, the file must have
    been read from a model of that fingerprint. Every failure is a one-line UsageError."""
    from safetensors import SafetensorError, safe_open

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"directions file {str(file)!r} does not exist (or is not a file)")
    try:
        with safe_open(str(file), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError, ValueError) as exc:
        raise UsageError(f"{str(file)!r} is not a safetensors file: {short_reason(exc)}") from None
    where = f"directions file {str(file)!r}"
    if metadata.get("format") != FORMAT:
        raise UsageError(f"{where} was not written by resstream directions (no format {FORMAT!r})")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise UsageError(
            f"{where} has format version {metadata.get('format_version')!r}; allowed: {FORMAT_VERSION}"
        )
    missing = [key for key in REQUIRED_KEYS if key not in metadata]
    if missing:
        raise UsageError(f"{where} lacks the metadata {', '.join(missing)}")
    if fingerprint is not None and metadata.get("model_fingerprint") != fingerprint:
        raise UsageError(
            f"{where} was read from a model of fingerprint {metadata.get('model_fingerprint') or 'unknown'}, "
            f"not {fingerprint}"
        )
    n_layers, d_model = int(metadata["n_layers"]), int(metadata["d_model"])
    vectors: dict[tuple[int, str], Tensor] = {}
    parts: dict[int, dict[str, Tensor]] = {}
    for name, tensor in tensors.items():
        match = _TENSOR_NAME.fullmatch(name)
        layer, method, part = (
            (int(match.group(1)), match.group(2), match.group(3)) if match else (-1, "", None)
        )
        if method not in METHODS or layer > n_layers or (part is not None and method != "probe"):
            raise UsageError(
                f"{where} holds a tensor {name!r}; allowed: L0.resid..L{n_layers}.resid/<method>"
            )
        shape = (1,) if part == ".bias" else (d_model,)
        if tuple(tensor.shape) != shape:
            raise UsageError(f"{where}: {name} has shape {tuple(tensor.shape)}; allowed: {shape}")
        if part is None:
            vectors[(layer, method)] = tensor
        else:
            parts.setdefault(layer, {})[part] = tensor
    if not vectors:
        raise UsageError(f"{where} holds no direction")
    probes = {
        layer: (found[".weight"], float(found[".bias"][0]))
        for layer, found in parts.items()
        if ".weight" in found and ".bias" in found
    }
    return SavedDirections(file, metadata, vectors, probes)


def gguf_layers(result: DirectionsResult) -> list[tuple[int, int]]:
    """(k, layer): llama.cpp's direction.k for each resstream layer h_{k+1} it can hold
    (module docstring), k = 1 .. L−1."""
    last = result.layers[-1]
    return [(layer - 1, layer) for layer in result.layers if 2 <= layer <= last]


def export_control_vector(
    result: DirectionsResult,
    path: str | os.PathLike[str],
    *,
    method: Method = "diffmean",
    scale: Scale = "raw",
) -> Path:
    """Write `method`'s directions as llama.cpp's control-vector GGUF (module docstring),
    atomically: direction.k = the vector read at ``L{k+1}.resid``, as float32, for k = 1 .. L−1.
    `scale` "raw" (default) writes the raw vector: at strength 1 llama.cpp adds what
    ``resstream.Add(f"L{k+1}.resid", raw)`` adds, at every position (to steer at one site, give
    llama.cpp ``--control-vector-layer-range k k``); "unit" writes the unit direction, to be
    scaled by ``--control-vector-scaled FILE S``. UsageError for a model of fewer than 2 layers
    (nothing to write) or an unknown method or scale."""
    import gguf

    m = result.method_index(method)
    check_choice("`scale`", scale, SCALES)
    chosen = gguf_layers(result)
    if not chosen:
        raise UsageError(
            "a control vector needs a model of at least 2 layers (llama.cpp has no slot for h_0, h_1)"
        )
    vectors = result.raw if scale == "raw" else result.unit
    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), "controlvector")
        writer.add_string("controlvector.model_hint", result.model_hint or result.family or "unknown")
        writer.add_int32("controlvector.layer_count", len(chosen))
        writer.add_string("controlvector.method", method)
        for key, value in _gguf_notes(result, scale).items():
            writer.add_string(key, value)
        for k, layer in chosen:
            vector = vectors[m, result.layer_index(layer)].float().contiguous().numpy()
            writer.add_tensor(f"direction.{k}", vector)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return Path(path)


def _gguf_notes(result: DirectionsResult, scale: Scale) -> dict[str, str]:
    """The ``resstream.*`` strings of an exported control vector."""
    return {
        "resstream.model": result.model,
        "resstream.model_fingerprint": result.model_fingerprint or "",
        "resstream.position": result.position,
        "resstream.scale": scale,
        "resstream.layers": "direction.k = L{k+1}.resid (the output of 0-based block k)",
        "resstream.version": library_versions()["resstream"],
    }


__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "SCALES",
    "SavedDirections",
    "Scale",
    "export_control_vector",
    "gguf_layers",
    "load_directions",
    "save_directions",
]
