"""The one line and the exit code of an interrupted command, shared by the console script
(`cli/entry.py`) and the app (`cli/main.py`). It imports nothing but `resstream.notices` (itself
only `sys` and `warnings`), so that the console script can still report an interrupt after a
half-finished import."""

from __future__ import annotations

from resstream.notices import say

INTERRUPTED = "interrupted; nothing half-written was kept"


def interrupted_exit() -> int:
    """Say the command was interrupted (one line on stderr) and return its exit code, 130."""
    say(f"resstream: error: {INTERRUPTED}")
    return 130
