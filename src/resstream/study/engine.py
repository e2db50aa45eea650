"""The engine of `resstream reproduce`: run a plan's stages, reusing finished ones by
fingerprint and resuming an interrupted one.

Reuse. A stage's fingerprint covers its settings, the content of the corpora it reads and the
results of the stages it needs (`resstream.study.fingerprints`). A stage that finished with the
same fingerprint is reused; a changed one runs again, and so does everything after it (a
stage's *result* id changes whenever it runs). Within a stage every finished step is recorded,
so an interrupted reproduction continues with the first step that did not finish; the commands
themselves resume too (a sweep keeps its finished runs). `only` runs one stage again whatever
its record says, once the stages it needs have finished. The record is ``DIR/reproduce.json``
(`resstream.study.state`), rewritten atomically after every step; what the commands print on
stdout goes to ``DIR/logs/<stage>.log`` (`resstream.study.runner`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from resstream.errors import UsageError, check_choice
from resstream.interrupts import raise_if_interrupted
from resstream.study.fingerprints import corpus_fingerprints, result_id, stage_fingerprint
from resstream.study.pipeline import Stage, Step
from resstream.study.plan import Plan
from resstream.study.runner import CommandRunner, command_line, run_command
from resstream.study.state import StageRecord, State, load_state

Log = Callable[[str], None]


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
    plan: Plan,
    table: Mapping[str, Stage],
    *,
    only: str | None = None,
    log: Log = print,
    runner: CommandRunner | None = None,
) -> list[StageOutcome]:
    """Run the plan's stages of `table` (or `only` one), reusing finished ones (module
    docstring); command lines run in this process by `runner` (default: the installed one,
    `resstream.study.runner.use_command_runner`)."""
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
        run = _StageRun(plan, state, corpora, forced=only is not None, log=log, runner=runner)
        return [run.stage(stage) for stage in chosen]


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


@dataclass
class _StageRun:
    """What running the chosen stages of one reproduction shares: its plan, record, corpora."""

    plan: Plan
    state: State
    corpora: dict[str, str]
    forced: bool  # `only`: run the stage whatever its record says
    log: Log
    runner: CommandRunner | None

    def stage(self, stage: Stage) -> StageOutcome:
        """Reuse the stage, or run its unfinished steps, recording each one."""
        plan, state = self.plan, self.state
        fingerprint = stage_fingerprint(stage, plan, state, self.corpora)
        record = state.stages.get(stage.name)
        if not self.forced and _finished(stage, plan, state, self.corpora):
            self.log(f"reproduce: {stage.name}: reused (finished earlier with the same inputs)")
            return StageOutcome(stage.name, False, 0.0)
        if self.forced or record is None or record.fingerprint != fingerprint or record.status == "done":
            record = StageRecord(fingerprint)  # a finished stage whose outputs went missing starts again
        record.status = "running"
        state.stages[stage.name] = record
        start = time.perf_counter()
        steps = stage.steps(plan)
        record.commands = [command_line(step, plan) for step in steps]
        state.save(plan.out)
        for index, step in enumerate(steps, 1):
            self.step(stage, step, f"[{index}/{len(steps)}]", record)
        record.seconds += time.perf_counter() - start
        record.status = "done"
        record.result = result_id(fingerprint)
        state.save(plan.out)
        return StageOutcome(stage.name, True, record.seconds)

    def step(self, stage: Stage, step: Step, counter: str, record: StageRecord) -> None:
        """Run one step of the stage unless its record says it finished earlier."""
        if step.key() in record.steps_done:
            self.log(f"reproduce: {stage.name} {counter} {step.label}: done earlier")
            return
        self.log(f"reproduce: {stage.name} {counter} {step.label}")
        if step.argv:
            log_file = self.plan.path("logs", f"{stage.name}.log")
            run_command(step.argv, self.plan, log_file, distributed=step.distributed, runner=self.runner)
        elif step.action is not None:  # a step without a command line has an action (`Step`)
            step.action(self.plan)
        raise_if_interrupted()  # a Ctrl-C that a library swallowed: the step did not finish
        record.steps_done.append(step.key())
        self.state.save(self.plan.out)
