"""The console script: remember Ctrl-C before anything heavy is imported, then run the CLI.

Importing the command-line interface pulls in typer, and a command pulls in torch and
transformers: seconds in which a Ctrl-C used to be swallowed by a library's import machinery
or to leave a module half-imported, so that the command ran on or failed later with an
unrelated traceback. Installing the remembering handler first (`resstream.interrupts`) makes
every interrupt after the interpreter's own start end the command with exit code 130 and one
line. This module imports nothing else (`cli/interrupted.py` imports only `sys`), so that it can
still report an interrupt after a half-finished import.
"""

from __future__ import annotations

import sys

from resstream.cli.interrupted import interrupted_exit
from resstream.interrupts import remember_interrupts, was_interrupted


def run() -> None:
    """Entry point of `resstream` and `python -m resstream`."""
    remember_interrupts()
    try:
        from resstream.cli.main import main

        code = main()
    except Exception:
        if not was_interrupted():
            raise
        code = interrupted_exit()  # e.g. a module left half-imported by the interrupt
    except KeyboardInterrupt:  # while the command-line interface itself was imported
        code = interrupted_exit()
    if code == 130:
        _exit_now(code)
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command has finished: let it exit with its code
    sys.exit(code)


def _exit_now(code: int) -> None:
    """Exit at once with `code`, after flushing the standard streams.

    CPython exits by re-raising SIGINT (exit status -2 instead of 130) when a
    `KeyboardInterrupt` once went unhandled inside code that a C extension ran with
    `PyRun_String`, even after resstream caught the interrupt; everything this command
    holds (locks, staging folders) has already been released by the time it gets here.
    """
    import os

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
