"""Checks of values that need no model, no corpus and no heavy library.

The analyses call them before they load anything; the command line calls them before it imports
torch (`resstream.cli.options`), so that a bad value is refused in a fraction of a second. This
module imports nothing but `resstream.errors`: keep it that way.

* `check_sample_request`: the number of sequences and their length;
* `check_batch_size`: sequences per forward pass; `check_integer` a whole number in a range,
  `check_positive` a count, `check_learning_rate` a learning rate, `check_fraction` a number
  strictly between 0 and 1, `check_max_tokens` an evaluation's cap on tokens;
* `check_load_names`: the names a model is loaded with (`dtype`, `device`, `device_map`);
  `check_device_name` the device's alone (whether it exists is `resstream.devices`' question);
  `verify_dtype` the dtypes verify has tolerances for;
* `check_one_text`: one text given (`text` or `text_file`); `decoder_kind`: a decoder's name.
"""

from __future__ import annotations

import math
import re

from resstream.errors import UsageError, check_choice, closest

#: The `dtype` names a model may be loaded in ("auto": per device; `resstream.models.DTYPES`).
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
#: The `device_map` names accelerate spreads a model with.
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
#: The `dtype` names `resstream.verify` has tolerances for ("auto" loads in float32).
VERIFY_DTYPES = ("float32", "bfloat16")
#: The device names, in words.
DEVICES_ALLOWED = "auto, cpu, cuda, cuda:N, mps"
_DEVICE_NAME = re.compile(r"auto|(?:cpu|cuda|mps)(?::\d+)?")
#: The decoder names a user may give (shown in messages and `--help`), and the tuned lens's prefix.
DECODER_SPELLINGS = ("logit-lens", "embedding", "tuned:DIR")
TUNED_PREFIX = "tuned:"
#: Why `attribute` refuses a decoder other than the logit lens (and a tuned lens beside it).
ONLY_THE_LOGIT_LENS = "attribute decodes through the logit lens; `decoder` may add a tuned lens (tuned:DIR)"


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


def check_integer(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    """UsageError unless `value` (of parameter `name`) is an integer ≥ `minimum` (and below
    `maximum`, when given)."""
    in_range = (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= minimum
        and (maximum is None or value < maximum)
    )
    if not in_range:
        allowed = f"an integer >= {minimum}" if maximum is None else f"{minimum} <= {name} < {maximum}"
        raise UsageError(f"`{name}` {value!r} is not allowed; allowed: {allowed}")


def check_positive(name: str, value: int) -> None:
    """UsageError unless `value` (of parameter `name`) is an integer ≥ 1."""
    check_integer(name, value, 1)


def check_fraction(name: str, value: float) -> None:
    """UsageError unless `value` (of parameter `name`) lies strictly between 0 and 1."""
    if not 0.0 < value < 1.0:
        raise UsageError(f"`{name}` {value} is not allowed; allowed: strictly between 0 and 1")


def check_max_tokens(max_tokens: int) -> None:
    """`max_tokens` (an evaluation's tokens per benchmark) must allow one token of context
    and one scored."""
    if max_tokens < 2:
        raise UsageError(f"`max_tokens` must be >= 2 (one token of context, one scored), got {max_tokens}")


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


def check_dtype_name(dtype: str) -> str:
    """`dtype` when a model may be loaded in it (`DTYPE_NAMES`); UsageError naming `dtype` otherwise."""
    return check_choice("`dtype`", dtype, DTYPE_NAMES)


def check_load_names(dtype: str | None, device: str, device_map: str | None = None) -> None:
    """UsageError for a `dtype`, `device` or `device_map` that names nothing a model can be
    loaded with (None: not given, or checked by the caller)."""
    if dtype is not None:
        check_dtype_name(dtype)
    check_device_name(device)
    if device_map is not None:
        check_choice("`device_map`", device_map, DEVICE_MAPS)


def verify_dtype(dtype: str) -> str:
    """The dtype `resstream.verify` loads a model in for `dtype`: float32 for "auto" (the
    tolerances are per dtype), else `dtype` when verify has tolerances for it (`VERIFY_DTYPES`);
    UsageError naming `dtype` otherwise."""
    return "float32" if dtype == "auto" else check_choice("`dtype`", dtype, VERIFY_DTYPES)


def check_one_text(text: str | None, text_file: object | None) -> None:
    """UsageError unless exactly one of `text` and `text_file` is given, and a `text` holds more
    than white space (what the file holds is read, and checked, later)."""
    if (text is None) == (text_file is None):
        raise UsageError("give exactly one of `text` or `text_file`")
    if text is not None and not text.strip():
        raise UsageError("`text` is empty")


def decoder_kind(spec: str) -> str:
    """The kind of decoder `spec` names ("logit-lens", "embedding", or "tuned" for tuned:DIR,
    whose directory is read later); UsageError for any other name (`DECODER_SPELLINGS`)."""
    allowed = ", ".join(DECODER_SPELLINGS)
    if spec in ("logit-lens", "embedding"):
        return spec
    if spec.startswith(TUNED_PREFIX) and spec[len(TUNED_PREFIX) :]:
        return "tuned"
    if spec in ("tuned", TUNED_PREFIX):
        raise UsageError(
            "decoder 'tuned' needs its lens directory: tuned:DIR (from `resstream tune-lens`); "
            f"allowed: {allowed}"
        )
    raise UsageError(f"unknown decoder {spec!r}{closest(spec, DECODER_SPELLINGS)}; allowed: {allowed}")
