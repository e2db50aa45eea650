"""How `--help` shows options: a flag (an option that takes no value) shows no type.

Typer labels every option with its type, flags too (`--resume <bool>`), which reads as if the
flag wanted a value. The command and group classes here blank the type of every flag,
`--help` included; options with values keep theirs (`--seq-len <int>`).
"""

from __future__ import annotations

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


class GroupWithoutFlagTypes(_FlagsShowNoType, TyperGroup):
    """The top-level group, whose help shows flags without a type."""
