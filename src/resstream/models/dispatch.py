"""A model that Hugging Face accelerate spread over devices (`device_map`), read block by block.

accelerate runs each block on its own execution device; a block whose weights are offloaded
(to the CPU or to disk: `device_map` entries "cpu"/"disk" with an offload folder) holds them on
the meta device and loads them only for the length of each of its forwards. The analyses that
read a block's weights after the forward (attribution, decomposition, neurons, composition)
need them real: `weights_resident(model)` loads every offloaded weight once onto its block's
execution device and pauses the offload (the hooks still move each block's inputs to its
device) until the block ends, when the weights go back to the meta device; it refuses first,
in one line, weights that do not fit that device's memory. A model that was not dispatched is
left as it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from resstream.resources import check_fits


def offloading_hooks(
    model: nn.Module, among: Sequence[nn.Module] | None = None
) -> list[tuple[nn.Module, Any]]:
    """(module, its accelerate hook) for every module whose weights accelerate offloads; with
    `among`, only the hooks that hold the weights of those modules (on them, above or below)."""
    found = []
    for module in model.modules():
        hook = getattr(module, "_hf_hook", None)
        offloads = hook is not None and getattr(hook, "offload", False) and hasattr(hook, "weights_map")
        if offloads and (among is None or any(_related(module, target) for target in among)):
            found.append((module, hook))
    return found


def _related(module: nn.Module, target: nn.Module) -> bool:
    return any(m is target for m in module.modules()) or any(m is module for m in target.modules())


def offloaded_bytes(model: nn.Module, among: Sequence[nn.Module] | None = None) -> dict[torch.device, int]:
    """Bytes of the weights accelerate offloads (of the modules `among`, if given), by the
    device each is loaded onto to run (read from their meta tensors: nothing is loaded)."""
    need: dict[torch.device, int] = {}
    for module, hook in offloading_hooks(model, among):
        device = torch.device(hook.execution_device)
        tensors: list[torch.Tensor] = [*module.parameters(recurse=hook.place_submodules)]
        if hook.offload_buffers:
            tensors += module.buffers(recurse=hook.place_submodules)
        size = sum(t.numel() * t.element_size() for t in tensors if t.device.type == "meta")
        need[device] = need.get(device, 0) + size
    return need


@contextmanager
def weights_resident(model: nn.Module, among: Sequence[nn.Module] | None = None) -> Iterator[bool]:
    """Every offloaded weight of `model` (of the modules `among`, if given: e.g. only the
    embedding and the read-out, for an analysis that reads no block's weights) loaded onto its
    module's execution device for the block, the offload paused meanwhile (module docstring);
    yields whether any was offloaded. UsageError, before anything is loaded, when they do not
    fit the memory of that device."""
    for device, need in offloaded_bytes(model, among).items():
        check_fits(
            "a `device_map` that offloads weights",
            need,
            device,
            purpose="to load them for an analysis that reads them",
            remedy="use `device_map` None with a `device` that holds the model, or a smaller `dtype`",
        )
    loaded: list[tuple[nn.Module, Any]] = []
    try:
        for module, hook in offloading_hooks(model, among):
            hook.pre_forward(module)  # loads the module's weights onto hook.execution_device
            hook.offload = False
            loaded.append((module, hook))
        yield bool(loaded)
    finally:
        for module, hook in reversed(loaded):
            hook.offload = True
            hook.post_forward(module, None)  # back to the meta device


__all__ = ["offloaded_bytes", "offloading_hooks", "weights_resident"]
