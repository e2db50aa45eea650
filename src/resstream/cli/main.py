"""The `resstream` command: one Typer app, one module per command.

`main(argv)` runs a command in-process and returns its exit code: 0 on success, 2 for bad
input (one line on stderr, nothing written), 1 for a run that had to stop, 130 on Ctrl-C.
`--debug` anywhere on the command line shows the traceback instead. A bare `resstream`
prints the help (exit 0); `resstream --version` prints the version.

`--install-completion [SHELL]` and `--show-completion [SHELL]` are Typer's shell completion with
the shell as an optional value (`cli/completion.py`, hence not Typer's `add_completion`). The
analysis commands named in `JSON_COMMANDS` take `--json` (`options.with_json_option`).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import click
import typer
from typer.core import TyperCommand

from resstream.cli import attribute as attribute_cmd
from resstream.cli import compare as compare_cmd
from resstream.cli import composition as composition_cmd
from resstream.cli import directions as directions_cmd
from resstream.cli import eval as eval_cmd
from resstream.cli import generate as generate_cmd
from resstream.cli import interventions as interventions_cmd
from resstream.cli import lens as lens_cmd
from resstream.cli import neurons as neurons_cmd
from resstream.cli import recency as recency_cmd
from resstream.cli import report as report_cmd
from resstream.cli import reproduce as reproduce_cmd
from resstream.cli import routes as routes_cmd
from resstream.cli import shift as shift_cmd
from resstream.cli import simulate as simulate_cmd
from resstream.cli import steer as steer_cmd
from resstream.cli import sweep as sweep_cmd
from resstream.cli import tokenize as tokenize_cmd
from resstream.cli import train as train_cmd
from resstream.cli import tune_lens as tune_lens_cmd
from resstream.cli import verify as verify_cmd
from resstream.cli.completion import GroupWithCompletion, InstallCompletionOption, ShowCompletionOption
from resstream.cli.flags import cli_message
from resstream.cli.help import FlagsWithoutTypes
from resstream.cli.interrupted import interrupted_exit
from resstream.cli.options import with_json_option
from resstream.errors import ResstreamError
from resstream.interrupts import was_interrupted
from resstream.notices import ResstreamNotice, say

# typer >= 0.20 ships its own copy of click: catch both families.
_EXIT = (click.exceptions.Exit, typer.Exit)
_ABORT = (click.exceptions.Abort, typer.Abort)
_CLI_ERRORS = (click.exceptions.ClickException, typer.exceptions.TyperException)

app = typer.Typer(
    name="resstream",
    help="Residual-stream analysis and residual-attenuation training for causal Transformer LMs.",
    add_completion=False,  # the completion options are cli/completion.py's (the shell optional)
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=GroupWithCompletion,
)
#: The commands that take --json: each writes a result JSON (`rundir.result_file`).
JSON_COMMANDS = (
    "shift",
    "lens",
    "tune-lens",
    "attribute",
    "neurons",
    "composition",
    "directions",
    "recency",
    "simulate",
    "eval",
    "compare",
    "ablate",
    "patch",
    "routes",
    "verify",
    "generate",
    "steer",
)
for module in (
    tokenize_cmd,
    train_cmd,
    eval_cmd,
    sweep_cmd,
    compare_cmd,
    shift_cmd,
    lens_cmd,
    tune_lens_cmd,
    attribute_cmd,
    interventions_cmd,
    neurons_cmd,
    composition_cmd,
    directions_cmd,
    simulate_cmd,
    recency_cmd,
    routes_cmd,
    generate_cmd,
    steer_cmd,
    verify_cmd,
    reproduce_cmd,
    report_cmd,
):
    module.register(app)
for info in app.registered_commands:  # every command's help shows flags without a type
    if info.cls in (None, TyperCommand):
        info.cls = FlagsWithoutTypes
    if info.name in JSON_COMMANDS and info.callback is not None:
        info.callback = with_json_option(info.callback)


def _print_version(value: bool) -> None:
    if value:
        import resstream

        typer.echo(f"resstream {resstream.__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option("--debug", help="Show the full traceback of an error (anywhere on the command line)."),
    ] = False,
    install_completion: InstallCompletionOption = None,
    show_completion: ShowCompletionOption = None,
) -> None:
    """Residual-stream analysis and residual-attenuation training for causal Transformer LMs."""


def _error(message: str) -> None:
    say(f"resstream: error: {message}")


def _raw_value(args: list[str], opts: list[str]) -> str | None:
    """The text the user gave for an option (`--opt value` or `--opt=value`); the last one
    when it is given several times, as the parser keeps the last."""
    found = None
    for i, arg in enumerate(args):
        for opt in opts:
            if arg == opt and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(opt + "="):
                found = arg[len(opt) + 1 :]
    return found


def _describe(exc: Exception, args: list[str]) -> str:
    """One line for a parsing error, naming the value the user gave when there is one."""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    message = message.splitlines()[0] if message else type(exc).__name__
    param = getattr(exc, "param", None)
    raw = _raw_value(args, list(getattr(param, "opts", []))) if param is not None else None
    if raw is not None and repr(raw) not in message:
        message = f"{message} (got {raw!r})"
    return message


@contextmanager
def _notices_as_lines(command: str | None) -> Iterator[None]:
    """Within the block, a `ResstreamNotice` is one line on stderr, ``resstream: note: ...``,
    its parameter names shown as flags (under torchrun, by rank 0 alone); other warnings are
    shown as Python shows them."""
    with warnings.catch_warnings():
        show = warnings.showwarning

        def show_notice(message, category, *args, **kwargs) -> None:
            if issubclass(category, ResstreamNotice):
                from resstream.distributed import launched_rank

                if launched_rank() == 0:  # the other ranks of a torchrun job meet the same notices
                    say(f"resstream: note: {cli_message(str(message), command)}")
            else:
                show(message, category, *args, **kwargs)

        warnings.showwarning = show_notice
        yield


def main(argv: list[str] | None = None) -> int:
    """Run the CLI on `argv` (default: sys.argv[1:]) and return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    command = next((arg for arg in args if not arg.startswith("-")), None)
    with _notices_as_lines(command):
        return _run(args, command, debug)


def _run(args: list[str], command: str | None, debug: bool) -> int:
    """`main` after its set-up: run the app on `args` and turn what it raises into an exit code."""
    try:
        result = app(args=args, prog_name="resstream", standalone_mode=False)
    except _EXIT as exc:
        result = exc.exit_code
    except _CLI_ERRORS as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare `resstream`: the help was printed
            return 0
        if debug:
            raise
        _error(_describe(exc, args))
        return 2
    except (KeyboardInterrupt, *_ABORT):
        return interrupted_exit()
    except ResstreamError as exc:
        if debug:
            raise
        if was_interrupted():  # a stop caused by an interrupt that a library swallowed
            return interrupted_exit()
        _error(cli_message(str(exc).splitlines()[0], command))
        return exc.exit_code
    except Exception:
        if was_interrupted() and not debug:  # e.g. a module left half-imported by Ctrl-C
            return interrupted_exit()
        raise
    if result == 130 or was_interrupted():  # typer turns Ctrl-C into exit code 130, silently
        return interrupted_exit()
    return int(result or 0)


if __name__ == "__main__":  # `python -m resstream.cli.main` (torchrun): as the console script
    from resstream.cli.entry import run

    run()
