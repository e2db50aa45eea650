"""Ctrl-C that is never lost: a remembered interrupt, and moments that finish before it lands.

Python turns SIGINT into a `KeyboardInterrupt` raised wherever the program happens to be. Two
things go wrong with that in a command that imports large libraries and writes a set of files:

* an interrupt that arrives while a library is being imported can be swallowed by the
  library's own ``except BaseException`` (or turned into another exception), and the command
  then runs to completion or crashes later with an unrelated traceback;
* an interrupt that arrives while a library is being imported by C++ code (torch's
  ``_c10d_init``, ``_multiprocessing_init`` and ``_dist_autograd_init`` import Python modules
  from C++ functions that cannot pass an exception on) aborts the process: ``terminate called
  after throwing an instance of 'python_error'`` and exit status 134 instead of 130;
* an interrupt that arrives while a set of outputs is being moved into place leaves a set
  that is neither the old one nor the new one.

`remember_interrupts()` (installed first thing by the command-line entry point) replaces the
SIGINT handler with one that records the interrupt before raising `KeyboardInterrupt`, so
`was_interrupted()` stays true even when the exception itself was swallowed, and
`raise_if_interrupted()` re-raises it at the next safe point. It also makes every import of the
main thread whole (`_whole_import`): an interrupt that arrives while a module is being imported
is held back until the outermost import has finished, then raised at that import statement (the
user waits for one import, torch's being the longest of a command, a second or two); a second
Ctrl-C during that import interrupts at once, for an import that hangs. The wrapper adds about
0.4 µs to an import statement: some 10 ms over the 28,000 of a `shift` command.
`deferred_interrupts()` holds an interrupt back until a short critical section has finished.

A long loop whose progress is worth keeping (training a model or a tuned lens) runs under
`stop_requests()`: the first SIGINT or SIGTERM only asks it to stop (`StopRequests.requested`
turns true), so the loop finishes its current step, saves a checkpoint and then stops with
`StopRequests.stop()` (a `KeyboardInterrupt`, exit code 130 on the command line); a second
SIGINT, for a user who will not wait, interrupts at once.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

_state = {
    "stopping": False,
    "stop_requested": False,
    "remembering": False,
    "interrupted": False,
    "deferring": False,
    "pending": False,
    "importing": False,
    "whole_imports": False,
}


def _on_sigint(_signum: int, _frame: FrameType | None) -> None:
    if _state["remembering"]:  # a command-line process: one command, so the flag stays set
        _state["interrupted"] = True
    if _state["importing"] and _state["pending"] and not _state["deferring"]:
        _state["pending"] = False  # asked twice during one import: the user will not wait
        raise KeyboardInterrupt
    if _state["deferring"] or _state["importing"]:
        _state["pending"] = True
        return
    _state["pending"] = False  # delivered now: nothing is left held back
    raise KeyboardInterrupt


def remember_interrupts() -> None:
    """Install the remembering SIGINT handler and make the main thread's imports whole
    (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)
        _state["remembering"] = True
        if not _state["whole_imports"]:  # once: a hook installed after it stays outside it
            _state["whole_imports"] = True
            _imports["original"] = builtins.__import__
            builtins.__import__ = _whole_import


#: The import function `_whole_import` wraps (`builtins.__import__` before `remember_interrupts`).
_imports: dict[str, Callable[..., Any]] = {"original": builtins.__import__}
_MAIN_THREAD = threading.main_thread().ident


def _whole_import(name: str, *args: Any, **kwargs: Any) -> Any:
    """`builtins.__import__`, with an interrupt that arrives during the main thread's outermost
    import held back until that import has finished, then raised where it was asked for.

    Both an ``import`` statement and C code's ``PyImport_Import`` (what pybind11 and torch's
    initialisers call) go through `builtins.__import__`, so the imports nested in an outermost
    one, among them those a C++ initialiser makes while a module is imported, never see a
    first Ctrl-C. An outermost import asked for by C code at run time (numpy's and torch's
    lazy imports) gets the interrupt when it returns, as any call into Python from C would.
    Imports of other threads, and those nested in an import already under way, are handed on
    as they are."""
    if _state["importing"] or threading.get_ident() != _MAIN_THREAD:
        return _imports["original"](name, *args, **kwargs)
    _state["importing"] = True
    try:
        return _imports["original"](name, *args, **kwargs)
    finally:
        _state["importing"] = False
        if _state["pending"] and not _state["deferring"]:
            _state["pending"] = False
            raise KeyboardInterrupt  # the interrupt held back: the outcome of the import statement


def _forget_imports_in_child() -> None:
    """A child forked during an import is not inside it, nor owes its parent's interrupt."""
    _state.update(importing=False, pending=False)


os.register_at_fork(after_in_child=_forget_imports_in_child)


def was_interrupted() -> bool:
    """True once SIGINT has arrived in a process that `remember_interrupts()` set up."""
    return _state["interrupted"]


def raise_if_interrupted() -> None:
    """Raise `KeyboardInterrupt` if an interrupt arrived and was swallowed on its way up."""
    if _state["interrupted"]:
        raise KeyboardInterrupt


def reset() -> None:
    """Forget a remembered interrupt (for a process that runs several commands, like tests)."""
    _state.update(interrupted=False, deferring=False, pending=False, stop_requested=False, importing=False)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Run the block to its end even if Ctrl-C arrives during it; deliver the interrupt after.

    Within the block the remembering handler is installed (whatever handler was there
    before comes back after it); an interrupt that arrived during the block then reaches
    that handler: `KeyboardInterrupt` for Python's default one.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    outer = _state["deferring"]
    _state["deferring"] = True
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _state["deferring"] = outer
        if not outer and _state["pending"]:
            _state["pending"] = False
            _deliver(previous)


def _deliver(handler: object) -> None:
    """Hand a held-back SIGINT to the handler that was installed before the deferral."""
    if handler in (signal.default_int_handler, _on_sigint):
        raise KeyboardInterrupt
    if callable(handler):
        handler(signal.SIGINT, None)


class StopRequests:
    """What `stop_requests()` yields: whether a stop was asked for, and how to stop."""

    @property
    def requested(self) -> bool:
        """True once SIGINT or SIGTERM has asked the loop to stop at its next safe point."""
        return _state["stop_requested"]

    def stop(self) -> None:
        """Stop now: remember the interrupt (as a Ctrl-C) and raise `KeyboardInterrupt`."""
        _state["stop_requested"] = False  # taken: nothing left to deliver when the block ends
        if _state["remembering"]:
            _state["interrupted"] = True
        raise KeyboardInterrupt


def _on_stop_signal(_signum: int, _frame: FrameType | None) -> None:
    if _state["stop_requested"] and _signum == signal.SIGINT:  # asked twice: the user will not wait
        _state["stop_requested"] = False
        _on_sigint(_signum, _frame)
        return
    _state["stop_requested"] = True


@contextlib.contextmanager
def stop_requests() -> Iterator[StopRequests]:
    """Within the block, SIGINT and SIGTERM ask for a stop at the next safe point instead of
    interrupting; a second SIGINT interrupts at once. Outside the main thread, signals cannot
    be caught, and the block runs with the handlers as they are (`requested` stays false).
    The handlers installed before come back after the block; a stop asked for but not taken
    by the block's end is then delivered to them as SIGINT."""
    requests = StopRequests()
    if threading.current_thread() is not threading.main_thread():
        yield requests
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    outer = _state["stopping"]
    _state.update(stopping=True, stop_requested=False)
    for sig in previous:
        signal.signal(sig, _on_stop_signal)
    try:
        yield requests
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        pending = _state["stop_requested"]
        _state.update(stopping=outer, stop_requested=False)
        if pending and not outer:
            _deliver(previous[signal.SIGINT])
