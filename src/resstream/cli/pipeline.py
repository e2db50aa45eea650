"""The engine of `resstream reproduce`: named stages of steps, reused by fingerprint, resumed.

A stage is a list of steps; a step is a resstream command line (run in this process, exactly
as if typed, or under torchrun for a distributed training step) or a small action that
gathers what earlier steps wrote. Which stages a study has is `resstream.cli.study`.

Reuse. A stage's fingerprint covers its settings (the `Plan.settings()` keys it names), the
content of the corpora it reads and the results of the stages it needs. A stage that finished
with the same fingerprint is reused; a changed one runs again, and so does everything after it
(a stage's *result* id changes whenever it runs). Within a stage every finished step is
recorded, so an interrupted reproduction continues with the first step that did not finish;
the commands themselves resume too (a sweep keeps its finished runs). `only` runs one stage
again whatever its record says, once the stages it needs have finished. The record is
``DIR/reproduce.json``, rewritten atomically after every step; what the commands print on
stdout goes to ``DIR/logs/<stage>.log``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resstream.errors import RunError, UsageError, check_choice
from resstream.interrupts import raise_if_interrupted
from resstream.io import check_below, folder_inside, open_log, strict_json, write_json

if TYPE_CHECKING:
    from resstream.cli.study import Plan

FORMAT = "resstream-reproduce/1"
STATE_FILE = "reproduce.json"
OUT = "{out}"  # stands for the reproduction's directory in recorded command lines

Log = Callable[[str], None]


# --------------------------------------------------------------------------- steps and stages
@dataclass(frozen=True)
class Step:
    """A resstream command line (OUT marks the reproduction's directory) or an action."""

    label: str
    argv: tuple[str, ...] = ()
    action: Callable[[Plan], None] | None = None
    distributed: bool = False  # a training command: under torchrun when nproc_per_node > 1

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


# --------------------------------------------------------------------------- the record
@dataclass
class StageRecord:
    """What reproduce.json keeps of one stage."""

    fingerprint: str
    status: str = "running"  # running | done
    steps_done: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    result: str | None = None  # changes whenever the stage finishes a run
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data for reproduce.json."""
        return dataclasses.asdict(self)


@dataclass
class State:
    """reproduce.json: the scale and every stage's record."""

    scale: str
    stages: dict[str, StageRecord] = field(default_factory=dict)

    def save(self, out: Path) -> None:
        """Rewrite reproduce.json atomically."""
        stages = {name: record.to_dict() for name, record in self.stages.items()}
        write_json(out / STATE_FILE, {"format": FORMAT, "scale": self.scale, "stages": stages})


def load_state(out: Path, scale: str) -> State:
    """The record in `out` (a fresh one when there is none); UsageError for another scale's."""
    path = out / STATE_FILE
    if not path.exists():
        return State(scale)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            raise ValueError("not a resstream reproduction record")
        stages = {name: StageRecord(**record) for name, record in data["stages"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"{str(path)!r} is not a readable reproduction record ({exc}); use another `out`"
        ) from None
    if data["scale"] != scale:
        raise UsageError(
            f"`out` {str(out)!r} holds a {data['scale']}-scale reproduction, not {scale}; use another `out`"
        )
    return State(scale, stages)


def _digest(obj: Any) -> str:
    return hashlib.sha256(strict_json(obj, sort_keys=True).encode()).hexdigest()[:16]


def stage_fingerprint(stage: Stage, plan: Plan, state: State, corpora: dict[str, str]) -> str:
    """Of the stage's settings, its corpora's content and the results of the stages it needs."""
    settings = plan.settings()
    upstream = {name: state.stages[name].result for name in stage.needs if name in state.stages}
    return _digest(
        {
            "stage": stage.name,
            "settings": {key: settings[key] for key in stage.settings},
            "corpora": {name: corpora[name] for name in stage.datasets(plan)},
            "upstream": upstream,
        }
    )


def corpus_fingerprints(names: Sequence[str], data_dir: str | None) -> dict[str, str]:
    """The content fingerprint of each named corpus; UsageError when one cannot be read."""
    from resstream.data import default_split, stream_corpus

    found = {}
    for name in dict.fromkeys(names):
        stream = stream_corpus(name, split=default_split(name), data_dir=data_dir)
        found[name] = stream.scan()
    return found


# --------------------------------------------------------------------------- running
def expand(argv: Sequence[str], out: Path) -> list[str]:
    """A recorded command line with OUT replaced by the reproduction's directory."""
    return [arg.replace(OUT, str(out)) for arg in argv]


def launcher(plan: Plan, distributed: bool) -> list[str]:
    """What starts a command: `resstream`, or torchrun for a distributed training step with
    `nproc_per_node` > 1 (as `command_line` records it)."""
    if distributed and plan.nproc_per_node > 1:
        return [
            "torchrun",
            "--standalone",
            "--nproc_per_node",
            str(plan.nproc_per_node),
            "-m",
            "resstream.cli.main",
        ]
    return ["resstream"]


def command_line(step: Step, plan: Plan) -> str:
    """The step as a shell command a person can paste (OUT still marks the directory)."""
    return shlex.join([*launcher(plan, step.distributed), *step.argv]) if step.argv else step.label


def _check_out_inside(plan: Plan, args: Sequence[str]) -> None:
    """A step's --out inside the reproduction's directory is reached without a link (in this
    process the nested lock checks it too; a torchrun child holds no lock of ours)."""
    if "--out" in args[:-1]:
        check_below(plan.out, args[args.index("--out") + 1], "a directory")


def run_command(argv: Sequence[str], plan: Plan, log_file: Path, *, distributed: bool = False) -> None:
    """Run one resstream command: in this process, or under torchrun for a distributed
    training step with `nproc_per_node` > 1. What it prints on stdout is appended to
    `log_file` (progress and notes stay on stderr). An error propagates as the command raised
    it; an interrupted command raises KeyboardInterrupt, one that exits otherwise RunError."""
    from resstream.interrupts import was_interrupted

    args = expand(argv, plan.out)
    folder_inside(plan.out, log_file.parent)  # never through a link planted in the directory
    _check_out_inside(plan, args)
    with open_log(log_file) as log:
        log.write(f"$ {shlex.join([*launcher(plan, distributed), *args])}\n")
        log.flush()
        if distributed and plan.nproc_per_node > 1:
            torchrun = [sys.executable, "-m", "torch.distributed.run", *launcher(plan, distributed)[1:]]
            code = subprocess.run([*torchrun, *args], stdout=log, check=False).returncode
        else:
            from resstream.cli.main import app

            with contextlib.redirect_stdout(log):
                code = app(args=args, prog_name="resstream", standalone_mode=False)
    if code == 130 or was_interrupted():  # typer turns Ctrl-C inside a command into exit code 130
        raise KeyboardInterrupt
    if code:
        raise RunError(f"`resstream {args[0]}` exited with {code}; what it printed is in {str(log_file)!r}")


@dataclass(frozen=True)
class StageOutcome:
    """How one stage went: ran or reused, and how long it took."""

    name: str
    ran: bool
    seconds: float


def stages_of(plan: Plan, table: Mapping[str, Stage]) -> list[Stage]:
    """The stages the plan runs, in order."""
    return [stage for stage in table.values() if stage.applies(plan)]


def reproduce(
    plan: Plan, table: Mapping[str, Stage], *, only: str | None = None, log: Log = print
) -> list[StageOutcome]:
    """Run the plan's stages of `table` (or `only` one), reusing finished ones (module docstring)."""
    from resstream.rundir import locked_directory

    stages = stages_of(plan, table)
    if only is not None:
        check_stage(only, plan, table)
    with locked_directory(plan.out, "reproduce"):
        state = load_state(plan.out, plan.scale.name)
        chosen = [s for s in stages if only is None or s.name == only]
        if only is not None:
            _check_needs(table[only], stages, plan, state, None)  # unfinished: no need to read corpora
        corpora = corpus_fingerprints([d for s in stages for d in s.datasets(plan)], plan.data_dir)
        if only is not None:
            _check_needs(table[only], stages, plan, state, corpora)
        return [_run_stage(stage, plan, state, corpora, forced=only is not None, log=log) for stage in chosen]


def check_stage(name: str, plan: Plan, table: Mapping[str, Stage]) -> None:
    """Refuse a stage name that is unknown or not part of the plan's scale."""
    check_choice("stage", name, table)
    names = [stage.name for stage in stages_of(plan, table)]
    if name not in names:
        raise UsageError(
            f"stage {name!r} is not part of the {plan.scale.name} scale; its stages: {', '.join(names)}"
        )


def _check_needs(
    stage: Stage, stages: Sequence[Stage], plan: Plan, state: State, corpora: dict[str, str] | None
) -> None:
    """`only` runs a stage on what the stages it needs left: they must have finished, for this
    plan (same fingerprint; not compared when `corpora` is None), with their outputs in place."""
    missing = [
        need.name for need in stages if need.name in stage.needs and not _finished(need, plan, state, corpora)
    ]
    if missing:
        raise UsageError(
            f"stage {stage.name!r} needs {', '.join(map(repr, missing))} finished for these settings "
            f"in `out` {str(plan.out)!r}; run the reproduction without `only` first"
        )


def _finished(stage: Stage, plan: Plan, state: State, corpora: dict[str, str] | None) -> bool:
    """Whether the stage finished with the fingerprint the plan gives it now (not compared when
    `corpora` is None), and its outputs are all still there."""
    record = state.stages.get(stage.name)
    return (
        record is not None
        and record.status == "done"
        and (corpora is None or record.fingerprint == stage_fingerprint(stage, plan, state, corpora))
        and all(path.exists() for path in stage.outputs(plan))
    )


def _run_stage(
    stage: Stage, plan: Plan, state: State, corpora: dict[str, str], *, forced: bool, log: Log
) -> StageOutcome:
    fingerprint = stage_fingerprint(stage, plan, state, corpora)
    record = state.stages.get(stage.name)
    if not forced and _finished(stage, plan, state, corpora):
        log(f"reproduce: {stage.name}: reused (finished earlier with the same inputs)")
        return StageOutcome(stage.name, False, 0.0)
    if forced or record is None or record.fingerprint != fingerprint or record.status == "done":
        record = StageRecord(fingerprint)  # a finished stage whose outputs went missing starts again
    record.status = "running"
    state.stages[stage.name] = record
    start = time.perf_counter()
    steps = stage.steps(plan)
    record.commands = [command_line(step, plan) for step in steps]
    state.save(plan.out)
    for index, step in enumerate(steps, 1):
        if step.key() in record.steps_done:
            log(f"reproduce: {stage.name} [{index}/{len(steps)}] {step.label}: done earlier")
            continue
        log(f"reproduce: {stage.name} [{index}/{len(steps)}] {step.label}")
        if step.argv:
            run_command(step.argv, plan, plan.path("logs", f"{stage.name}.log"), distributed=step.distributed)
        else:
            step.action(plan)
        raise_if_interrupted()  # a Ctrl-C that a library swallowed: the step did not finish
        record.steps_done.append(step.key())
        state.save(plan.out)
    record.seconds += time.perf_counter() - start
    record.status = "done"
    record.result = _digest({"fingerprint": fingerprint, "finished": time.time()})
    state.save(plan.out)
    return StageOutcome(stage.name, True, record.seconds)
