"""Shell completion: `resstream --install-completion [SHELL]` and `--show-completion [SHELL]`.

The scripts, the installer and the detection of the current shell are Typer's own (the callbacks
of `typer.completion`). Typer's built-in options are flags that always detect the shell from the
process tree, so a script for another shell could not be asked for, and detection fails where no
shell started the process (a CI runner, a subprocess). Here the shell is an optional value: a
bare option means the current shell, ``--show-completion zsh`` means zsh. The top-level group
(`GroupWithCompletion`) gives a bare option the empty value before parsing (`shell_optional`),
as click has no option whose value may be left out.

Completing a command line is click's protocol: the installed script runs ``resstream`` with
``_RESSTREAM_COMPLETE=complete_bash`` (or zsh, fish, ...) in its environment; the completion
classes are registered when this module is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Annotated, Any

import typer
import typer.completion

from resstream.cli.help import GroupWithoutFlagTypes

#: The shells Typer writes completion scripts for.
SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
INSTALL = "--install-completion"
SHOW = "--show-completion"
#: The value of a bare --install-completion / --show-completion: the current shell.
CURRENT_SHELL = ""

typer.completion.completion_init()  # the classes that answer _RESSTREAM_COMPLETE=complete_<shell>


def shell_optional(args: list[str], commands: Collection[str]) -> list[str]:
    """`args` of the top-level command with a bare completion option given the empty value,
    ``--show-completion=``. An option is bare when no word follows it, or an option, or one of
    the `commands`; any other word is its value (a shell's name, else refused by the option).
    Only the options before the command's name are the top level's."""
    result = list(args)
    i = 0
    while i < len(result) and result[i].startswith("-"):
        if result[i] in (INSTALL, SHOW):
            following = result[i + 1] if i + 1 < len(result) else None
            if following is None or following.startswith("-") or following in commands:
                result[i] += "=" + CURRENT_SHELL
            else:
                i += 1  # its value
        i += 1
    return result


def _typer_completion(typer_callback: Callable[[Any, Any, Any], Any]) -> Callable[[Any, Any, Any], None]:
    """An option callback that hands the chosen shell (or, for the current shell, True) to
    Typer's callback, turning its `sys.exit` into `typer.Exit` so that `main` returns the code."""

    def callback(ctx: Any, param: Any, value: str | None) -> None:
        if value is None or ctx.resilient_parsing:
            return
        if value not in (CURRENT_SHELL, *SHELLS):
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(SHELLS)}")
        try:
            typer_callback(ctx, param, value or True)
        except SystemExit as exc:
            raise typer.Exit(exc.code if isinstance(exc.code, int) else 1) from None

    return callback


def _shells(incomplete: str) -> list[str]:
    """The shells' names that complete `incomplete`."""
    return [shell for shell in SHELLS if shell.startswith(incomplete)]


def _completion_option(flag: str, typer_callback: Callable[[Any, Any, Any], Any], does: str) -> Any:
    """The eager top-level option `flag` [SHELL] that runs Typer's `typer_callback`; `does`
    starts its help ("Install tab completion")."""
    shells = ", ".join(SHELLS)
    option = typer.Option(
        flag,
        metavar="[SHELL]",
        callback=_typer_completion(typer_callback),
        expose_value=False,
        is_eager=True,
        autocompletion=_shells,
        help=f"{does} for SHELL ({shells}; default: the current shell).",
    )
    return Annotated[str | None, option]


InstallCompletionOption = _completion_option(
    INSTALL, typer.completion.install_callback, "Install tab completion"
)
ShowCompletionOption = _completion_option(SHOW, typer.completion.show_callback, "Print the completion script")


class GroupWithCompletion(GroupWithoutFlagTypes):
    """The top-level group: `GroupWithoutFlagTypes` whose completion options may be given
    without a shell (`shell_optional`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, shell_optional(args, self.commands))
