"""Attention probabilities of every layer and head, from the model's own forward.

`attention_probs(view, input_ids)` returns a (L, batch, heads, query, key) fp32 tensor. A
view that knows how to produce them (`ModelView.attention`, e.g. resstream's GPT, which runs
fused SDPA and recomputes the probabilities from each block's attention input) is asked
directly; any Hugging Face model runs its trunk with ``output_attentions=True`` under the
eager attention implementation (fused kernels do not return probabilities), switched on for
the call and restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from resstream.capture.hooks import check_input_ids
from resstream.models.adapters.base import ModelView


def attention_probs(view: ModelView, input_ids: Tensor) -> Tensor:
    """(L, batch, heads, query, key) attention probabilities of `input_ids` (batch, seq)."""
    check_input_ids(view, input_ids)
    input_ids = input_ids.to(view.W_E.device)
    with torch.inference_mode():
        if view.attention is not None:
            per_layer = view.attention(input_ids)
        else:
            per_layer = _hf_attentions(view.model, input_ids)
    if len(per_layer) != view.n_layers or any(p is None for p in per_layer):
        raise RuntimeError(f"{view.family}: got {len(per_layer)} attention maps for {view.n_layers} layers")
    return torch.stack([p.float().to(input_ids.device) for p in per_layer])


def _hf_attentions(model: nn.Module, input_ids: Tensor) -> tuple[Tensor, ...]:
    with eager_attention(model):
        out = model(input_ids=input_ids, output_attentions=True, use_cache=False)
    return tuple(out.attentions)


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Run a Hugging Face model with its eager attention (which can return probabilities)."""
    config = getattr(model, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    switch = previous not in (None, "eager") and hasattr(model, "set_attn_implementation")
    if switch:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if switch:
            model.set_attn_implementation(previous)
