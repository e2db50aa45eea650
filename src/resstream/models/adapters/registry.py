"""The adapter registry: one entry per model family, keyed by `config.model_type`.

A family module registers its adapter with `@register("model_type")`; `view_of(model)`
looks the model's family up by its `config.model_type` and returns its `ModelView`.
resstream's own `GPT` declares ``model_type = "resstream"`` on its config like any
Hugging Face model, so it needs no special case.

Helpers shared by the family modules (weights orientation, tied check, the default forward
that runs only the transformer trunk) live here too, so each family module stays a short
declaration of where its pieces are.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from resstream.errors import UsageError
from resstream.models.adapters.base import BlockView, ModelView

Adapter = Callable[[nn.Module], ModelView]

#: model_type -> adapter. Filled by the family modules when they are imported.
ADAPTERS: dict[str, Adapter] = {}

#: The modules that hold the built-in adapters (imported on first use).
BUILTIN_MODULES: tuple[str, ...] = ("resstream_gpt", "gpt2", "neox", "llama", "gemma")


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
        raise UsageError(f"unsupported {what}; supported families: {', '.join(families)}")
    return ADAPTERS[family](model)


# --------------------------------------------------------------------------- family helpers


def linear_W_O(proj: nn.Module, n_heads: int) -> Tensor:
    """W_O as (n_heads, d_head, d_model) from an `nn.Linear` (weight stored as (out, in))."""
    weight = proj.weight  # (d_model, n_heads * d_head)
    return weight.T.view(n_heads, weight.shape[1] // n_heads, weight.shape[0])


def conv1d_W_O(proj: nn.Module, n_heads: int) -> Tensor:
    """W_O from a GPT-2 style `Conv1D` (weight stored as (in, out): y = x @ W + b)."""
    weight = proj.weight  # (n_heads * d_head, d_model)
    return weight.view(n_heads, weight.shape[0] // n_heads, weight.shape[1])


def linear_weight(module: nn.Module) -> Tensor:
    """The (in, out) matrix W of an `nn.Linear` (y = x @ W + b; its weight is stored (out, in))."""
    return module.weight.T


def per_head(weight: Tensor, n_heads: int) -> Tensor:
    """(n_heads, d_model, d_head) from an (in=d_model, out=n_heads*d_head) matrix whose output
    columns are grouped by head, as every family lays them out."""
    d_model, width = weight.shape
    return weight.reshape(d_model, n_heads, width // n_heads).permute(1, 0, 2)


def per_head_bias(bias: Tensor | None, n_heads: int) -> Tensor | None:
    """(n_heads, d_head) from a bias laid out like `per_head`'s columns, or None."""
    return None if bias is None else bias.reshape(n_heads, -1)


def repeat_heads(tensor: Tensor | None, n_heads: int) -> Tensor | None:
    """Grouped-query attention: key/value heads (first dim) repeated for the query heads that
    share them (kv head j serves query heads j·g .. j·g+g−1, g = n_heads / n_kv_heads)."""
    if tensor is None or tensor.shape[0] == n_heads:
        return tensor
    return tensor.repeat_interleave(n_heads // tensor.shape[0], dim=0)


def bias_of(module: nn.Module | None) -> Tensor | None:
    """The module's `bias` parameter, or None."""
    bias = getattr(module, "bias", None)
    return bias if isinstance(bias, Tensor) else None


def same_tensor(a: Tensor, b: Tensor) -> bool:
    """Whether two parameters are one tensor (tied weights)."""
    if a is b:
        return True
    if a.shape != b.shape or a.device != b.device or a.device.type == "meta":
        return False
    return a.data_ptr() == b.data_ptr() and a.stride() == b.stride()


def unembedding(model: nn.Module) -> tuple[Tensor, Tensor | None]:
    """W_U (vocab, d_model) and its bias from a Hugging Face model's output embeddings."""
    head = model.get_output_embeddings()
    if head is None:
        raise UsageError(f"model {type(model).__name__!r} has no language-model head")
    return head.weight, bias_of(head)


def tie_notes(tied: bool, model: nn.Module | None = None) -> tuple[str, ...]:
    """The note that an untied model decodes with its own unembedding (named from `model`)."""
    if tied:
        return ()
    name = "lm_head"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        name = next((n for n, m in model.named_modules() if m is head), name)
    note = (
        f"untied embeddings: hidden states are decoded with the model's own unembedding "
        f"({name}.weight), not with the input embedding W_E"
    )
    return (note,)


def trunk_forward(trunk: nn.Module) -> Callable[[Tensor, Tensor | None], object]:
    """A forward that runs a Hugging Face base model (embeddings + blocks + final norm) and
    skips the LM head, whose logits residual-state capture does not need."""

    def forward(input_ids: Tensor, attention_mask: Tensor | None = None) -> object:
        return trunk(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)

    return forward


def hf_model_view(
    model: nn.Module,
    *,
    family: str,
    trunk: nn.Module,
    blocks: tuple[BlockView, ...],
    embed: Callable[[Tensor], Tensor],
    input_embedding: Tensor,
    final_norm: nn.Module,
    n_heads: int,
    d_model: int,
    max_positions: int | None,
    notes: tuple[str, ...] = (),
    **extra: Any,
) -> ModelView:
    """The `ModelView` of a Hugging Face causal LM from the pieces its family adapter found.

    What every Hugging Face family shares is done here: W_U and its bias from the model's LM
    head, whether W_U is the input embedding (and the note an untied model gets, before the
    family's own `notes`), and the trunk forward that skips the LM head. `extra` holds the
    rarer `ModelView` fields (soft-capping, embedding scale).
    """
    W_U, b_U = unembedding(model)
    tied = same_tensor(W_U, input_embedding)
    return ModelView(
        family=family,
        model=model,
        embed=embed,
        blocks=blocks,
        final_norm=final_norm,
        W_U=W_U,
        W_E=input_embedding,
        tied=tied,
        n_heads=n_heads,
        d_model=d_model,
        max_positions=max_positions,
        b_U=b_U,
        notes=(*tie_notes(tied, model), *notes),
        forward=trunk_forward(trunk),
        **extra,
    )


#: Where Hugging Face configs state the context (GPT-2: n_positions; the others:
#: max_position_embeddings), in the order they are read.
CONTEXT_FIELDS = ("n_positions", "max_position_embeddings")


def context_of(config: object) -> int | None:
    """The context in tokens a Hugging Face config states (the first of `CONTEXT_FIELDS`
    set to an int), or None."""
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def positions(input_ids: Tensor) -> Tensor:
    """Default position ids (1, seq) on the ids' device, as Hugging Face models build them."""
    return torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)


__all__ = ["ADAPTERS", "Adapter", "family_of", "register", "supported_families", "view_of"]
