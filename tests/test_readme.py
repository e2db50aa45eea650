"""The README can be followed top to bottom: its commands fit together, and they run.

The fast tests read the README's command lines (`tests/readme_commands.py`) and check that they
fit together: no two different commands write the same folder, and each folder a command reads
was written before it by the command that makes such a folder. The slow test runs every command
in order on the built-in model in a temporary folder (the long ones with the small flags their
comment documents), as a new user would, and fails on the first that does not exit 0.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from resstream import interrupts
from resstream.cli.main import main
from tests.readme_commands import ReadmeCommand, readme_commands

#: Which command writes the folders that other commands read, and how they are named.
_READS = {
    "tuned:": "tune-lens",  # --decoder tuned:DIR
    "--model": "train",  # --model runs/X: a run
}


def _reads(command: ReadmeCommand) -> list[tuple[str, str]]:
    """(folder, the command that must have written it) for each folder `command` reads."""
    args, found = command.args, []
    for i, arg in enumerate(args):
        if arg.startswith("tuned:"):
            found.append((arg.removeprefix("tuned:"), _READS["tuned:"]))
        if arg == "--model" and args[i + 1].startswith("runs/"):
            found.append((args[i + 1], _READS["--model"]))
        if arg == "--resume":
            found.append((command.out or "", command.command))
    if command.command == "compare":  # compare SWEEP_DIRS... --out DIR
        positional = args[1 : next((i for i, a in enumerate(args) if a.startswith("--")), len(args))]
        found += [(arg, "sweep") for arg in positional]
    return found


def test_the_readme_has_commands_to_run():
    commands = readme_commands()
    runnable = [c for c in commands if c.skip is None]
    assert len(runnable) >= 15, [c.line for c in commands]
    assert commands[0].args == ("shift", "--out", "runs/shift")  # the quick start's main job


def test_no_two_different_commands_write_one_folder():
    writers: dict[str, str] = {}
    for command in readme_commands():
        if command.out is None:
            continue
        first = writers.setdefault(command.out, command.command)
        assert first == command.command, (
            f"README: `{command.line}` writes {command.out}, which `resstream {first}` wrote before"
        )


def test_every_folder_a_command_reads_was_written_before_it():
    written: dict[str, str] = {}
    for command in readme_commands():
        for folder, writer in _reads(command):
            assert written.get(folder) == writer, (
                f"README: `{command.line}` reads {folder}, which no `resstream {writer}` above it writes"
            )
        if command.out is not None:
            written[command.out] = command.command


def test_a_quick_flag_overrides_the_option_given_before(tmp_path):
    text = "```bash\nresstream sweep --seeds 0,1,2 --out runs/s   # 18 runs (quick: --seeds 0)\n```\n"
    (command,) = readme_commands(text)
    assert command.quick_args() == ["sweep", "--seeds", "0,1,2", "--out", "runs/s", "--seeds", "0"]


def test_a_line_that_is_neither_resstream_nor_set_up_is_refused():
    with pytest.raises(ValueError, match="neither resstream nor set-up"):
        readme_commands("```bash\nrm -rf runs\n```\n")


def _write_readers_files(folder: Path) -> None:
    """The files a reader brings along in the README's examples: pinned token ids."""
    rows = [{"input_ids": [(7 * row + 3 * i) % 200 + 10 for i in range(48)]} for row in range(4)]
    (folder / "pinned.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.slow
def test_the_readme_runs_top_to_bottom(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write_readers_files(tmp_path)
    has_data = bool(os.environ.get("RESSTREAM_DATA"))
    ran = []
    for command in readme_commands():
        if command.skip is not None or (command.needs_data and not has_data):
            continue
        interrupts.reset()
        begun = time.perf_counter()
        code = main([*command.quick_args(), "--quiet"])
        err = capsys.readouterr().err
        assert code == 0, f"`{command.line}` exited {code}:\n{err}"
        with capsys.disabled():  # each command's time, for docs/timings.md (shown with -n 0)
            print(f"{time.perf_counter() - begun:6.1f} s  resstream {' '.join(command.quick_args())}")
        assert (tmp_path / (command.out or "")).is_dir(), command.line
        ran.append(command.line)
    assert len(ran) >= 15, ran
