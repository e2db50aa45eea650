"""How `--help` shows options and commands.

A flag (an option that takes no value) shows no type: Typer labels every option with its type,
flags too (`--resume <bool>`), which reads as if the flag wanted a value. The command and group
classes here blank the type of every flag, `--help` included; options with values keep theirs
(`--seq-len <int>`).

`resstream --help` lists each command with a summary: the first sentence of its help, on one
line (`command_summary`). Typer would show the whole first paragraph with the docstring's own
line breaks kept, so a description broke mid-sentence wherever the source line ended.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from typer.core import TyperCommand, TyperGroup


class _FlagsShowNoType:
    """Mixin for a click command or group: its help shows every flag without a type (each
    flag is given an empty metavar, which help shows in the type's place)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class FlagsWithoutTypes(_FlagsShowNoType, TyperCommand):
    """A command whose help shows flags without a type."""


#: Where a sentence ends: ".", "!" or "?" followed by a space and a capital, a backtick or "(".
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(])")


def command_summary(help_text: str) -> str:
    """A command's summary in the command list: the first sentence of its help's first
    paragraph, every run of whitespace (the docstring's line breaks included) one space."""
    paragraph = inspect.cleandoc(help_text).split("\n\n")[0]
    return _SENTENCE_END.split(" ".join(paragraph.split()), maxsplit=1)[0]


class GroupWithoutFlagTypes(_FlagsShowNoType, TyperGroup):
    """The top-level group, whose help shows flags without a type and lists each command with
    its one-sentence summary (`command_summary`) unless the command sets its own short help."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.short_help is None and command.help:
            command.short_help = command_summary(command.help)
        return command
