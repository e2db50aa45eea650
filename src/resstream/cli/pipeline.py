"""`resstream reproduce`'s pipeline: the study as named stages of ordinary resstream commands.

A stage is a list of steps; a step is a resstream command line (run in this process, exactly
as if typed: `resstream shift ...`) or a small action that gathers what earlier steps wrote.
Stages, in order (`STAGE_TABLE`):

* ``tokens``: the sharded token store of the training corpus (scales that train on a streamed
  corpus: `paper`);
* ``shift``: `shift` and `lens` of each pretrained model on the analysis corpus;
* ``sweep``: `sweep`: baseline, a fixed cut per layer and the learned gate, per seed;
* ``eval``: every trained model (`sweep --benchmarks`) and every pretrained one (`eval --model`)
  on the benchmarks;
* ``compare``: `compare` of the sweep (baseline / best fixed cut / learned gate);
* ``misalignment``: `shift` of every trained model on held-out text, gathered per variant into
  misalignment.json (`resstream.reporting.misalignment`);
* ``report``: one self-contained report.html.

Reuse. A stage's fingerprint covers its settings (the `Plan` fields it reads), the content of
the corpora it reads and the results of the stages it needs. A stage that finished with the
same fingerprint is reused; a changed one runs again, and so does everything after it (a
stage's *result* id changes whenever it runs). Within a stage every finished step is recorded,
so an interrupted reproduction continues with the first step that did not finish; the commands
themselves resume too (a sweep keeps its finished runs). `only` runs one stage again whatever
its record says, once the stages it needs have finished. The record is ``DIR/reproduce.json``,
rewritten atomically after every step.
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
from typing import Any

from resstream.errors import RunError, UsageError, check_choice
from resstream.io import strict_json, write_json

FORMAT = "resstream-reproduce/1"
STATE_FILE = "reproduce.json"
#: The Table I sentence: every layer of each pretrained model decodes it (`resstream lens`).
LENS_TEXT = "The capital of France is Paris, and the river that runs through it is the Seine."
OUT = "{out}"  # stands for the reproduction's directory in recorded command lines

Log = Callable[[str], None]


# --------------------------------------------------------------------------- scales
@dataclass(frozen=True)
class Scale:
    """What one scale trains, evaluates and analyses (`SCALES`)."""

    name: str
    about: str
    models: tuple[str, ...]  # pretrained models of the shift and eval stages
    preset: str  # the training preset of every sweep run
    train_flags: tuple[str, ...]  # config flags on top of the preset
    seeds: tuple[int, ...]
    train_dataset: str  # the sweep's training corpus (the preset's)
    shift_dataset: str = "wikitext-2"
    shift_seqs: int = 64
    shift_seq_len: int = 128
    top_k: int = 5
    heldout_dataset: str = "wikitext-2"  # misalignment of the trained models
    heldout_seqs: int = 64
    benchmarks: tuple[str, ...] = ("wikitext-2", "lambada", "openwebtext", "fineweb-edu")
    max_eval_tokens: int | None = None
    shard_tokenizer: str | None = None  # a tokens stage runs first when set


SCALES: dict[str, Scale] = {
    scale.name: scale
    for scale in (
        Scale(
            name="tiny",
            about="a smoke test of the whole pipeline in about a minute: 2-layer models, 20 steps",
            models=("reference",),
            preset="tiny",
            train_flags=(),
            seeds=(0, 1),
            train_dataset="shakespeare",
            shift_seqs=8,
            shift_seq_len=32,
            heldout_seqs=8,
            benchmarks=("wikitext-2", "lambada"),
            max_eval_tokens=500,
        ),
        Scale(
            name="laptop",
            about="4-layer, 64-wide models on the built-in Shakespeare corpus, 3 seeds; "
            "about 25 minutes on 2 CPU cores",
            models=("reference",),
            preset="laptop",
            train_flags=("--max-steps", "300"),
            seeds=(0, 1, 2),
            train_dataset="shakespeare",
            benchmarks=("wikitext-2", "lambada", "openwebtext", "fineweb-edu", "shakespeare"),
            max_eval_tokens=20_000,
        ),
        Scale(
            name="paper",
            about="the paper's protocol: 12-layer GPT-2-style models on 10B tokens of FineWeb-Edu "
            "(bf16, torch.compile, fused AdamW; GPUs under torchrun)",
            models=("gpt2", "google/gemma-2-2b"),
            preset="paper",
            train_flags=(),
            seeds=(0,),
            train_dataset="fineweb-edu-10bt",
            shift_seqs=256,
            heldout_seqs=256,
            shard_tokenizer="gpt2",
        ),
    )
}


# --------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Plan:
    """One reproduction: a scale with the user's choices (what the fingerprints cover)."""

    scale: Scale
    out: Path
    models: tuple[str, ...]
    seeds: tuple[int, ...]
    data_dir: str | None = None
    device: str = "auto"
    nproc_per_node: int = 1
    quiet: bool = False

    def settings(self) -> dict[str, Any]:
        """Everything a stage may depend on, as plain data (paths and devices excluded)."""
        scale = dataclasses.asdict(self.scale)
        return {**scale, "models": list(self.models), "seeds": list(self.seeds)}

    def path(self, *parts: str) -> Path:
        """A path inside the reproduction's directory."""
        return self.out.joinpath(*parts)


def make_plan(
    scale: str,
    out: str | Path,
    *,
    models: Sequence[str] = (),
    seeds: Sequence[int] = (),
    data_dir: str | None = None,
    device: str = "auto",
    nproc_per_node: int = 1,
    quiet: bool = False,
) -> Plan:
    """Check the choices and build the plan (UsageError, one line, for a bad one)."""
    check_choice("scale", scale, SCALES)
    chosen = SCALES[scale]
    if nproc_per_node < 1:
        raise UsageError(f"`nproc_per_node` must be >= 1, got {nproc_per_node}")
    if any(seed < 0 for seed in seeds):
        raise UsageError(f"`seeds` must be >= 0, got {', '.join(map(str, seeds))}")
    return Plan(
        scale=chosen,
        out=Path(out),
        models=tuple(dict.fromkeys(models)) or chosen.models,
        seeds=tuple(dict.fromkeys(seeds)) or chosen.seeds,
        data_dir=data_dir,
        device=device,
        nproc_per_node=nproc_per_node,
        quiet=quiet,
    )


def model_slug(spec: str) -> str:
    """A folder name for a model spec ('google/gemma-2-2b' -> 'google--gemma-2-2b')."""
    text = Path(spec).name if Path(spec).is_dir() else spec
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text.replace("/", "--")) or "model"


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


def _common(plan: Plan) -> list[str]:
    flags = ["--device", plan.device] if plan.device != "auto" else []
    return [*flags, "--quiet"] if plan.quiet else flags


def _data_flags(plan: Plan) -> list[str]:
    return ["--data-dir", plan.data_dir] if plan.data_dir else []


def _sweep_argv(plan: Plan, *extra: str) -> tuple[str, ...]:
    s = plan.scale
    train_data = ["--dataset", f"{OUT}/tokens"] if s.shard_tokenizer else []
    device = ["--device", plan.device] if plan.device != "auto" else []
    return (
        "sweep",
        "--preset",
        s.preset,
        *s.train_flags,
        *train_data,
        "--seeds",
        ",".join(map(str, plan.seeds)),
        *device,
        *_data_flags(plan),
        *extra,
        *(["--quiet"] if plan.quiet else []),
        "--out",
        f"{OUT}/sweep",
    )


def _eval_flags(plan: Plan) -> list[str]:
    tokens = plan.scale.max_eval_tokens
    return [
        "--benchmarks",
        ",".join(plan.scale.benchmarks),
        *(["--max-eval-tokens", str(tokens)] if tokens else []),
    ]


def tokens_steps(plan: Plan) -> list[Step]:
    """Tokenise the training corpus into the sharded store the sweep reads."""
    s = plan.scale
    argv = ("tokenize", "--dataset", s.train_dataset, "--tokenizer", str(s.shard_tokenizer))
    return [
        Step(
            "tokenize",
            (*argv, *_data_flags(plan), *(["--quiet"] if plan.quiet else []), "--out", f"{OUT}/tokens"),
        )
    ]


def shift_steps(plan: Plan) -> list[Step]:
    """`shift` and `lens` of every pretrained model."""
    s = plan.scale
    steps = []
    for model in plan.models:
        slug = model_slug(model)
        shift = ("shift", "--model", model, "--dataset", s.shift_dataset, "--num-seqs", str(s.shift_seqs))
        shift += ("--seq-len", str(s.shift_seq_len), "--top-k", str(s.top_k), *_data_flags(plan))
        steps.append(Step(f"shift {model}", (*shift, *_common(plan), "--out", f"{OUT}/shift/{slug}")))
        lens = ("lens", "--model", model, "--text", LENS_TEXT, "--no-colour", *_common(plan))
        steps.append(Step(f"lens {model}", (*lens, "--out", f"{OUT}/lens/{slug}")))
    return steps


def sweep_steps(plan: Plan) -> list[Step]:
    """Train every run of the sweep (finished runs are kept)."""
    return [Step("sweep", _sweep_argv(plan), distributed=True)]


def eval_steps(plan: Plan) -> list[Step]:
    """Benchmarks of every trained run (cached in its eval.json) and every pretrained model."""
    tokens = plan.scale.max_eval_tokens
    steps = [Step("eval sweep", _sweep_argv(plan, *_eval_flags(plan)))]
    for model in plan.models:
        argv = ("eval", "--model", model, "--benchmarks", ",".join(plan.scale.benchmarks))
        argv += (*(["--max-tokens", str(tokens)] if tokens else []), *_data_flags(plan), *_common(plan))
        steps.append(Step(f"eval {model}", (*argv, "--out", f"{OUT}/eval/{model_slug(model)}")))
    return steps


def compare_steps(plan: Plan) -> list[Step]:
    """The baseline / best fixed cut / learned gate table."""
    argv = ("compare", f"{OUT}/sweep", *_eval_flags(plan), *_data_flags(plan), *_common(plan))
    return [Step("compare", (*argv, "--out", f"{OUT}/compare"))]


def misalignment_steps(plan: Plan) -> list[Step]:
    """`shift` of each seed's trained models on held-out text, then the per-variant table."""
    from resstream.training.records import find_runs

    s = plan.scale
    runs = find_runs(plan.path("sweep"))
    steps = []
    for seed in plan.seeds:
        models = [arg for run in runs if run.seed == seed for arg in ("--model", str(run.path))]
        argv = ("shift", *models, "--dataset", s.heldout_dataset, "--num-seqs", str(s.heldout_seqs))
        argv += ("--top-k", str(s.top_k), *_data_flags(plan), *_common(plan))
        steps.append(
            Step(f"shift of seed {seed}'s models", (*argv, "--out", f"{OUT}/misalignment/seed-{seed}"))
        )
    steps.append(Step("misalignment table", action=write_misalignment))
    return steps


def write_misalignment(plan: Plan) -> None:
    """Gather the per-seed shift.json files into misalignment.json / .csv / .md."""
    from resstream.io import write_text
    from resstream.reporting.misalignment import (
        TaggedShift,
        misalignment_csv,
        misalignment_markdown,
        misalignment_table,
    )
    from resstream.training.records import find_runs

    sweep = plan.path("sweep")
    runs = [run for run in find_runs(sweep) if run.seed in plan.seeds]
    tagged, first = [], None
    for seed in plan.seeds:
        shift = json.loads(
            plan.path("misalignment", f"seed-{seed}", "shift.json").read_text(encoding="utf-8")
        )
        first = first or shift
        mine = [run for run in runs if run.seed == seed]
        for run, entry in zip(mine, shift["models"], strict=True):  # shift keeps the --model order
            tagged.append(TaggedShift(seed, run.name, str(Path(run.path).relative_to(sweep)), entry))
    s = plan.scale
    table = misalignment_table(
        tagged,
        dataset=s.heldout_dataset,
        top_k=s.top_k,
        decoder="logit-lens",
        num_sequences=first["num_seqs"],
        seq_len=first["seq_len"],
    )
    folder = plan.path("misalignment")
    write_json(folder / "misalignment.json", table)
    write_text(folder / "misalignment.csv", misalignment_csv(table))
    write_text(folder / "misalignment.md", misalignment_markdown(table))


def report_steps(plan: Plan) -> list[Step]:
    """One self-contained report.html of everything above."""
    return [Step("report.html", action=write_study_report)]


def write_study_report(plan: Plan) -> None:
    """report.html in the reproduction's directory, from all its stages' outputs."""
    from resstream.reporting.report import find_outputs, write_report

    s = plan.scale
    note = (
        f"{s.name} scale: {s.about}; pretrained: {', '.join(plan.models)}; "
        f"seeds {', '.join(map(str, plan.seeds))}"
    )
    write_report(
        find_outputs([plan.out]), plan.out, title=f"resstream reproduction ({s.name} scale)", scale_note=note
    )


def _none(plan: Plan) -> tuple[str, ...]:
    return ()


STAGE_TABLE: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage(
            "tokens",
            "tokenise the training corpus into shards",
            ("train_dataset", "shard_tokenizer"),
            (),
            _none,
            tokens_steps,
            applies=lambda plan: plan.scale.shard_tokenizer is not None,
        ),
        Stage(
            "shift",
            "shift and lens of the pretrained models",
            ("models", "shift_dataset", "shift_seqs", "shift_seq_len", "top_k"),
            (),
            lambda p: (p.scale.shift_dataset,),
            shift_steps,
        ),
        Stage(
            "sweep",
            "train baseline, fixed cuts and learned gate per seed",
            ("preset", "train_flags", "seeds", "train_dataset"),
            ("tokens",),
            lambda p: () if p.scale.shard_tokenizer else (p.scale.train_dataset,),
            sweep_steps,
        ),
        Stage(
            "eval",
            "benchmarks of every trained and pretrained model",
            ("models", "benchmarks", "max_eval_tokens"),
            ("sweep",),
            lambda p: p.scale.benchmarks,
            eval_steps,
        ),
        Stage(
            "compare",
            "the comparison table",
            ("benchmarks", "max_eval_tokens"),
            ("eval",),
            _none,
            compare_steps,
        ),
        Stage(
            "misalignment",
            "shift of every trained model on held-out text",
            ("heldout_dataset", "heldout_seqs", "top_k", "seeds"),
            ("sweep",),
            lambda p: (p.scale.heldout_dataset,),
            misalignment_steps,
        ),
        Stage(
            "report",
            "report.html",
            ("name", "about", "models", "seeds"),
            ("shift", "sweep", "eval", "compare", "misalignment"),
            _none,
            report_steps,
        ),
    )
}


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


def stages_of(plan: Plan, table: Mapping[str, Stage] = STAGE_TABLE) -> list[Stage]:
    """The stages the plan runs, in order."""
    return [stage for stage in table.values() if stage.applies(plan)]


def reproduce(
    plan: Plan, *, only: str | None = None, log: Log = print, table: Mapping[str, Stage] = STAGE_TABLE
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


def check_stage(name: str, plan: Plan, table: Mapping[str, Stage] = STAGE_TABLE) -> None:
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
