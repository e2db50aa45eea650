"""Exceptions that the CLI turns into one-line messages.

`UsageError` is bad input from the user (exit code 2, nothing written);
`RunError` is a run that started correctly and had to stop (exit code 1).

Library code names its own parameters in messages, each in backticks: ```num_seqs` 0 must
be >= 1``, ```resume=True```. A backticked identifier in a message is a parameter name and
nothing else (a backticked command with spaces, ```resstream sweep```, is left alone); the
command line shows the same message with each such name replaced by the flag that sets it
(``--num-seqs 0 must be >= 1``, ``--resume``; see `resstream.cli.flags`), so only `cli/`
knows flag names. Text quoted from other libraries goes through `short_reason`, which turns
their backticks into quotes.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

#: The longest reason quoted from another library's exception (`short_reason`).
MAX_REASON_CHARS = 200


class ResstreamError(Exception):
    """Base class: the message is shown to the user as one line."""

    exit_code = 1


class UsageError(ResstreamError):
    """Bad input: a value the user gave is not allowed. Exit code 2."""

    exit_code = 2


class RunError(ResstreamError):
    """A run that was set up correctly but could not finish. Exit code 1."""

    exit_code = 1


def closest(name: str, allowed: Iterable[str]) -> str:
    """A ' (did you mean X?)' suffix naming the closest allowed spelling, or ''."""
    match = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def check_choice(what: str, value: str, allowed: Iterable[str]) -> str:
    """Return `value` if it is one of `allowed`, else raise a UsageError listing them."""
    allowed = list(allowed)
    if value not in allowed:
        raise UsageError(f"unknown {what} {value!r}{closest(value, allowed)}; allowed: {', '.join(allowed)}")
    return value


def refuse_set(given: Mapping[str, object], reason: str) -> None:
    """UsageError "`name` {reason}" for the first entry of `given` that is set (not None): the
    options of one mode that another mode refuses."""
    for name, value in given.items():
        if value is not None:
            raise UsageError(f"`{name}` {reason}")


def short_reason(exc: BaseException) -> str:
    """Another library's exception as one line of at most `MAX_REASON_CHARS` characters.

    Its backticks become quotes: in our messages backticks mark our own parameter names.
    """
    text = " ".join(str(exc).replace("`", "'").split()) or type(exc).__name__
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."
