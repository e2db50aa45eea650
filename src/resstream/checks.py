"""Checks of values that need no model, no corpus and no heavy library.

The analyses call them before they load anything; the command line calls them before it imports
torch (`resstream.cli.options`), so that a bad value is refused in a fraction of a second. This
module imports nothing but `resstream.errors`: keep it that way.

* `check_sample_request`: the number of sequences and their length;
* `check_batch_size`: sequences per forward pass; `check_positive` a count, `check_learning_rate`
  a learning rate;
* `check_load_names`: the names a model is loaded with (`dtype`, `device`, `device_map`);
  `check_device_name` the device's alone (whether it exists is `resstream.devices`' question).
"""

from __future__ import annotations

import math
import re

from resstream.errors import UsageError, check_choice

#: The `dtype` names a model may be loaded in ("auto": per device; `resstream.models.DTYPES`).
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
#: The `device_map` names accelerate spreads a model with.
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
#: The device names, in words.
DEVICES_ALLOWED = "auto, cpu, cuda, cuda:N, mps"
_DEVICE_NAME = re.compile(r"auto|(?:cpu|cuda|mps)(?::\d+)?")


def check_sample_request(num_seqs: int | None, seq_len: int | None) -> None:
    """UsageError for a sample no corpus can give: fewer than one sequence, or sequences
    shorter than two tokens (one input and the next); None (left to the default) passes."""
    if num_seqs is not None and num_seqs < 1:
        raise UsageError(f"`num_seqs` {num_seqs} must be >= 1")
    if seq_len is not None and seq_len < 2:
        raise UsageError(f"`seq_len` {seq_len} is too short: at least 2 tokens are needed")


def check_batch_size(batch_size: int) -> None:
    """`batch_size` must be >= 1."""
    if batch_size < 1:
        raise UsageError(f"`batch_size` {batch_size} must be >= 1")


def check_positive(name: str, value: int) -> None:
    """UsageError unless `value` (of parameter `name`) is an integer ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"`{name}` {value!r} is not allowed; allowed: an integer >= 1")


def check_learning_rate(name: str, value: float) -> None:
    """UsageError unless `value` (of parameter `name`) is a finite number > 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UsageError(f"`{name}` {value!r} is not allowed; allowed: a finite number > 0")


def check_device_name(name: str) -> str:
    """`name` stripped, when it names a kind of device resstream runs on (``auto``, ``cpu``,
    ``cuda``, ``cuda:N``, ``mps``); UsageError naming `device` otherwise."""
    text = str(name).strip()
    if not _DEVICE_NAME.fullmatch(text):
        raise UsageError(f"unknown `device` {text!r}; allowed: {DEVICES_ALLOWED}")
    return text


def check_load_names(dtype: str | None, device: str, device_map: str | None = None) -> None:
    """UsageError for a `dtype`, `device` or `device_map` that names nothing a model can be
    loaded with (None: not given, or checked by the caller)."""
    if dtype is not None:
        check_choice("`dtype`", dtype, DTYPE_NAMES)
    check_device_name(device)
    if device_map is not None:
        check_choice("`device_map`", device_map, DEVICE_MAPS)
