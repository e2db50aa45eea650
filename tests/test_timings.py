"""One time per command, in one place: docs/timings.md states it, the README and help link to it.

The table is measured by `benchmarks/bench_commands.py` on a stated quiet machine; a figure
repeated elsewhere drifts from it (the README, `--help` and docs once gave 14 min, about 15 min
and ≤ 30 min for the same `reproduce`), so these tests keep figures out of the other places.
"""

from __future__ import annotations

import re
from pathlib import Path

from resstream.cli.main import main
from tests.readme_commands import README, bash_lines, readme_commands

TIMINGS = README.parent / "docs" / "timings.md"
#: A stated duration: "9 s", "~2 min", "14 min 04 s", "about ten seconds", "≤ 30 min".
DURATION = re.compile(
    r"\d+(\.\d+)?\s*(-\s*\d+\s*)?(s|sec|secs|seconds?|min|mins|minutes?|h|hours?)\b(?! of )"
    r"|\b(a|one|two|three|five|ten|fifteen|thirty)[\s-](minutes?|hours?|seconds)\b"
)


def _timed_commands() -> dict[str, str]:
    """The table of docs/timings.md: command line → its time."""
    rows = {}
    for line in TIMINGS.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"\|\s*`([^`]+)`\s*\|\s*([^|]+?)\s*\|.*", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def test_every_readme_command_that_runs_here_has_its_time():
    timed = _timed_commands()
    missing = [c.line for c in readme_commands() if c.skip is None and c.line not in timed]
    assert not missing, f"docs/timings.md has no time for: {missing}"
    assert all(DURATION.search(time) for time in timed.values()), timed


def test_the_readme_states_no_time_of_its_own():
    stated = [line for line in bash_lines(README.read_text(encoding="utf-8")) if DURATION.search(line)]
    assert not stated, stated
    assert "docs/timings.md" in README.read_text(encoding="utf-8")


def test_help_texts_state_no_times(capsys):
    for command in ("reproduce", "train", "tune-lens", "sweep", "eval", "compare"):
        assert main([command, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert not DURATION.search(text), (command, DURATION.search(text))


def test_the_pattern_finds_the_figures_that_drifted():
    drifted = ("# ≤ 30 min on 2 CPU cores", "about 15 min", "~9 s", "14 min 04 s", "~2-4 min", "a one-minute")
    for text in drifted:
        assert DURATION.search(text), text
    assert not DURATION.search("3 seeds of 800 steps") and not DURATION.search("a second Ctrl-C")
    assert Path(TIMINGS).is_file()
