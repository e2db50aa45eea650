"""The residual-attenuation study as `resstream reproduce` runs it: the paper's scales, a plan,
named stages of ordinary resstream command lines, reused by fingerprint and resumed step by step.

Its parts, from the study's content down to the engine that runs it:

* `scales`: what each scale (tiny, laptop, paper) trains, evaluates and analyses (`SCALES`);
* `plan`: one reproduction, a scale with the user's choices, checked first (`make_plan`);
* `stages`: the study's stages in order (`STAGE_TABLE`), whose steps are built by `steps`
  (tokens, shift, sweep, eval, compare, report) and `misalignment`, from the flags of `argv`;
* `pipeline`: what a stage and a step are (`Stage`, `Step`, `OUT`);
* `engine`: `reproduce`, which runs the stages, reusing and resuming them;
* `fingerprints`: what decides whether a finished stage is reused;
* `state`: the record that lets a reproduction resume (reproduce.json);
* `runner`: how a step's command line runs (in this process, by the `CommandRunner` the
  command-line interface installs, or under torchrun) and is recorded.

Nothing here imports `resstream.cli`: the `reproduce` command is a thin layer over this package.
The names below are imported on first use, so that the command line, which installs its
runner at start-up (`runner.use_command_runner`), does not load the engine until it runs.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

if _TYPE_CHECKING:
    from resstream.study.engine import StageOutcome, check_stage, reproduce, stages_of
    from resstream.study.fingerprints import corpus_fingerprints, stage_fingerprint
    from resstream.study.misalignment import misalignment_steps, write_misalignment
    from resstream.study.pipeline import OUT, Stage, Step
    from resstream.study.plan import Plan, make_plan, model_dirs, model_slug
    from resstream.study.runner import (
        CommandRunner,
        command_line,
        expand,
        launcher,
        run_command,
        use_command_runner,
    )
    from resstream.study.scales import SCALES, Scale
    from resstream.study.stages import STAGE_TABLE
    from resstream.study.state import FORMAT, STATE_FILE, StageRecord, State, load_state
    from resstream.study.steps import (
        LENS_TEXT,
        compare_steps,
        eval_steps,
        report_steps,
        shift_steps,
        sweep_steps,
        tokens_steps,
        write_study_report,
    )

#: The module of each public name.
_MODULE_OF = {
    "CommandRunner": "runner",
    "FORMAT": "state",
    "LENS_TEXT": "steps",
    "OUT": "pipeline",
    "Plan": "plan",
    "SCALES": "scales",
    "STAGE_TABLE": "stages",
    "STATE_FILE": "state",
    "Scale": "scales",
    "Stage": "pipeline",
    "StageOutcome": "engine",
    "StageRecord": "state",
    "State": "state",
    "Step": "pipeline",
    "check_stage": "engine",
    "command_line": "runner",
    "compare_steps": "steps",
    "corpus_fingerprints": "fingerprints",
    "eval_steps": "steps",
    "expand": "runner",
    "launcher": "runner",
    "load_state": "state",
    "make_plan": "plan",
    "misalignment_steps": "misalignment",
    "model_dirs": "plan",
    "model_slug": "plan",
    "report_steps": "steps",
    "reproduce": "engine",
    "run_command": "runner",
    "shift_steps": "steps",
    "stage_fingerprint": "fingerprints",
    "stages_of": "engine",
    "sweep_steps": "steps",
    "tokens_steps": "steps",
    "use_command_runner": "runner",
    "write_misalignment": "misalignment",
    "write_study_report": "steps",
}

__all__ = [
    "FORMAT",
    "LENS_TEXT",
    "OUT",
    "SCALES",
    "STAGE_TABLE",
    "STATE_FILE",
    "CommandRunner",
    "Plan",
    "Scale",
    "Stage",
    "StageOutcome",
    "StageRecord",
    "State",
    "Step",
    "check_stage",
    "command_line",
    "compare_steps",
    "corpus_fingerprints",
    "eval_steps",
    "expand",
    "launcher",
    "load_state",
    "make_plan",
    "misalignment_steps",
    "model_dirs",
    "model_slug",
    "report_steps",
    "reproduce",
    "run_command",
    "shift_steps",
    "stage_fingerprint",
    "stages_of",
    "sweep_steps",
    "tokens_steps",
    "use_command_runner",
    "write_misalignment",
    "write_study_report",
]


def __getattr__(name: str) -> object:
    """The public names, imported from their module on first use."""
    if name in _MODULE_OF:
        return getattr(_importlib.import_module(f"resstream.study.{_MODULE_OF[name]}"), name)
    raise AttributeError(f"module 'resstream.study' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names with the public ones, which exist before they are imported."""
    return sorted({*globals(), *__all__})
