"""Which torch device a name means: the one resolution every command and library call uses."""

from __future__ import annotations

import os

import torch

from resstream.checks import check_device_name
from resstream.errors import UsageError


def resolve_device(name: str | torch.device, *, local_rank: int | None = None) -> torch.device:
    """The device `name` means on this machine; UsageError naming `device` when it is unknown
    or absent.

    ``auto`` is this process's CUDA device when one is visible, else the CPU; a bare ``cuda``
    is ``cuda:<local_rank>`` (the GPU of this process under torchrun: `local_rank` None reads
    torchrun's LOCAL_RANK, 0 when run directly); ``cuda:N`` must exist; ``mps`` must be available.
    """
    text = check_device_name(str(name))
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(text)
    if device.type == "cuda":
        return _cuda(device, text, int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank)
    if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise UsageError(f"`device` {text!r} is not available on this machine; allowed here: auto, cpu")
    return device


def device_label(name: str | torch.device) -> str:
    """The device `name` means, as recorded in results and run.json: ``auto`` resolved to
    ``cuda`` or ``cpu``, any other name (checked by `resolve_device`) as it was given."""
    device = resolve_device(name)
    text = str(name).strip()
    return device.type if text == "auto" else text


def _cuda(device: torch.device, text: str, local_rank: int) -> torch.device:
    if not torch.cuda.is_available():
        raise UsageError(
            f"`device` {text!r} is not available: no CUDA GPU is visible; allowed here: auto, cpu"
        )
    index = local_rank if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise UsageError(
            f"`device` {text!r} does not exist: {torch.cuda.device_count()} CUDA device(s) visible"
        )
    return torch.device("cuda", index)
