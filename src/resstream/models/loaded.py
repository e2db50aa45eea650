"""What analyses receive as a model: a `LoadedModel` (view + tokenizer + where it came from).

`load_model` (module `loading`) builds one from a spec; `as_loaded(model, tokenizer)` wraps a
model already in memory (a Hugging Face `PreTrainedModel`, resstream's `GPT`, or a
`ModelView`) the same way. `ModelSpec` / `ModelLike` name what an analysis accepts as a
model, and `DTYPES` the dtypes a model may be loaded in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, TypeGuard

import torch
from torch import nn

from resstream.checks import DTYPE_NAMES
from resstream.errors import UsageError
from resstream.models.adapters.base import ModelView
from resstream.models.adapters.registry import view_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: The `dtype` choices of `load_model`: "auto" (None) picks per device (see `loading`).
DTYPES: dict[str, torch.dtype | None] = dict(
    zip(DTYPE_NAMES, (None, torch.float32, torch.bfloat16, torch.float16), strict=True)
)


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


class LoadArgs(TypedDict, total=False):
    """How a model given as a spec string is loaded, as keywords (`load_model`'s, and every API
    function's): ``dtype`` ("auto", "float32", "bfloat16", "float16"),
    ``device`` ("auto", "cpu", "cuda", "cuda:N"), ``device_map`` (spread a Hugging Face model
    over devices: "auto", "balanced", "sequential"; needs accelerate) and
    ``trust_remote_code`` (run a hub model's own code). Defaults: `load_model`'s."""

    dtype: str
    device: str
    device_map: str | None
    trust_remote_code: bool


def is_spec(model: ModelLike) -> TypeGuard[ModelSpec]:
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
        dtype=dtype_name(view.W_U.dtype),
        device=str(view.W_E.device),
    )


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as options and records spell it: "float32", "bfloat16", ..."""
    return str(dtype).removeprefix("torch.")


__all__ = [
    "DTYPES",
    "LoadArgs",
    "LoadedModel",
    "ModelLike",
    "ModelSpec",
    "as_loaded",
    "dtype_name",
    "is_spec",
]
