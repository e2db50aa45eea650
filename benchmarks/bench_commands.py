"""How long each README command takes, as a user runs it: the table of docs/timings.md.

Runs the README's resstream commands in order (`tests/readme_commands.py`: the ones this
machine can run), each as its own `resstream ...` process in a fresh folder, and prints one
Markdown row per command with its wall time, then the machine (CPU, cores, torch) and the load
average before and after, which says whether the machine was quiet.

    python benchmarks/bench_commands.py                 # every command as written
    python benchmarks/bench_commands.py --quick         # with the small flags of the long ones
    python benchmarks/bench_commands.py --skip reproduce --skip sweep   # leave some out

A command that reads an earlier one's folder (`compare runs/sweep`) needs that one run first;
`--skip` of the earlier one skips the later one too.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.readme_commands import ReadmeCommand, readme_commands  # noqa: E402
from tests.test_readme import _reads, _write_readers_files  # noqa: E402

from harness import cpu_name, load_averages, timed  # noqa: E402


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in load_averages())


def _runnable(commands: list[ReadmeCommand], skip: list[str]) -> list[ReadmeCommand]:
    """The commands this machine can run, minus those skipped and those reading their folders."""
    has_data = bool(os.environ.get("RESSTREAM_DATA"))
    chosen, dropped = [], set()
    for command in commands:
        reads = {folder for folder, _ in _reads(command)} - {command.out}
        if (
            command.skip is not None
            or (command.needs_data and not has_data)
            or any(word in command.line for word in skip)
            or reads & dropped
        ):
            dropped.add(command.out)
            continue
        chosen.append(command)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="append the documented small flags")
    parser.add_argument("--skip", action="append", default=[], help="leave out commands containing this")
    args = parser.parse_args()
    import torch

    versions = f"torch {torch.__version__}, Python {platform.python_version()}"
    print(f"machine: {cpu_name()}, {versions}")
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; load average before: {_load()}")
    print("\n| command | wall time |\n| --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        _write_readers_files(Path(folder))
        for command in _runnable(readme_commands(), args.skip):
            argv = [*(command.quick_args() if args.quick else command.args), "--quiet"]
            run = partial(subprocess.run, ["resstream", *argv], cwd=folder, capture_output=True, text=True)
            seconds, done = timed(run)
            status = (
                "" if done.returncode == 0 else f" (exit {done.returncode}: {done.stderr.strip()[-200:]})"
            )
            shown = " ".join([command.line, *command.quick]) if args.quick else command.line
            print(f"| `{shown}` | {_duration(seconds)}{status} |", flush=True)
    print(f"\nload average after: {_load()}")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


if __name__ == "__main__":
    main()
