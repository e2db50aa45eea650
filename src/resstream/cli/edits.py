"""`--edit OP:SITE[:NUMBER]`: the stream's edits on the command line.

=====================  ========================================================
``add:L6.resid:4``     add 4 × the unit direction (`--direction`) to h_6
``project:L6.resid``   remove h_6's component along the direction
``keep:L6.resid``      keep only h_6's component along the direction
``scale:L3.resid:0.5`` attenuate block 3's identity path to 0.5·h_3 (on other
                       sites: scale the activation)
``set:L2.mlp:0``       set the activation to a number
``clamp:L2.N31:5``     set a neuron's coefficient to a number
=====================  ========================================================

SITE is the stream's grammar (``L6.resid``, ``L3.H2``, ``L5.N1031``, ``L4.mlp``, ``@p`` for
one position). `check_edit_specs` refuses a malformed spec before torch is imported;
`stream_edits` builds the edits once the model and its directions are loaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from resstream.cli.options import Count
from resstream.errors import UsageError

#: --direction and --method, as generate and steer take them.
DirectionOption = Annotated[
    Path | None,
    typer.Option("--direction", help="A directions file (directions.safetensors of `resstream directions`)."),
]
#: --where and --max-new-tokens, as generate and steer take them.
WhereOption = Annotated[
    Literal["all", "prompt", "new"],
    typer.Option(help="Where an edit without a position acts: all, prompt (its tokens) or new (generated)."),
]
NewTokensOption = Annotated[Count, typer.Option(help="New tokens per continuation.")]
MethodOption = Annotated[
    str,
    typer.Option(help="Which of the --direction file's directions an edit reads: diffmean, pca, probe."),
]

#: The operations, and whether each takes a number.
OPERATIONS = {"add": True, "project": False, "keep": False, "scale": True, "set": True, "clamp": True}
#: Operations that read the direction of `--direction`.
DIRECTED = ("add", "project", "keep")
EDIT_HELP = (
    "An edit OP:SITE[:NUMBER]; repeat for several. OP: add (NUMBER × the unit --direction), "
    "project / keep (remove / keep the --direction's component), scale (identity path of a "
    "residual state, else the activation), set, clamp (a neuron). SITE: L6.resid, L3.H2, "
    "L5.N1031, L4.mlp, ... (@p for one position). E.g. add:L6.resid:4."
)


@dataclass(frozen=True)
class EditSpec:
    """One ``--edit``: the operation, the site's name and its number (None where it takes none)."""

    operation: str
    site: str
    number: float | None

    @property
    def text(self) -> str:
        """The spec as given (``add:L6.resid:4``)."""
        return f"{self.operation}:{self.site}" + ("" if self.number is None else f":{self.number:g}")

    @property
    def directed(self) -> bool:
        """Whether it reads the direction of `--direction`."""
        return self.operation in DIRECTED


def parse_edit_spec(spec: str) -> EditSpec:
    """The `EditSpec` of one ``--edit`` value; UsageError naming the grammar otherwise."""
    parts = spec.strip().split(":")
    operation = parts[0].lower() if parts else ""
    if operation not in OPERATIONS:
        raise UsageError(
            f"--edit {spec!r}: unknown operation {operation!r}; allowed: {', '.join(OPERATIONS)}"
        )
    takes = OPERATIONS[operation]
    if len(parts) != (3 if takes else 2) or not parts[1]:
        shape = f"{operation}:SITE:NUMBER" if takes else f"{operation}:SITE"
        raise UsageError(f"--edit {spec!r}: expected {shape} (e.g. {_example(operation)})")
    number = None
    if takes:
        try:
            number = float(parts[2])
        except ValueError:
            raise UsageError(f"--edit {spec!r}: {parts[2]!r} is not a number") from None
        if not math.isfinite(number):
            raise UsageError(f"--edit {spec!r}: {parts[2]!r} is not finite; allowed: a finite number")
    return EditSpec(operation, parts[1], number)


def _example(operation: str) -> str:
    return {
        "add": "add:L6.resid:4",
        "project": "project:L6.resid",
        "keep": "keep:L6.resid",
        "scale": "scale:L3.resid:0.5",
        "set": "set:L2.mlp:0",
        "clamp": "clamp:L2.N31:5",
    }[operation]


def check_edit_specs(specs: Sequence[str] | None, direction: object) -> list[EditSpec]:
    """Every ``--edit`` parsed; UsageError for a malformed one, or one that reads a direction
    when no `--direction` is given."""
    parsed = [parse_edit_spec(spec) for spec in specs or ()]
    needing = [p for p in parsed if p.directed]
    if needing and direction is None:
        raise UsageError(
            f"--edit {needing[0].operation}:{needing[0].site} needs --direction (a directions file)"
        )
    return parsed


def stream_edits(specs: Sequence[EditSpec], direction_at: Callable[[str], Any]) -> list[Any]:
    """The stream's edits of the specs; `direction_at(site)` gives the unit direction a
    directed one reads at its site."""
    from resstream.stream.edits import Add, Clamp, Project, Scale, Set

    edits: list[Any] = []
    for spec in specs:
        number = spec.number if spec.number is not None else 0.0
        if spec.operation == "add":
            edits.append(Add(spec.site, direction_at(spec.site), coef=number))
        elif spec.operation in ("project", "keep"):
            edits.append(Project(spec.site, direction_at(spec.site), keep=spec.operation == "keep"))
        elif spec.operation == "scale":
            edits.append(Scale(spec.site, number))
        elif spec.operation == "set":
            edits.append(Set(spec.site, number))
        else:
            edits.append(Clamp(spec.site, number))
    return edits


__all__ = [
    "DIRECTED",
    "EDIT_HELP",
    "OPERATIONS",
    "EditSpec",
    "check_edit_specs",
    "parse_edit_spec",
    "stream_edits",
]
