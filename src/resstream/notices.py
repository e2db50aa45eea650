"""Notices: what a user should know about a run that is not an error.

Library code calls `notify(message)` when it decides something on the user's behalf (a
default clipped to fit a model, say). A notice is a Python warning of category
`ResstreamNotice`, so a notebook shows it and `warnings.filterwarnings` can silence it; the
command line prints it as one line, ``resstream: note: ...``, with parameter names shown as
flags. Messages follow `resstream.errors`: parameter names in backticks.
"""

from __future__ import annotations

import sys
import warnings


class ResstreamNotice(UserWarning):
    """Something resstream decided on the user's behalf."""


# Every notice is shown, not only the first from each line of code: a second run in a notebook
# that clips its default again should say so again. (A user's own filter, added later, wins.)
warnings.simplefilter("always", ResstreamNotice)


def notify(message: str) -> None:
    """Tell the user `message` (a `ResstreamNotice` warning)."""
    warnings.warn(message, ResstreamNotice, stacklevel=3)


def say(line: str) -> None:
    """Write `line` and its newline to stderr in one write, flushed.

    `print` writes the text and the newline separately, and stderr is unbuffered when it is a
    pipe, so two processes sharing it (the ranks of a torchrun job) can splice one line into
    another; one write of under `PIPE_BUF` (4 KiB) bytes to a pipe is atomic."""
    stream = sys.stderr
    stream.write(f"{line}\n")
    stream.flush()
