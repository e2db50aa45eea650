"""How a step's command line runs: in this process, exactly as if typed, or under torchrun for
a distributed training step; what it prints on stdout goes to the stage's log.

The study engine never imports the command-line interface (which imports the engine): what
runs a resstream command line in this process is a `CommandRunner` the interface hands in.
`resstream.cli.reproduce.register` installs the Typer app as the process's runner
(`use_command_runner`) when the app is built; `run_command` takes another one as `runner`.
A torchrun child starts the interface by its module name (`TORCHRUN_MODULE`).
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TextIO

from resstream.errors import RunError
from resstream.io import check_below, folder_inside, open_log
from resstream.study.pipeline import OUT, Step
from resstream.study.plan import Plan

#: The module a torchrun child runs: the `resstream` command line.
TORCHRUN_MODULE = "resstream.cli.main"


class CommandRunner(Protocol):
    """Runs one resstream command line (without the program name) in this process and returns
    its exit code (None for 0); an error propagates as the command raised it."""

    def __call__(self, args: list[str]) -> int | None: ...


_installed: list[CommandRunner] = []  # the runner `use_command_runner` installed, if any


def use_command_runner(runner: CommandRunner) -> None:
    """Make `runner` what runs the study's command lines in this process (the CLI installs its
    app when it builds it)."""
    _installed[:] = [runner]


def installed_runner() -> CommandRunner:
    """The runner `use_command_runner` installed (RuntimeError when there is none)."""
    if not _installed:
        raise RuntimeError(
            "no runner of resstream command lines in this process: pass `runner`, or import "
            "resstream.cli.main, which installs the command-line interface's"
        )
    return _installed[0]


def expand(argv: Sequence[str], out: Path) -> list[str]:
    """A recorded command line with OUT replaced by the reproduction's directory."""
    return [arg.replace(OUT, str(out)) for arg in argv]


def launcher(plan: Plan, distributed: bool) -> list[str]:
    """What starts a command: `resstream`, or torchrun for a distributed training step with
    `nproc_per_node` > 1 (as `command_line` records it)."""
    if _under_torchrun(plan, distributed):
        return [
            "torchrun",
            "--standalone",
            "--nproc_per_node",
            str(plan.nproc_per_node),
            "-m",
            TORCHRUN_MODULE,
        ]
    return ["resstream"]


def _under_torchrun(plan: Plan, distributed: bool) -> bool:
    return distributed and plan.nproc_per_node > 1


def command_line(step: Step, plan: Plan) -> str:
    """The step as a shell command a person can paste (OUT still marks the directory)."""
    return shlex.join([*launcher(plan, step.distributed), *step.argv]) if step.argv else step.label


def _check_out_inside(plan: Plan, args: Sequence[str]) -> None:
    """A step's --out inside the reproduction's directory is reached without a link (in this
    process the nested lock checks it too; a torchrun child holds no lock of ours)."""
    if "--out" in args[:-1]:
        check_below(plan.out, args[args.index("--out") + 1], "a directory")


def run_command(
    argv: Sequence[str],
    plan: Plan,
    log_file: Path,
    *,
    distributed: bool = False,
    runner: CommandRunner | None = None,
) -> None:
    """Run one resstream command: in this process (by `runner`, else the installed one), or
    under torchrun for a distributed training step with `nproc_per_node` > 1. What it prints
    on stdout is appended to `log_file` (progress and notes stay on stderr). An error
    propagates as the command raised it; an interrupted command raises KeyboardInterrupt, one
    that exits otherwise RunError."""
    from resstream.interrupts import was_interrupted

    args = expand(argv, plan.out)
    folder_inside(plan.out, log_file.parent)  # never through a link planted in the directory
    _check_out_inside(plan, args)
    with open_log(log_file) as log:
        log.write(f"$ {shlex.join([*launcher(plan, distributed), *args])}\n")
        log.flush()
        code: int | None
        if _under_torchrun(plan, distributed):
            code = _run_torchrun(plan, args, log)
        else:
            with contextlib.redirect_stdout(log):
                code = (runner or installed_runner())(args)
    if code == 130 or was_interrupted():  # typer turns Ctrl-C inside a command into exit code 130
        raise KeyboardInterrupt
    if code:
        raise RunError(f"`resstream {args[0]}` exited with {code}; what it printed is in {str(log_file)!r}")


def _run_torchrun(plan: Plan, args: list[str], log: TextIO) -> int:
    """The command under torchrun (one process per `nproc_per_node`), its stdout into `log`."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", *launcher(plan, True)[1:]]
    return subprocess.run([*torchrun, *args], stdout=log, check=False).returncode
