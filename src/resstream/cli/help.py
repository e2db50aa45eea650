"""How `--help` shows options: a flag (an option that takes no value) shows no type.

Typer labels every option with its type, flags too (`--resume <bool>`), which reads as if the
flag wanted a value. The command and group classes here blank the type of every flag,
`--help` included; options with values keep theirs (`--seq-len <int>`).
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup


def _without_flag_types(params: list[Any]) -> list[Any]:
    """The parameters, each flag given an empty metavar (help shows the metavar as its type)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class FlagsWithoutTypes(TyperCommand):
    """A command whose help shows flags without a type."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))


class GroupWithoutFlagTypes(TyperGroup):
    """The top-level group, whose help shows flags without a type."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))
