"""Loading a model for analysis: `load_model(spec)` -> `LoadedModel` (view + tokenizer).

A model already in memory (a Hugging Face `PreTrainedModel`, resstream's `GPT`, or a
`ModelView`) becomes a `LoadedModel` with `as_loaded(model, tokenizer)`.

`spec` is resolved in this order:

* ``None`` or ``"reference"``: the built-in reference model shipped with resstream (offline,
  always present);
* a directory holding resstream's ``model.json``: a finished resstream training run;
* a directory holding ``config.json``: a local Hugging Face model (with its tokenizer);
* anything else that does not look like a path: a Hugging Face hub name (online users; with
  ``HF_HUB_OFFLINE=1`` or no route to the hub only the local cache is consulted, so an
  uncached name fails at once).

Every refusal is a one-line `UsageError` naming the value and what is allowed: a path that
does not exist or has no config, a model that is not a causal LM, an unsupported family, a
missing tokenizer, an unknown dtype or device. ``trust_remote_code`` is off unless asked for:
without it a model whose config.json, or whose tokenizer's tokenizer_config.json, has an
``auto_map`` naming code it needs is refused, and no code from its folder is run.

``dtype="auto"`` is float32 on the CPU; on a GPU it is the dtype the checkpoint was saved in
(resstream's own models: float32). ``device="auto"`` picks CUDA when it is available.
``device_map`` (e.g. ``"auto"``) is passed to Hugging Face for models larger than one device
and needs the `accelerate` package; resstream's own models always load onto `device`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from resstream.devices import device_label
from resstream.errors import UsageError, check_choice, short_reason
from resstream.hub import looks_like_path, offline_reason
from resstream.models.adapters.base import ModelView
from resstream.models.adapters.registry import context_of, same_tensor, supported_families, view_of
from resstream.resources import check_fits
from resstream.training.budget import Cost, check_model_fits, largest, named_drivers
from resstream.training.records import MODEL_META

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
REFERENCE_NAME = "reference"  # `--model reference`: the built-in model (as does no --model)
HF_CONFIG = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for analysis: its view, tokenizer, a display name and where it came from.

    `source` is "reference" (the built-in model), "resstream" (a resstream run directory),
    "local" (a Hugging Face directory), "hub" (a Hugging Face hub name) or "memory" (a model
    object handed to `as_loaded`).
    """

    view: ModelView
    tokenizer: PreTrainedTokenizerBase | None  # None only for an analysis that reads weights alone
    name: str
    source: str
    dtype: str = "float32"
    device: str = "cpu"
    where: str | None = None  # the directory or hub name it was loaded from (None: from memory)
    run: Any = None  # a resstream run's `TrainedModel` (config, tokenizer, metadata); else None

    @property
    def model(self) -> nn.Module:
        """The underlying model."""
        return self.view.model


#: What an analysis accepts as a model: a spec string (or path, or None for the reference
#: model) to load, or a model already in memory (with its tokenizer, see `as_loaded`).
ModelSpec = str | os.PathLike[str] | None
ModelLike = ModelSpec | nn.Module | ModelView | LoadedModel


def is_spec(model: ModelLike) -> bool:
    """Whether `model` names a model to load rather than being one."""
    return model is None or isinstance(model, (str, os.PathLike))


def as_loaded(
    model: nn.Module | ModelView | LoadedModel,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    name: str | None = None,
    needs_tokenizer: bool = True,
) -> LoadedModel:
    """A model already in memory, ready for analysis like a loaded one.

    `model` is a Hugging Face causal LM (`PreTrainedModel`), resstream's `GPT`, any model
    of a supported family, or its `ModelView`; `tokenizer` the tokenizer it reads (required,
    since a model object does not carry one). A `LoadedModel` is returned as it is. `name`
    labels results (default: the model's `name_or_path`, else its class name). The model is
    used where it is, on its device, in its dtype. An analysis that reads only the weights
    (head composition) passes `needs_tokenizer=False` and may then get no tokenizer.
    """
    if isinstance(model, LoadedModel):
        return model
    if not isinstance(model, (nn.Module, ModelView)):
        raise UsageError(
            f"`models` holds a {type(model).__name__}; allowed: a model spec (run directory, "
            f"Hugging Face directory or hub name, 'reference'), a loaded model or its ModelView"
        )
    view = model if isinstance(model, ModelView) else view_of(model)
    if tokenizer is None and needs_tokenizer:
        raise UsageError(
            f"a model passed as an object ({type(view.model).__name__}) needs its `tokenizer`; "
            f"pass tokenizer=..., or load it by spec"
        )
    label = (
        name or getattr(getattr(view.model, "config", None), "name_or_path", "") or type(view.model).__name__
    )
    return LoadedModel(
        view=view,
        tokenizer=tokenizer,
        name=str(label),
        source="memory",
        dtype=_dtype_name(view.W_U.dtype),
        device=str(view.W_E.device),
    )


def load_model(
    spec: ModelSpec,
    *,
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = None,
    trust_remote_code: bool = False,
    progress: bool = True,
) -> LoadedModel:
    """Load `spec` (see the module docstring) in eval mode; UsageError for bad input.

    `progress=False` silences Hugging Face's weight-loading bar.
    """
    check_choice("dtype", dtype, DTYPES)
    device = device_label(device)
    if device_map is not None:
        check_choice("device_map", device_map, DEVICE_MAPS)
    where, name, source = _locate(spec)
    if source in ("reference", "resstream"):
        return _load_resstream(Path(where), name, source, dtype, device)
    with _hf_output(progress=progress):
        return _load_hf(where, name, source, dtype, device, device_map, trust_remote_code)


@contextmanager
def _hf_output(*, progress: bool = True) -> Iterator[None]:
    """Hugging Face's logging kept to errors for the block (its multi-line load reports and
    config warnings would come before our one-line message), and its progress bars off
    unless `progress`; both restored afterwards."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    if bars and not progress:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars and not progress:
            hf_logging.enable_progress_bar()


def check_model(
    spec: ModelSpec,
    *,
    trust_remote_code: bool = False,
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = None,
) -> int | None:
    """Every refusal `load_model` would make before reading weights, without reading them;
    returns the model's context in tokens (None when its config states none).

    Lets a command that analyses several models reject a bad one before working on the
    others: path, config (its sizes, and whether the weights they imply fit in memory with
    `dtype` on `device`), family, causal-LM head and tokenizer files are checked.
    """
    check_choice("dtype", dtype, DTYPES)
    device = device_label(device)
    where, name, source = _locate(spec)
    if source in ("local", "hub"):
        config, local_only = _checked_hf_config(where, name, source, trust_remote_code)
        _check_hf_sizes(config, _config_source(where, source), dtype, device, device_map)
        if source == "local":
            _check_tokenizer_files(where, name)
        _check_tokenizer_code(where, name, trust_remote_code, local_only)
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


# --------------------------------------------------------------------------- resstream runs


def _load_resstream(path: Path, name: str, source: str, dtype: str, device: str) -> LoadedModel:
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
        dtype=_dtype_name(torch_dtype),
        device=device,
        where=str(path),
        run=run,
    )


# --------------------------------------------------------------------------- Hugging Face


def _load_hf(
    where: str,
    name: str,
    source: str,
    dtype: str,
    device: str,
    device_map: str | None,
    trust_remote_code: bool,
) -> LoadedModel:
    from resstream.training.checkpoint import check_finite_weights, check_readable

    config, local_only = _checked_hf_config(where, name, source, trust_remote_code)
    _check_hf_sizes(config, _config_source(where, source), dtype, device, device_map)
    tokenizer = _load_hf_tokenizer(where, name, source, trust_remote_code, local_only)
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
        dtype=_dtype_name(view.W_U.dtype),
        device=device if device_map is None else f"device_map={device_map}",
        where=where,
    )


def _checked_hf_config(where: str, name: str, source: str, trust_remote_code: bool) -> tuple[Any, bool]:
    """The config of a supported causal LM, and whether only the local cache may be used."""
    local_only = False
    if source == "hub":
        local_only = offline_reason() is not None
    config = _load_config(where, name, source, local_only, trust_remote_code)
    family = getattr(config, "model_type", None) or "?"
    families = supported_families()
    if family not in families:
        if not is_causal_config(config):
            raise UsageError(
                f"model {name!r} is not a causal LM (model_type {family!r}, "
                f"architectures {_archs(config)}); resstream analyses decoder-only "
                f"causal language models: {', '.join(families)}"
            )
        raise UsageError(
            f"model {name!r} has unsupported family {family!r}; supported families: {', '.join(families)}"
        )
    if not is_causal_config(config):
        raise UsageError(
            f"model {name!r} is not a causal LM (architectures {_archs(config)}); "
            f"allowed: a checkpoint with a language-model head "
            f"(*ForCausalLM / *LMHeadModel)"
        )
    return config, local_only


#: Memory of one Hugging Face decoder layer beyond its tensors (module objects), measured on
#: the meta device: 7 KB (Llama) to 38 KB (GPT-2); the smaller, so no real model is refused.
HF_LAYER_OVERHEAD_BYTES = 7_000
#: Families whose position embeddings are a learned (positions × width) table.
LEARNED_POSITION_FAMILIES = ("gpt2",)
#: Size fields every config must hold, by their standard names (a family's own spelling, such
#: as GPT-2's n_layer for num_hidden_layers, comes from the config's attribute_map).
_HF_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
#: Size fields a config may leave out (None): they then take their family's default.
_HF_OPTIONAL_SIZES = (
    "intermediate_size",
    "n_inner",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


def _config_source(where: str, source: str) -> str:
    """How messages name the config file of a model: its path, or hub name/config.json."""
    path = Path(where) / HF_CONFIG if source == "local" else f"{where}/{HF_CONFIG}"
    return repr(str(path))


def _hf_sizes(config: Any, source: str) -> dict[str, tuple[str, int]]:
    """Standard name -> (the file's key, value) of every size the config gives; UsageError
    for one that is not a positive integer."""
    sizes = {}
    for field in _HF_SIZES + _HF_OPTIONAL_SIZES:
        key = getattr(config, "attribute_map", {}).get(field, field)
        value = getattr(config, field, None)
        if value is None and field in _HF_OPTIONAL_SIZES:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{source} has {key} {value!r}; allowed: an integer >= 1")
        sizes[field] = (key, value)
    return sizes


def _hf_parameter_costs(config: Any, sizes: dict[str, tuple[str, int]]) -> list[Cost]:
    """Parameters of a Hugging Face causal LM per part (layers, embeddings, positions), each
    with the config keys that drive it: a lower bound computed from the config's `sizes`
    alone (q, k, v, o projections and a two-matrix MLP per layer, no norms or biases), so
    that a refusal never blocks a real model."""
    (layers_key, layers), (width_key, d) = sizes["num_hidden_layers"], sizes["hidden_size"]
    heads = sizes["num_attention_heads"][1]
    head_dim = sizes.get("head_dim", (None, d // heads or 1))[1]
    kv_heads = sizes.get("num_key_value_heads", (None, heads))[1]
    mlp_size = sizes.get("intermediate_size") or sizes.get("n_inner")  # default: 4 × width
    mlp = mlp_size[1] if mlp_size else 4 * d
    attention = 2 * d * head_dim * (heads + kv_heads)
    vocab_key, vocab = sizes["vocab_size"]
    tied = bool(getattr(config, "tie_word_embeddings", True))
    positions = sizes.get("max_position_embeddings")
    learned = positions is not None and getattr(config, "model_type", None) in LEARNED_POSITION_FAMILIES
    width = (width_key, d)
    return [
        Cost(
            layers * (attention + 2 * d * mlp),
            ((layers_key, layers), width, *([mlp_size] if mlp_size else [])),
        ),
        Cost(vocab * d * (1 if tied else 2), ((vocab_key, vocab), width)),
        Cost(positions[1] * d if learned else 0, (positions, width) if learned else ()),
    ]


def _param_dtype(config: Any, dtype: str, device: str, device_map: str | None) -> torch.dtype:
    """The dtype the weights are loaded in (`_load_hf_model`): the one asked for; with
    "auto", float32 on the CPU, else the checkpoint's own (bfloat16 when it names none)."""
    if DTYPES[dtype] is not None:
        return DTYPES[dtype]
    if device_map is None and device.startswith("cpu"):
        return torch.float32
    # transformers 4.x stores `torch_dtype`; 5.x `dtype`, where reading `torch_dtype` warns
    saved = getattr(config, "dtype", None) or vars(config).get("torch_dtype")
    saved = getattr(torch, saved, None) if isinstance(saved, str) else saved
    return saved if isinstance(saved, torch.dtype) else torch.bfloat16


def _check_hf_sizes(config: Any, source: str, dtype: str, device: str, device_map: str | None) -> None:
    """Refuse a config whose sizes are not positive integers, or whose weights cannot fit:
    on the host, where from_pretrained reads them (with every layer's module objects), and
    on a CUDA `device` they are then moved to. With a `device_map` only the layers' objects
    are judged (the weights are spread over devices and the host)."""
    sizes = _hf_sizes(config, source)
    costs = _hf_parameter_costs(config, sizes)
    torch_dtype = _param_dtype(config, dtype, device, device_map)
    weights = sum(cost.amount for cost in costs) * torch_dtype.itemsize
    objects = sizes["num_hidden_layers"][1] * HF_LAYER_OVERHEAD_BYTES
    what = f"{source} with {named_drivers(largest(costs), marked=False)}"
    purpose = f"for the weights ({_dtype_name(torch_dtype)})"
    check_fits(what, objects + (weights if device_map is None else 0), "cpu", purpose=purpose)
    if device_map is None and device.startswith("cuda"):
        check_fits(what, weights, device, purpose=purpose)


def is_causal_config(config: Any) -> bool:
    """Whether a Hugging Face config describes a causal (decoder-only) LM.

    Its `architectures` decide when present (a causal-LM head, or a bare trunk of a family
    that has one); otherwise the family must have a causal-LM class, and encoder families
    (BERT, RoBERTa, ...) count only when configured as decoders.
    """
    if getattr(config, "is_encoder_decoder", False):
        return False
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None)
    encoder_family = model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    archs = list(getattr(config, "architectures", None) or [])
    if archs:
        if any(a.endswith(_CAUSAL_SUFFIXES) for a in archs):
            return not encoder_family or bool(getattr(config, "is_decoder", False))
        bare_trunk = any(a.endswith("Model") and "For" not in a for a in archs)
        return bare_trunk and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not encoder_family
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return False
    return not encoder_family or bool(getattr(config, "is_decoder", False))


def _load_config(where: str, name: str, source: str, local_only: bool, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    try:
        with _hf_output():
            return AutoConfig.from_pretrained(
                where, trust_remote_code=trust_remote_code, local_files_only=local_only
            )
    except Exception as exc:
        raise _hf_error(exc, name, source, local_only, "config") from None


def _load_hf_tokenizer(
    where: str, name: str, source: str, trust_remote_code: bool, local_only: bool
) -> PreTrainedTokenizerBase:
    from resstream.data import load_tokenizer

    if source == "local":
        _check_tokenizer_files(where, name)
    _check_tokenizer_code(where, name, trust_remote_code, local_only)
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
    torch_dtype: Any = DTYPES[dtype]
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
        model, info = AutoModelForCausalLM.from_pretrained(
            where, config=config, output_loading_info=True, **kwargs
        )
    except Exception as exc:
        raise _hf_error(
            exc, name, "local" if Path(where).is_dir() else "hub", local_only, "weights"
        ) from None
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


def _hf_error(
    exc: BaseException,
    name: str,
    source: str,
    local_only: bool,
    what: str,
) -> UsageError:
    short = short_reason(exc)
    if "trust_remote_code" in str(exc):
        return UsageError(
            f"model {name!r} needs custom code from its repository; allowed only "
            f"with `trust_remote_code=True`, if you trust it"
        )
    if source == "hub":
        reason = short
        if local_only:
            reason = f"{offline_reason()}; not in the local Hugging Face cache either"
        return UsageError(
            f"model {name!r} not found: not a local directory, and the Hugging "
            f"Face hub could not provide its {what} ({reason})"
        )
    return UsageError(f"model directory {name!r}: cannot load its {what} ({short})")


def _archs(config: Any) -> str:
    archs = getattr(config, "architectures", None)
    return ", ".join(archs) if archs else "none given"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


__all__ = [
    "DTYPES",
    "LoadedModel",
    "ModelLike",
    "ModelSpec",
    "as_loaded",
    "check_model",
    "is_causal_config",
    "is_spec",
    "load_model",
]
