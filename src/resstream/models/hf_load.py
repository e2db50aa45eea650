"""Loading a Hugging Face causal LM for analysis: its tokenizer and its weights, checked.

`load_hf(where, ...)` reads a model that `loading` located (a local directory or a hub name):
its config is accepted first (`hf_config`, `hf_sizes`), then its tokenizer (refused when its
files are missing, or when it needs its own code without ``trust_remote_code``), then its
weights, refused when they lack the language-model head or any tensor the config asks for
(Hugging Face would initialise those at random) or hold non-finite values.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from resstream.errors import UsageError
from resstream.models.adapters.base import DynamicModule
from resstream.models.adapters.registry import view_of
from resstream.models.adapters.weights import same_tensor
from resstream.models.hf_config import HF_CONFIG, checked_hf_config, config_source, hf_error
from resstream.models.hf_sizes import check_hf_sizes
from resstream.models.loaded import DTYPES, LoadedModel, dtype_name

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def load_hf(
    where: str,
    name: str,
    source: str,
    dtype: str,
    device: str,
    device_map: str | None,
    trust_remote_code: bool,
    with_tokenizer: bool = True,
) -> LoadedModel:
    """The checked `LoadedModel` of the Hugging Face model at `where` (`source` "local" or
    "hub"); the arguments are `loading.load_model`'s (`with_tokenizer` its `tokenizer`)."""
    from resstream.training.checkpoint import check_finite_weights, check_readable

    config, local_only = checked_hf_config(where, name, source, trust_remote_code)
    check_hf_sizes(config, config_source(where, source), dtype, device, device_map)
    tokenizer = (
        _load_hf_tokenizer(where, name, source, trust_remote_code, local_only) if with_tokenizer else None
    )
    if source == "local":
        check_readable(where)
    model = _load_hf_model(where, name, config, dtype, device, device_map, local_only, trust_remote_code)
    check_finite_weights([*model.named_parameters(), *model.named_buffers()], name)
    view = view_of(model)
    return LoadedModel(
        view=view,
        tokenizer=tokenizer,
        name=name,
        source=source,
        dtype=dtype_name(view.W_U.dtype),
        device=device if device_map is None else f"device_map={device_map}",
        where=where,
    )


def check_hf_tokenizer(where: str, name: str, source: str, trust_remote_code: bool, local_only: bool) -> None:
    """Refuse a tokenizer `load_hf` would refuse, without loading it: a local directory with
    no tokenizer files, or a tokenizer that needs its own code without `trust_remote_code`."""
    if source == "local":
        _check_tokenizer_files(where, name)
    _check_tokenizer_code(where, name, trust_remote_code, local_only)


def _load_hf_tokenizer(
    where: str, name: str, source: str, trust_remote_code: bool, local_only: bool
) -> PreTrainedTokenizerBase:
    from resstream.data import load_tokenizer

    check_hf_tokenizer(where, name, source, trust_remote_code, local_only)
    try:
        return load_tokenizer(where, trust_remote_code=trust_remote_code)
    except UsageError as exc:
        raise UsageError(f"model {name!r} has no usable tokenizer: {exc}") from None


def _check_tokenizer_code(where: str, name: str, trust_remote_code: bool, local_only: bool) -> None:
    """Refuse a tokenizer that needs its own code (an auto_map in its tokenizer_config.json)
    unless `trust_remote_code`, reading that JSON file only (nothing is imported)."""
    from resstream.data.tokenizer_code import check_tokenizer_code

    check_tokenizer_code(where, f"the tokenizer of model {name!r}", trust_remote_code, local_only=local_only)


def _check_tokenizer_files(where: str, name: str) -> None:
    if not any((Path(where) / f).is_file() for f in TOKENIZER_FILES):
        raise UsageError(
            f"model directory {name!r} has no tokenizer (none of "
            f"{', '.join(TOKENIZER_FILES)}); allowed: a directory holding the model "
            f"and its tokenizer (save both with save_pretrained)"
        )


def _load_hf_model(
    where: str,
    name: str,
    config: Any,
    dtype: str,
    device: str,
    device_map: str | None,
    local_only: bool,
    trust_remote_code: bool,
) -> nn.Module:
    from transformers import AutoModelForCausalLM

    if device_map is not None and importlib.util.find_spec("accelerate") is None:
        raise UsageError(
            f"device_map={device_map!r} needs the 'accelerate' package "
            f"(pip install accelerate); allowed without it: device_map=None"
        )
    torch_dtype: torch.dtype | str | None = DTYPES[dtype]
    if torch_dtype is None:
        on_gpu = device_map is not None or not device.startswith("cpu")
        torch_dtype = "auto" if on_gpu else torch.float32
    kwargs: dict[str, Any] = {
        "dtype": torch_dtype,
        "trust_remote_code": trust_remote_code,
        "local_files_only": local_only,
    }
    if device_map is not None:
        kwargs["device_map"] = device_map
    try:
        # from_pretrained's annotation leaves out that output_loading_info=True makes it return
        # (model, loading info); the model is a `DynamicModule` (its submodules have no types)
        model, info = cast(
            "tuple[DynamicModule, dict[str, list[str]]]",
            AutoModelForCausalLM.from_pretrained(where, config=config, output_loading_info=True, **kwargs),
        )
    except Exception as exc:
        raise hf_error(exc, name, "local" if Path(where).is_dir() else "hub", local_only, "weights") from None
    missing = sorted((info or {}).get("missing_keys", []))
    heads = [k for k in missing if "lm_head" in k or "embed_out" in k]
    head = model.get_output_embeddings()
    tied = head is not None and same_tensor(head.weight, model.get_input_embeddings().weight)
    if heads and not tied:
        raise UsageError(
            f"model {name!r} has no trained language-model head ({heads[0]} is "
            f"missing from its weights); allowed: a causal-LM checkpoint"
        )
    _check_no_missing_weights([k for k in missing if k not in heads], name)
    if device_map is None:
        model.to(device)
    return model.eval()


def _check_no_missing_weights(missing: list[str], name: str) -> None:
    """Refuse weights that lack tensors the config asks for (more layers in config.json than
    were saved, say), which Hugging Face would otherwise initialise at random."""
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise UsageError(
            f"model {name!r}: its weights lack {missing[0]}{more} that its {HF_CONFIG} asks for; "
            f"allowed: weights that match the config (missing ones would be random)"
        )


__all__ = ["TOKENIZER_FILES", "check_hf_tokenizer", "load_hf"]
