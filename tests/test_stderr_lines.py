"""A line on stderr leaves in one write: torchrun's ranks share one stderr pipe, and a line
written as text and newline separately can be spliced by another rank's line (CI saw rank 1's
"interrupted" line run into rank 0's "stopped at step 2" line)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator

from resstream.cli.interrupted import INTERRUPTED, interrupted_exit
from resstream.cli.main import main
from resstream.notices import ResstreamNotice, say


class Writes(io.StringIO):
    """A text stream that remembers each `write` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


@contextlib.contextmanager
def recorded_stderr() -> Iterator[Writes]:
    """`sys.stderr` replaced by a `Writes` within the block (inside the test body: pytest's own
    capture swaps `sys.stderr` between a fixture's setup and the test)."""
    stream, kept = Writes(), sys.stderr
    sys.stderr = stream
    try:
        yield stream
    finally:
        sys.stderr = kept


def test_say_writes_the_line_and_its_newline_at_once():
    with recorded_stderr() as stderr:
        say("resstream: error: something")
    assert stderr.calls == ["resstream: error: something\n"]


def test_the_interrupted_line_is_one_write():
    with recorded_stderr() as stderr:
        assert interrupted_exit() == 130
    assert stderr.calls == [f"resstream: error: {INTERRUPTED}\n"]


def test_an_error_of_the_command_line_is_one_write(tmp_path):
    with recorded_stderr() as stderr:
        code = main(["shift", "--num-seqs", "0", "--out", str(tmp_path / "out")])
    assert code == 2
    errors = [call for call in stderr.calls if "resstream: error:" in call]
    assert len(errors) == 1 and errors[0].startswith("resstream: error: ") and errors[0].endswith("\n")
    assert errors[0].count("\n") == 1


def test_a_notice_is_one_write():
    from resstream.cli import main as cli_main

    with recorded_stderr() as stderr, cli_main._notices_as_lines("shift"):
        warnings.warn("`num_seqs` clipped to 4", ResstreamNotice, stacklevel=1)
    assert stderr.calls == ["resstream: note: --num-seqs clipped to 4\n"]


def test_lines_of_two_processes_on_one_pipe_stay_whole():
    """Two processes writing long lines to one pipe at once: every line arrives whole."""
    line = "x" * 2000
    writer = f"from resstream.notices import say\nfor _ in range(5000): say({line!r})"
    both = f'({sys.executable} -c "$W" & {sys.executable} -c "$W" & wait)'
    out = subprocess.run(
        ["bash", "-c", f"{both} 2>&1 | cat"], env={**os.environ, "W": writer}, capture_output=True, text=True
    )
    lines = out.stdout.splitlines()
    assert len(lines) == 10000 and set(lines) == {line}
