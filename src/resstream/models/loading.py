"""Loading a model for analysis: `load_model(spec)` -> `LoadedModel` (view + tokenizer).

A model already in memory (a Hugging Face `PreTrainedModel`, resstream's `GPT`, or a
`ModelView`) becomes a `LoadedModel` with `as_loaded(model, tokenizer)` (module `loaded`).

`spec` is resolved in this order:

* ``None`` or ``"reference"``: the built-in reference model shipped with resstream (offline,
  always present);
* a directory holding resstream's ``model.json``: a finished resstream training run;
* a directory holding ``config.json``: a local Hugging Face model (with its tokenizer);
* anything else that does not look like a path: a Hugging Face hub name (online users; with
  ``HF_HUB_OFFLINE=1``, or a hub that does not answer within `resstream.hub.PROBE_TIMEOUT_S`,
  only the local cache is consulted, so an uncached name fails within seconds).

Every refusal is a one-line `UsageError` naming the value and what is allowed: a path that
does not exist or has no config, a model that is not a causal LM, an unsupported family, a
missing tokenizer, an unknown dtype or device. ``trust_remote_code`` is off unless asked for:
without it a model whose config.json, or whose tokenizer's tokenizer_config.json, has an
``auto_map`` naming code it needs is refused, and no code from its folder is run.

``dtype="auto"`` is float32 on the CPU; on a GPU it is the dtype the checkpoint was saved in
(resstream's own models: float32). ``device="auto"`` picks CUDA when it is available.
``device_map`` (e.g. ``"auto"``) is passed to Hugging Face for models larger than one device
and needs the `accelerate` package; resstream's own models always load onto `device`.

This module resolves the spec and loads resstream runs; Hugging Face models are read by
`hf_config` (config accepted), `hf_sizes` (fits in memory) and `hf_load` (tokenizer and
weights). The names other modules import from here stay importable from here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from resstream.checks import DEVICE_MAPS, check_load_names
from resstream.devices import device_label
from resstream.errors import UsageError
from resstream.hub import looks_like_path
from resstream.models.adapters.layout import context_of
from resstream.models.adapters.registry import view_of
from resstream.models.hf_config import (
    HF_CONFIG,
    checked_hf_config,
    config_source,
    hf_output,
    is_causal_config,
)
from resstream.models.hf_load import TOKENIZER_FILES, check_hf_tokenizer, load_hf
from resstream.models.hf_sizes import check_hf_sizes
from resstream.models.loaded import DTYPES, LoadedModel, ModelLike, ModelSpec, as_loaded, dtype_name, is_spec
from resstream.training.budget import check_model_fits
from resstream.training.records import MODEL_META

REFERENCE_NAME = "reference"  # `--model reference`: the built-in model (as does no --model)


def load_model(
    spec: ModelSpec,
    *,
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = None,
    trust_remote_code: bool = False,
    progress: bool = True,
    tokenizer: bool = True,
) -> LoadedModel:
    """Load `spec` (see the module docstring) in eval mode; UsageError for bad input.

    `progress=False` silences Hugging Face's weight-loading bar. `tokenizer=False` (an analysis
    that reads no text) loads a Hugging Face model without its tokenizer, and accepts a folder
    that has none; a resstream run loads its own either way.
    """
    check_load_names(dtype, device, device_map)
    device = device_label(device)
    where, name, source = _locate(spec)
    if source in ("reference", "resstream"):
        return _load_resstream(Path(where), name, source, dtype, device)
    with hf_output(progress=progress):
        return load_hf(where, name, source, dtype, device, device_map, trust_remote_code, tokenizer)


def check_model(
    spec: ModelSpec,
    *,
    trust_remote_code: bool = False,
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = None,
    tokenizer: bool = True,
) -> int | None:
    """Every refusal `load_model` would make before reading weights, without reading them;
    returns the model's context in tokens (None when its config states none). `tokenizer`:
    as `load_model`'s (False: the tokenizer files are not checked).

    Lets a command that analyses several models reject a bad one before working on the
    others: path, config (its sizes, and whether the weights they imply fit in memory with
    `dtype` on `device`), family, causal-LM head and tokenizer files are checked.
    """
    check_load_names(dtype, device, device_map)
    device = device_label(device)
    where, name, source = _locate(spec)
    if source in ("local", "hub"):
        config, local_only = checked_hf_config(where, name, source, trust_remote_code)
        check_hf_sizes(config, config_source(where, source), dtype, device, device_map)
        if tokenizer:
            check_hf_tokenizer(where, name, source, trust_remote_code, local_only)
        return context_of(config)
    from resstream.training.checkpoint import read_run

    _, config = read_run(where)
    check_model_fits(config.model, repr(str(Path(where) / MODEL_META)), device)
    return config.model.block_size


def _locate(spec: ModelSpec) -> tuple[str, str, str]:
    """(where to load from, display name, source) of a model spec; UsageError if impossible."""
    text = None if spec is None else str(spec).strip()
    if text is None or (text == REFERENCE_NAME and not Path(text).exists()):
        from resstream.assets import reference_model_dir

        return str(reference_model_dir()), REFERENCE_NAME, "reference"
    if not text:
        raise UsageError(
            "model '' is empty: give a model directory or a Hugging Face hub name, "
            "or leave it out for the built-in reference model"
        )
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UsageError(
                f"model path {text!r} is a file; allowed: a model directory (with "
                f"{HF_CONFIG} or resstream's {MODEL_META}) or a hub name"
            )
        if (path / MODEL_META).is_file():
            return str(path), text, "resstream"
        if not (path / HF_CONFIG).is_file():
            raise UsageError(
                f"model directory {text!r} has no {HF_CONFIG} (nor resstream's "
                f"{MODEL_META}); allowed: a Hugging Face model directory or a "
                f"resstream run directory"
            )
        return str(path), text, "local"
    if looks_like_path(text):
        raise UsageError(
            f"model path {text!r} does not exist; allowed: an existing model "
            f"directory or a Hugging Face hub name (e.g. 'gpt2')"
        )
    return text, text, "hub"


def _load_resstream(path: Path, name: str, source: str, dtype: str, device: str) -> LoadedModel:
    """A resstream run directory (or the built-in reference model) loaded onto `device`."""
    from resstream.training.checkpoint import load_run

    run = load_run(path, device=device)
    model = run.model
    torch_dtype = DTYPES[dtype] or torch.float32
    model.to(dtype=torch_dtype).eval()
    return LoadedModel(
        view=view_of(model),
        tokenizer=run.tokenizer,
        name=name,
        source=source,
        dtype=dtype_name(torch_dtype),
        device=device,
        where=str(path),
        run=run,
    )


__all__ = [
    "DEVICE_MAPS",
    "DTYPES",
    "HF_CONFIG",
    "REFERENCE_NAME",
    "TOKENIZER_FILES",
    "LoadedModel",
    "ModelLike",
    "ModelSpec",
    "as_loaded",
    "check_model",
    "is_causal_config",
    "is_spec",
    "load_model",
]
