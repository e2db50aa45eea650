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
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resstream.errors import RunError, UsageError, check_choice
from resstream.io import strict_json, write_json

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


def run_command(argv: Sequence[str], plan: Plan, log_file: Path, *, distributed: bool = False) -> None:
    """Run one resstream command: in this process, or under torchrun for a distributed
    training step with `nproc_per_node` > 1. What it prints on stdout is appended to
    `log_file` (progress and notes stay on stderr); errors propagate as the command raised them."""
    args = expand(argv, plan.out)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8") as log:
        log.write(f"$ resstream {' '.join(args)}\n")
        log.flush()
        if distributed and plan.nproc_per_node > 1:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            launcher += ["--nproc_per_node", str(plan.nproc_per_node), "-m", "resstream.cli.main"]
            done = subprocess.run([*launcher, *args], stdout=log, check=False)
            if done.returncode:
                raise RunError(
                    f"`{args[0]}` under torchrun ({plan.nproc_per_node} processes) exited with "
                    f"{done.returncode}; its output is in {str(log_file)!r}"
                )
            return
        from resstream.cli.main import app

        with contextlib.redirect_stdout(log):
            app(args=args, prog_name="resstream", standalone_mode=False)


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
            _check_needs(table[only], stages, plan, state)
        corpora = corpus_fingerprints([d for s in chosen for d in s.datasets(plan)], plan.data_dir)
        return [_run_stage(stage, plan, state, corpora, forced=only is not None, log=log) for stage in chosen]


def check_stage(name: str, plan: Plan, table: Mapping[str, Stage]) -> None:
    """Refuse a stage name that is unknown or not part of the plan's scale."""
    check_choice("stage", name, table)
    names = [stage.name for stage in stages_of(plan, table)]
    if name not in names:
        raise UsageError(
            f"stage {name!r} is not part of the {plan.scale.name} scale; its stages: {', '.join(names)}"
        )


def _check_needs(stage: Stage, stages: Sequence[Stage], plan: Plan, state: State) -> None:
    present = {s.name for s in stages}
    missing = [
        name
        for name in stage.needs
        if name in present and (name not in state.stages or state.stages[name].status != "done")
    ]
    if missing:
        raise UsageError(
            f"stage {stage.name!r} needs {', '.join(map(repr, missing))} finished in `out` "
            f"{str(plan.out)!r}; run the reproduction without `only` first"
        )


def _run_stage(
    stage: Stage, plan: Plan, state: State, corpora: dict[str, str], *, forced: bool, log: Log
) -> StageOutcome:
    fingerprint = stage_fingerprint(stage, plan, state, corpora)
    record = state.stages.get(stage.name)
    if not forced and record is not None and record.status == "done" and record.fingerprint == fingerprint:
        log(f"reproduce: {stage.name}: reused (finished earlier with the same inputs)")
        return StageOutcome(stage.name, False, 0.0)
    if forced or record is None or record.fingerprint != fingerprint:
        record = StageRecord(fingerprint)
    record.status = "running"
    state.stages[stage.name] = record
    start = time.perf_counter()
    steps = stage.steps(plan)
    record.commands = [("resstream " + " ".join(s.argv)) if s.argv else s.label for s in steps]
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
        record.steps_done.append(step.key())
        state.save(plan.out)
    record.seconds += time.perf_counter() - start
    record.status = "done"
    record.result = _digest({"fingerprint": fingerprint, "finished": time.time()})
    state.save(plan.out)
    return StageOutcome(stage.name, True, record.seconds)
