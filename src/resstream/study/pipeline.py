"""What a reproduction is made of: named stages of steps.

A stage is a list of steps; a step is a resstream command line (run in this process, exactly
as if typed, or under torchrun for a distributed training step: `resstream.study.runner`) or a
small action that gathers what earlier steps wrote. Which stages the study has is
`resstream.study.stages`; how they are reused and resumed, `resstream.study.engine`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from resstream.study.plan import Plan

OUT = "{out}"  # stands for the reproduction's directory in recorded command lines


@dataclass(frozen=True)
class Step:
    """A resstream command line (OUT marks the reproduction's directory) or an action."""

    label: str
    argv: tuple[str, ...] = ()
    action: Callable[[Plan], None] | None = None
    distributed: bool = False  # a training command: under torchrun when nproc_per_node > 1

    def __post_init__(self) -> None:
        if not self.argv and self.action is None:
            raise ValueError(f"step {self.label!r} has neither a command line nor an action")

    def key(self) -> str:
        """What identifies the step inside its stage's record."""
        return " ".join(self.argv) if self.argv else f"action:{self.label}"


@dataclass(frozen=True)
class Stage:
    """A named stage: what it reads and which steps it runs."""

    name: str
    purpose: str
    settings: tuple[str, ...]  # `Plan.settings()` keys it depends on
    needs: tuple[str, ...]  # earlier stages whose results it reads
    datasets: Callable[[Plan], tuple[str, ...]]  # corpora whose content it reads
    steps: Callable[[Plan], list[Step]]  # built when the stage runs (it may read earlier output)
    applies: Callable[[Plan], bool] = lambda plan: True  # whether the plan's scale has it
    outputs: Callable[[Plan], list[Path]] = lambda plan: []  # what a finished stage left behind
