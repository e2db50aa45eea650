"""The adapter registry: one entry per model family, keyed by `config.model_type`.

A family module registers its adapter with `@register("model_type")`; `view_of(model)`
looks the model's family up by its `config.model_type` and returns its `ModelView`.
resstream's own `GPT` declares ``model_type = "resstream"`` on its config like any
Hugging Face model, so it needs no special case.

What the family modules share lives beside it: reading weights in the view's orientation
(`weights`) and building a view from where a family keeps its pieces (`layout`), so each
family module stays a short declaration of where its pieces are.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import nn

from resstream.errors import UsageError
from resstream.models.adapters.base import ModelView
from resstream.models.adapters.layout import context_of  # also read from here (models/evaluation.py)

Adapter = Callable[[nn.Module], ModelView]

#: model_type -> adapter. Filled by the family modules when they are imported.
ADAPTERS: dict[str, Adapter] = {}

#: The modules that hold the built-in adapters (imported on first use).
BUILTIN_MODULES: tuple[str, ...] = (
    "resstream_gpt",
    "gpt2",
    "neox",
    "llama",
    "gemma",
    "qwen3",
    "olmo",
    "phi",
    "falcon",
    "cohere",
    "granite",
    "moe",
)


_loaded = False


def register(model_type: str) -> Callable[[Adapter], Adapter]:
    """Decorator: register `adapter` as the view builder for models of `model_type`."""

    def decorate(adapter: Adapter) -> Adapter:
        ADAPTERS[model_type] = adapter
        return adapter

    return decorate


def _load_builtin() -> None:
    global _loaded
    if not _loaded:
        for name in BUILTIN_MODULES:
            importlib.import_module(f"resstream.models.adapters.{name}")
        _loaded = True


def supported_families() -> list[str]:
    """The registered model types, sorted."""
    _load_builtin()
    return sorted(ADAPTERS)


def family_of(model: nn.Module) -> str | None:
    """The registry key of `model`: its `config.model_type` (None when it declares none)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return model_type if isinstance(model_type, str) and model_type else None


def view_of(model: nn.Module) -> ModelView:
    """The `ModelView` of `model`; UsageError naming the supported families when there is none."""
    family = family_of(model)
    families = supported_families()
    if family is None or family not in ADAPTERS:
        what = f"model family {family!r}" if family else f"model type {type(model).__name__!r}"
        raise UsageError(
            f"unsupported {what}; supported families: {', '.join(families)} "
            "(to add one, see docs/adding-a-model.md)"
        )
    return ADAPTERS[family](model)


__all__ = ["ADAPTERS", "Adapter", "context_of", "family_of", "register", "supported_families", "view_of"]
