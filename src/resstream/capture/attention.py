"""Attention probabilities of every layer and head, from the model's own forward.

`attention_probs(view, input_ids)` returns a (L, batch, heads, query, key) fp32 tensor. A
view that knows how to produce them (`ModelView.attention`, e.g. resstream's GPT, which runs
fused SDPA and recomputes the probabilities from each block's attention input) is asked
directly; any Hugging Face model runs its trunk under the eager attention implementation
(fused kernels do not return probabilities), switched on for the call and restored
afterwards, with a hook on every attention module taking the weights it returns.
`attention_rows` keeps only chosen query rows of each layer as it goes; `hooked_attention`
records them during a forward another caller runs (`capture.internals`: one forward for both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from resstream.capture.hooks import check_input_ids, run_forward
from resstream.models.adapters.base import ModelView


def attention_probs(view: ModelView, input_ids: Tensor) -> Tensor:
    """(L, batch, heads, query, key) attention probabilities of `input_ids` (batch, seq)."""
    return torch.stack(attention_rows(view, input_ids))


def attention_rows(view: ModelView, input_ids: Tensor, rows: Tensor | None = None) -> tuple[Tensor, ...]:
    """Per layer, the attention probabilities (batch, heads, len(rows), key) of the query
    positions `rows` (None: all), fp32 on the ids' device. Each layer's map is cut to those
    rows as soon as the layer has run, so a long text costs L·H·len(rows)·T floats, not
    L·H·T² (Hugging Face models: a hook on every attention module under the eager
    implementation, which returns its weights whether or not the model collects them)."""
    check_input_ids(view, input_ids)
    input_ids = input_ids.to(view.W_E.device)
    with torch.inference_mode():
        if view.attention is not None:
            return _checked(view, [row_cut(rows, input_ids.device)(p) for p in view.attention(input_ids)])
        with hooked_attention(view, rows, input_ids.device) as found:
            run_forward(view, input_ids)
    return found()


def row_cut(rows: Tensor | None, device: torch.device) -> Callable[[Tensor], Tensor]:
    """A layer's probabilities cut to the query `rows` (None: all), as fp32 on `device`."""

    def cut(probs: Tensor) -> Tensor:
        probs = probs if rows is None else probs[:, :, rows.to(probs.device), :]
        return probs.float().to(device)

    return cut


@contextmanager
def hooked_attention(
    view: ModelView, rows: Tensor | None, device: torch.device, layers: Sequence[int] | None = None
) -> Iterator[Callable[[], tuple[Tensor, ...]]]:
    """While open, a Hugging Face model runs its eager attention with a hook on every attention
    module (or those of `layers`) keeping its weights (its output's second element), cut to
    `rows` as they come; yields a function returning them per layer once a forward has run, in
    the order of `layers` (any other forward hooks — `capture.internals`, `stream.trace` —
    record the same forward)."""
    cut = row_cut(rows, device)
    found: dict[int, Tensor] = {}

    def hook_for(index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise RuntimeError(f"{view.family}: attention module {index} returned no weights")
            found[index] = cut(weights)

        return hook

    hooked = range(view.n_layers) if layers is None else layers
    handles = [view.blocks[i].attn.register_forward_hook(hook_for(i)) for i in hooked]

    def per_layer() -> tuple[Tensor, ...]:
        if layers is None:
            return _checked(view, [found[i] for i in sorted(found)])
        return tuple(found[i] for i in layers)

    try:
        with eager_attention(view.model):
            yield per_layer
    finally:
        for handle in handles:
            handle.remove()


def _checked(view: ModelView, per_layer: list[Tensor]) -> tuple[Tensor, ...]:
    """`per_layer` as a tuple; RuntimeError unless there is one map per layer."""
    if len(per_layer) != view.n_layers:
        raise RuntimeError(f"{view.family}: got {len(per_layer)} attention maps for {view.n_layers} layers")
    return tuple(per_layer)


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Run a Hugging Face model with its eager attention (which can return probabilities)."""
    config = getattr(model, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    set_implementation = getattr(model, "set_attn_implementation", None)  # Hugging Face models'
    if previous in (None, "eager") or set_implementation is None:
        yield
        return
    set_implementation("eager")
    try:
        yield
    finally:
        set_implementation(previous)
