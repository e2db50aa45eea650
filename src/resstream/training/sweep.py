"""Residual-attenuation sweeps: run the experiments, collect their results.

For every seed a sweep trains

- `baseline`: gate `none` (α = 1 everywhere);
- `fixed-k<k>`: gate `fixed`, α at layer k, for each chosen cut layer k (all layers by default);
- `learned`: gate `learned` (unless switched off),

all with the same seed and therefore the same initial weights and the same batches (the
trainer's data order is a pure function of seed and step). Runs live in
`DIR/seed-<s>/<name>/`; a run whose `model.json` exists is finished and is skipped when a
sweep is restarted, an interrupted one resumes from its latest checkpoint. Ctrl-C during a run
finishes its current step, checkpoints it and stops the sweep, so nothing trained is lost.

After training, every run can be evaluated on benchmarks (`eval.json` in the run directory).
The sweep writes `DIR/sweep.json` (per seed, per run: gate, cut layer, α, final validation
loss, evaluation results) and, per seed, the learned gate's distribution over training
(`DIR/seed-<s>/learned/gate_history.json`). The records written and returned, and reading
them back from disk, are `resstream.training.records`; tables and plots are drawn from them by
`resstream.reporting`.

This module also gives runs the benchmark scores a comparison asks for (`fill_evals`, for the
sweep and `resstream compare`): a score cached in a run's eval.json is reused only when it was
made with the same `max_tokens`, of the same weights and on the same benchmark text
(`stale_reason`); every other one is evaluated again, and the summary says which were which.
The settings of those evaluations are one `resstream.training.evaluate.EvalSettings`.

The module stays in one piece because each part is a step of the one sweep (plan it, train its
runs, score them, collect them); the scoring step is the part `compare` calls on its own.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resstream.errors import UsageError
from resstream.io import run_record, write_json
from resstream.rundir import locked_directory, write_failure
from resstream.training import checkpoint as ckpt
from resstream.training.budget import check_training_budget
from resstream.training.config import GateKind, TrainConfig, from_dict, identity_diff, validate
from resstream.training.records import (
    EVAL_FILE,
    GATE_HISTORY_FILE,
    MODEL_META,
    SWEEP_FILE,
    RunRecord,
    Scores,
    SweepResult,
    eval_entries,
    gate_history,
    normalise_eval,
    read_eval,
    read_json,
    record_from_run_dir,
)

if TYPE_CHECKING:
    from resstream.training.evaluate import (
        BenchmarkData,
        EvalPlan,
        EvalSettings,
        PreparedBenchmark,
        RunsEstimate,
    )

Log = Callable[[str], None]


# --------------------------------------------------------------------------- planning
@dataclass(frozen=True)
class PlannedRun:
    """One training run of a sweep."""

    seed: int
    name: str  # baseline, fixed-k<k>, learned
    config: TrainConfig

    def path(self, root: str | Path) -> Path:
        """The run's directory inside the sweep directory `root`."""
        return Path(root) / f"seed-{self.seed}" / self.name


@dataclass(frozen=True)
class SweepPlan:
    """Every run of a sweep, in training order (seed by seed)."""

    base: TrainConfig
    seeds: tuple[int, ...]
    layers: tuple[int, ...]
    learned: bool
    runs: tuple[PlannedRun, ...]

    @property
    def alpha(self) -> float:
        """The identity-path scale of the fixed cuts."""
        return self.base.model.alpha

    @property
    def n_layer(self) -> int:
        """Number of layers of every model in the sweep."""
        return self.base.model.n_layer


def check_layers(layers: Iterable[int], n_layer: int) -> tuple[int, ...]:
    """Sorted unique cut layers; each must lie in [0, n_layer)."""
    layers = tuple(sorted(set(layers)))
    for k in layers:
        if not 0 <= k < n_layer:
            raise UsageError(f"`layers`: {k} is outside [0, {n_layer}) for {n_layer} layers")
    return layers


def run_config(base: TrainConfig, *, seed: int, gate: GateKind, cut_layer: int = -1) -> TrainConfig:
    """`base` with the seed and residual gate of one sweep run."""
    model = dataclasses.replace(base.model, gate=gate, cut_layer=cut_layer)
    config = dataclasses.replace(base, model=model, run=dataclasses.replace(base.run, seed=seed))
    validate(config)
    return config


def plan_sweep(
    base: TrainConfig,
    *,
    seeds: Sequence[int] | None = None,
    layers: Sequence[int] | None = None,
    learned: bool = True,
) -> SweepPlan:
    """Plan baseline, fixed cuts (at `layers`, default all) and learned gate for each seed."""
    check_training_budget(base)  # before planning a run per layer of an absurd `n_layer`
    seeds = tuple(dict.fromkeys(seeds)) if seeds else (base.run.seed,)
    n_layer = base.model.n_layer
    layers = check_layers(range(n_layer) if layers is None else layers, n_layer)
    if not layers:
        raise UsageError("`layers`: no cut layer given")
    runs = []
    for seed in seeds:
        runs.append(PlannedRun(seed, "baseline", run_config(base, seed=seed, gate="none")))
        runs += [
            PlannedRun(seed, f"fixed-k{k}", run_config(base, seed=seed, gate="fixed", cut_layer=k))
            for k in layers
        ]
        if learned:
            runs.append(PlannedRun(seed, "learned", run_config(base, seed=seed, gate="learned")))
    return SweepPlan(base=base, seeds=seeds, layers=layers, learned=learned, runs=tuple(runs))


def config_diffs(saved: dict[str, Any], planned: TrainConfig) -> list[str]:
    """What differs between a finished run's saved config and the planned one."""
    old = from_dict(saved)
    if planned.model.vocab_size == 0:  # resolved from the tokenizer when the run was trained
        planned = dataclasses.replace(
            planned, model=dataclasses.replace(planned.model, vocab_size=old.model.vocab_size)
        )
    diffs = identity_diff(old, planned)
    for section, names in (
        ("run", ("max_steps", "batch_size", "seed")),
        ("optim", tuple(f.name for f in dataclasses.fields(planned.optim))),
    ):
        for name in names:
            a, b = getattr(getattr(old, section), name), getattr(getattr(planned, section), name)
            if a != b:
                diffs.append(f"{section}.{name}: {a!r} -> {b!r}")
    return diffs


def check_existing(plan: SweepPlan, out_dir: str | Path) -> None:
    """Refuse to restart a sweep in `out_dir` whose finished runs were trained with another
    config, or whose interrupted runs were checkpointed past the planned `max_steps`."""
    from resstream.training.resume import check_resume_steps

    for run in plan.runs:
        meta = read_json(run.path(out_dir) / MODEL_META)
        if meta is None:
            step = ckpt.latest_checkpoint_step(run.path(out_dir))
            check_resume_steps(step, run.config.run.max_steps, run.path(out_dir))
            continue
        diffs = config_diffs(meta.get("config", {}), run.config)
        if diffs:
            raise UsageError(
                f"`out_dir` {str(out_dir)!r} already holds run seed-{run.seed}/{run.name} trained with a "
                f"different config ({'; '.join(diffs[:3])}); choose another `out_dir`"
            )


# ----------------------------------------------------------------------------- evaluation
def stale_reason(
    entry: Mapping[str, Any] | None,
    *,
    max_tokens: int | None,
    model_fingerprint: str | None,
    corpus_fingerprint: str | None,
) -> str | None:
    """Why a cached eval.json entry does not answer what is asked now (None: it does).

    It must exist, have been scored with the same `max_tokens`, of the same weights (model
    fingerprint) and, when the benchmark's text can be read now (`corpus_fingerprint`), on the
    same text. An entry that does not record its settings (written before they were recorded)
    never matches.
    """
    if entry is None:
        return "not evaluated before"
    if "max_tokens" not in entry or "model_fingerprint" not in entry:
        return "cached without its settings"
    if entry["max_tokens"] != max_tokens:
        cap = entry["max_tokens"]
        return f"cached with max_tokens {'unset' if cap is None else cap}"
    if entry["model_fingerprint"] != model_fingerprint:
        return "cached for other weights"
    if corpus_fingerprint is not None and entry.get("fingerprint") != corpus_fingerprint:
        return "cached on other benchmark data"
    return None


@dataclass(frozen=True)
class EvalTask:
    """One run's benchmarks: the cached scores that answer the request, and the rest to evaluate
    (benchmark -> why it is evaluated)."""

    record: RunRecord
    cached: Scores
    todo: dict[str, str]


def plan_evals(
    records: Sequence[RunRecord], settings: EvalSettings, corpora: Mapping[str, str]
) -> list[EvalTask]:
    """For each run, which of the benchmarks of `settings` its eval.json already answers
    (`stale_reason`) and which must be evaluated. `corpora` maps a benchmark to the fingerprint
    of its text where it can be read. A run without weights cannot be evaluated: its saved
    scores are kept."""
    benchmarks, max_tokens = settings.benchmarks, settings.max_tokens
    tasks = []
    for record in records:
        if record.path is None or not (record.path / MODEL_META).is_file():
            tasks.append(EvalTask(record, {b: record.evals[b] for b in benchmarks if b in record.evals}, {}))
            continue
        _, raw = read_eval(record.path)
        entries = {str(entry["name"]): entry for entry in eval_entries(raw)}
        weights = ckpt.weights_fingerprint(record.path)
        cached, todo = {}, {}
        for name in benchmarks:
            reason = stale_reason(
                entries.get(name),
                max_tokens=max_tokens,
                model_fingerprint=weights,
                corpus_fingerprint=corpora.get(name),
            )
            if reason is None:
                cached[name] = normalise_eval({"benchmarks": [entries[name]]})[name]
            else:
                todo[name] = reason
        tasks.append(EvalTask(record, cached, todo))
    return tasks


def benchmarks_to_evaluate(tasks: Sequence[EvalTask]) -> tuple[str, ...]:
    """The benchmarks some run must be evaluated on (their text must be readable)."""
    return tuple(dict.fromkeys(name for task in tasks for name in task.todo))


@dataclass(frozen=True)
class EvalSummary:
    """What an evaluation pass reused and what it evaluated, per benchmark, in runs."""

    max_tokens: int | None
    reused: dict[str, int]
    evaluated: dict[str, dict[str, int]]  # benchmark -> reason -> runs
    unchecked: tuple[str, ...] = ()  # reused without comparing the text (it could not be read)

    def lines(self) -> list[str]:
        """One line on the cached scores reused, one on the scores evaluated now (if any)."""
        lines = []
        if self.reused:
            reused = ", ".join(f"{name} ({n} run{'s' * (n != 1)})" for name, n in self.reused.items())
            line = (
                f"reused cached scores from the runs' eval.json: {reused}; same max_tokens "
                f"({self.max_tokens}), same weights and same benchmark data"
            )
            if self.unchecked:
                line += f" (data of {', '.join(self.unchecked)} not readable here: not compared)"
            lines.append(line)
        if self.evaluated:
            parts = [
                f"{name} ({n} run{'s' * (n != 1)}: {reason})"
                for name, reasons in self.evaluated.items()
                for reason, n in reasons.items()
            ]
            lines.append(f"evaluated now: {', '.join(parts)}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """Plain data for compare.json."""
        return dataclasses.asdict(self)


def summarise_evals(
    tasks: Sequence[EvalTask], max_tokens: int | None, corpora: Mapping[str, str]
) -> EvalSummary:
    """Count, per benchmark, the runs whose cached score was reused and those evaluated (by reason)."""
    reused: dict[str, int] = {}
    evaluated: dict[str, dict[str, int]] = {}
    for task in tasks:
        for name in task.cached:
            reused[name] = reused.get(name, 0) + 1
        for name, reason in task.todo.items():
            counts = evaluated.setdefault(name, {})
            counts[reason] = counts.get(reason, 0) + 1
    unchecked = tuple(name for name in reused if name not in corpora)
    return EvalSummary(max_tokens, reused, evaluated, unchecked)


def _todo_settings(task: EvalTask, settings: EvalSettings) -> EvalSettings:
    """`settings` for the benchmarks `task` evaluates."""
    return dataclasses.replace(settings, benchmarks=tuple(task.todo))


#: Called before each benchmark of a run is scored: the run's task, its plan and the benchmark.
Starting = Callable[[EvalTask, "EvalPlan", "PreparedBenchmark"], None]


def evaluate_task(
    task: EvalTask, settings: EvalSettings, *, progress: bool, starting: Starting | None = None
) -> Scores:
    """Evaluate a run on its `todo` benchmarks (with the other `settings`), replace their
    entries in its eval.json (other entries are kept) and return the scores of the cached and
    the new benchmarks. `starting` is told of each benchmark before it is scored."""
    from resstream.training.evaluate import prepare_run, run_plan

    run_dir = task.record.path
    assert run_dir is not None, "a run without a folder has nothing to evaluate (`plan_evals`)"
    with locked_directory(run_dir, "eval", param=None):  # not while the run trains or is evaluated
        _, raw = read_eval(run_dir)
        plan = prepare_run(run_dir, _todo_settings(task, settings), progress=progress)
        hook = None if starting is None else functools.partial(starting, task, plan)
        report = run_plan(plan, progress=progress, starting=hook)
        payload = report.to_dict()
        kept = [entry for entry in eval_entries(raw) if entry["name"] not in task.todo]
        payload["benchmarks"] = kept + list(payload["benchmarks"])
        payload.pop("max_tokens")  # per entry: the entries kept may have other settings
        write_json(run_dir / EVAL_FILE, payload)
    return {**task.cached, **normalise_eval({"benchmarks": payload["benchmarks"][len(kept) :]})}


def run_evals(
    tasks: Sequence[EvalTask], settings: EvalSettings, *, progress: bool, log: Log | None
) -> list[RunRecord]:
    """Evaluate every task that has something to do; the runs' records with exactly the
    requested scores (cached or new) as their `evals`. With `log`, an estimate of the
    evaluations (tokens, runs, benchmarks, about how long, on which device) comes first, then
    one line per benchmark scored."""
    todo = [task for task in tasks if task.todo]
    guess = estimate_evals(todo, settings) if log is not None else None
    if log is not None and guess is not None:
        log(guess.line(str(settings.device)))
    starting = None if log is None else _progress_lines(todo, log)
    done: dict[int, Scores] = {}
    for task in todo:
        done[id(task)] = evaluate_task(task, settings, progress=progress, starting=starting)
    return [dataclasses.replace(task.record, evals=done.get(id(task), task.cached)) for task in tasks]


def _progress_lines(todo: Sequence[EvalTask], log: Log) -> Starting:
    """One line per (run, benchmark) evaluated, before it is scored: "evaluate [k/n] seed s
    name: benchmark (N tokens)", k counting every benchmark of every run."""
    from resstream.training.evaluate import benchmark_size

    total = sum(len(task.todo) for task in todo)
    counter = itertools.count(1)

    def starting(task: EvalTask, plan: EvalPlan, bench: PreparedBenchmark) -> None:
        run = f"seed {task.record.seed} {task.record.name}"
        tokens = benchmark_size(plan, bench).scored
        log(f"evaluate [{next(counter)}/{total}] {run}: {bench.name} ({tokens:,} tokens)")

    return starting


def _shape_key(meta: Mapping[str, Any]) -> str:
    """What a run's evaluation speed depends on: its model's shape (the gate's settings aside)."""
    model = dict(meta.get("config", {}).get("model", {}))
    for name in ("gate", "cut_layer", "alpha", "gate_strength"):
        model.pop(name, None)
    return json.dumps(model, sort_keys=True)


def _sizes_key(meta: Mapping[str, Any], task: EvalTask) -> str:
    """What a run's benchmark sizes depend on: its shape, tokenizer and training text (the
    held-out-tail rule), and the benchmarks it evaluates."""
    config = meta.get("config", {})
    parts = [_shape_key(meta), meta.get("tokenizer_fingerprint"), meta.get("corpus_fingerprint")]
    return json.dumps([*parts, config.get("data"), list(task.todo)], sort_keys=True, default=str)


def estimate_evals(tasks: Sequence[EvalTask], settings: EvalSettings) -> RunsEstimate | None:
    """How long evaluating the `todo` of `tasks` takes (None: nothing to evaluate): each run's
    sizes from one prepared plan per tokenizer, shape and set of benchmarks, each shape's speed
    measured once (`resstream.training.evaluate.timing`)."""
    from resstream.training.evaluate import (
        EvalEstimate,
        RunsEstimate,
        benchmark_size,
        measure_speed,
        prepare_run,
    )

    speeds: dict[str, float] = {}
    groups: dict[str, EvalEstimate] = {}
    runs = []
    for task in (task for task in tasks if task.todo):
        assert task.record.path is not None, "a run without a folder has nothing to evaluate"
        meta = read_json(task.record.path / MODEL_META) or {}
        key = _sizes_key(meta, task)
        if key not in groups:
            plan = prepare_run(task.record.path, _todo_settings(task, settings))
            shape = _shape_key(meta)
            if shape not in speeds:
                speeds[shape] = measure_speed(plan)
            sizes = tuple(benchmark_size(plan, bench) for bench in plan.benchmarks)
            groups[key] = EvalEstimate(sizes, speeds[shape])
        runs.append(groups[key])
    return RunsEstimate(tuple(runs), len(speeds)) if runs else None


def check_evals(
    records: Sequence[RunRecord], settings: EvalSettings, data: BenchmarkData | None = None
) -> tuple[list[EvalTask], EvalSummary]:
    """What `fill_evals` will reuse and evaluate (`plan_evals`, `summarise_evals`), nothing
    evaluated yet; a benchmark some run must be evaluated on is refused when its text cannot be
    read. `data` is what `find_benchmark_data` found for them, when the caller looked already
    (each benchmark's text is then read once, not again here)."""
    from resstream.training.evaluate import find_benchmark_data

    if data is None:
        data = find_benchmark_data(settings.benchmarks, settings.data_dir)
    corpora = data.fingerprints
    tasks = plan_evals(records, settings, corpora)
    unreadable = [name for name in benchmarks_to_evaluate(tasks) if name in data.unavailable]
    if unreadable:
        raise UsageError(data.unavailable[unreadable[0]])
    return tasks, summarise_evals(tasks, settings.max_tokens, corpora)


def fill_evals(
    records: Sequence[RunRecord],
    settings: EvalSettings,
    *,
    progress: bool = True,
    log: Log | None = None,
    data: BenchmarkData | None = None,
) -> tuple[list[RunRecord], EvalSummary]:
    """Give every run scores for the benchmarks of `settings` made with its `max_tokens` on the
    run's current weights: cached ones where they match (`stale_reason`), new ones (evaluated
    now, with `settings`) otherwise: `check_evals`, then `run_evals`.
    """
    tasks, summary = check_evals(records, settings, data)
    return run_evals(tasks, settings, progress=progress, log=log), summary


# ---------------------------------------------------------------------------- running
def _train_or_skip(
    run: PlannedRun, root: Path, index: int, total: int, progress: bool, log: Log | None
) -> None:
    """Train one run (what `loop.train` does), skip it if finished, resume it if interrupted.
    Ctrl-C checkpoints the run and stops the sweep (`KeyboardInterrupt`); the same sweep, run
    again, resumes the run from that checkpoint.

    The trainer is built before the run is announced, so bad input (a missing corpus, too few
    tokens, an unknown tokenizer) is refused with nothing logged and nothing written.
    """
    from resstream.training.distributed import run_lock
    from resstream.training.loop import Trainer

    run_dir = run.path(root)
    label = f"sweep [{index}/{total}] seed {run.seed} {run.name}"
    with run_lock(run_dir, param=None):  # as `loop.train` holds its run folder
        if (run_dir / MODEL_META).is_file():
            if log:
                log(f"{label}: finished earlier, skipped")
            return
        resume = ckpt.latest_checkpoint_step(run_dir) is not None
        hint = f"the same sweep, run again, resumes seed {run.seed} {run.name} from it"
        trainer = Trainer(run.config, run_dir, resume=resume, progress=progress, resume_hint=hint)
        if log:
            log(f"{label}: {'resuming' if resume else 'training'}")
        trainer.run()


def _evaluate_all(
    plan: SweepPlan,
    root: Path,
    benchmarks: Sequence[str],
    max_tokens: int | None,
    progress: bool,
    log: Log | None,
) -> None:
    """Evaluate every run of the sweep whose eval.json does not answer `benchmarks` yet."""
    from resstream.devices import resolve_device
    from resstream.training.evaluate import EvalSettings

    records = [record_from_run_dir(run.path(root), run.seed) for run in plan.runs]
    device = str(resolve_device(plan.base.run.device))
    settings = EvalSettings(
        tuple(benchmarks), data_dir=plan.base.run.data_dir, max_tokens=max_tokens, device=device
    )
    _, summary = fill_evals(records, settings, progress=progress, log=log)
    if log:
        for line in summary.lines():
            log(line)


def collect(plan: SweepPlan, root: str | Path, benchmarks: Sequence[str] = ()) -> SweepResult:
    """Read the finished runs of `plan` back into a SweepResult (no training)."""
    root = Path(root)
    records = [
        dataclasses.replace(record_from_run_dir(run.path(root), run.seed), name=run.name) for run in plan.runs
    ]
    histories = {run.seed: gate_history(run.path(root)) for run in plan.runs if run.name == "learned"}
    config = plan.base.to_dict()
    config["model"].pop("gate")
    config["model"].pop("cut_layer")
    config["run"].pop("seed")
    return SweepResult(
        root=root,
        n_layer=plan.n_layer,
        alpha=plan.alpha,
        seeds=plan.seeds,
        layers=plan.layers,
        learned=plan.learned,
        benchmarks=tuple(benchmarks),
        runs=tuple(records),
        gate_histories=histories,
        config=config,
    )


def _write_outputs(result: SweepResult, plan: SweepPlan, max_tokens: int | None) -> None:
    for seed, history in result.gate_histories.items():
        write_json(result.root / f"seed-{seed}" / "learned" / GATE_HISTORY_FILE, history.to_dict())
    write_json(result.root / SWEEP_FILE, result.to_dict())
    first = read_json(plan.runs[0].path(result.root) / "run.json") or {}
    settings = {
        "base": result.config,
        "seeds": list(plan.seeds),
        "layers": list(plan.layers),
        "alpha": plan.alpha,
        "learned": plan.learned,
        "benchmarks": list(result.benchmarks),
        "max_eval_tokens": max_tokens,
    }
    write_json(
        result.root / "run.json",
        run_record(
            settings,
            seed=None,
            device=str(first.get("device")),
            dataset_fingerprint=first.get("dataset_fingerprint"),
        ),
    )


def _main_process_after_training() -> bool:
    """Whether this process goes on to evaluate and write (rank 0), once every rank of a
    torchrun job has finished training (the others only read the runs back)."""
    import torch.distributed as dist

    from resstream.training.distributed import launched_rank

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return launched_rank() == 0


def run_sweep(
    plan: SweepPlan,
    out_dir: str | Path,
    *,
    benchmarks: Sequence[str] = (),
    max_eval_tokens: int | None = None,
    progress: bool = True,
    log: Log | None = None,
) -> SweepResult:
    """Train (or skip finished) every planned run, evaluate them, write sweep.json; return results.

    `log` receives one line per run ("sweep [i/n] seed s name: training"); `progress`
    shows the trainer's and the evaluator's own progress bars.
    """
    from resstream.training.evaluate import check_benchmarks

    benchmarks = check_benchmarks(benchmarks, allow_all=True)  # refused before any training
    if max_eval_tokens is not None and max_eval_tokens < 2:
        raise UsageError(f"`max_eval_tokens` must be >= 2, got {max_eval_tokens}")
    from resstream.training.distributed import launched_rank, writer_lock

    root = Path(out_dir)
    log = log if launched_rank() == 0 else None  # one process of a torchrun job speaks
    with writer_lock(root, "sweep", param="out_dir"):
        try:
            check_existing(plan, root)
            total = len(plan.runs)
            for index, run in enumerate(plan.runs, 1):
                _train_or_skip(run, root, index, total, progress, log)
            if not _main_process_after_training():
                return collect(plan, root, ())
            if benchmarks:
                _evaluate_all(plan, root, benchmarks, max_eval_tokens, progress, log)
            result = collect(plan, root, benchmarks)
            _write_outputs(result, plan, max_eval_tokens)
        except OSError as exc:  # a full disk or lost permission under the sweep's folder
            failure = write_failure(exc, root, "out_dir", kept="its finished runs are kept")
            if failure is None:
                raise
            raise failure from None
    return result
