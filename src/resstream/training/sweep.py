"""Residual-attenuation sweeps: run the experiments, collect their results.

For every seed a sweep trains

- `baseline`: gate `none` (α = 1 everywhere);
- `fixed-k<k>`: gate `fixed`, α at layer k, for each chosen cut layer k (all layers by default);
- `learned`: gate `learned` (unless switched off),

all with the same seed and therefore the same initial weights and the same batches (the
trainer's data order is a pure function of seed and step). Runs live in
`DIR/seed-<s>/<name>/`; a run whose `model.json` exists is finished and is skipped when a
sweep is restarted, an interrupted one resumes from its latest checkpoint.

After training, every run can be evaluated on benchmarks (`eval.json` in the run directory).
The sweep writes `DIR/sweep.json` (per seed, per run: gate, cut layer, α, final validation
loss, evaluation results) and, per seed, the learned gate's distribution over training
(`DIR/seed-<s>/learned/gate_history.json`). The records written and returned, and reading
them back from disk, are `resstream.training.records`; tables and plots are drawn from them by
`resstream.reporting`.

This module also evaluates the runs whose evaluation is missing (`fill_evals`, for
`resstream compare`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resstream.errors import UsageError
from resstream.io import run_record, write_json
from resstream.rundir import locked_directory, write_failure
from resstream.training import checkpoint as ckpt
from resstream.training.budget import check_training_budget
from resstream.training.config import TrainConfig, from_dict, identity_diff, validate
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


def run_config(base: TrainConfig, *, seed: int, gate: str, cut_layer: int = -1) -> TrainConfig:
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
    """Refuse to restart a sweep in `out_dir` whose finished runs were trained with another config."""
    for run in plan.runs:
        meta = read_json(run.path(out_dir) / MODEL_META)
        if meta is None:
            continue
        diffs = config_diffs(meta.get("config", {}), run.config)
        if diffs:
            raise UsageError(
                f"`out_dir` {str(out_dir)!r} already holds run seed-{run.seed}/{run.name} trained with a "
                f"different config ({'; '.join(diffs[:3])}); choose another `out_dir`"
            )


# ----------------------------------------------------------------------------- evaluation
def evaluate_missing(
    run_dir: Path,
    benchmarks: Sequence[str],
    *,
    max_tokens: int | None,
    device: str,
    data_dir: str | None,
    progress: bool,
    redo_all: bool = False,
) -> Scores:
    """Evaluate the benchmarks a run's eval.json lacks; merge and save eval.json; return scores.

    With `redo_all`, every benchmark is evaluated again and the old eval.json is replaced.
    """
    from resstream.training.evaluate import evaluate_run

    with locked_directory(run_dir, "eval", param=None):  # not while the run trains or is evaluated
        raw = None if redo_all else read_eval(run_dir)[1]
        saved = normalise_eval(raw)
        missing = [b for b in benchmarks if b not in saved]
        if not missing:
            return saved
        report = evaluate_run(
            run_dir,
            tuple(missing),
            data_dir=data_dir,
            device=device,
            max_tokens=max_tokens,
            progress=progress,
        )
        payload = report.to_dict()
        kept = [entry for entry in eval_entries(raw) if entry["name"] not in missing]
        payload["benchmarks"] = kept + list(payload["benchmarks"])
        write_json(run_dir / EVAL_FILE, payload)
    return normalise_eval(payload)


def runs_to_evaluate(records: Sequence[RunRecord], benchmarks: Sequence[str]) -> list[RunRecord]:
    """Runs lacking scores for some of `benchmarks` that have weights to evaluate."""
    return [
        r
        for r in records
        if any(b not in r.evals for b in benchmarks)
        and r.path is not None
        and (r.path / MODEL_META).is_file()
    ]


def missing_benchmarks(records: Sequence[RunRecord], benchmarks: Sequence[str]) -> tuple[str, ...]:
    """The benchmarks that `fill_evals` would have to evaluate for some run."""
    todo = runs_to_evaluate(records, benchmarks)
    return tuple(b for b in benchmarks if any(b not in r.evals for r in todo))


def fill_evals(
    records: Sequence[RunRecord],
    benchmarks: Sequence[str],
    *,
    max_tokens: int | None = None,
    device: str = "cpu",
    data_dir: str | None = None,
    progress: bool = True,
    log: Log | None = None,
) -> list[RunRecord]:
    """Evaluate runs that lack some of `benchmarks` (and have weights to evaluate)."""
    todo = runs_to_evaluate(records, benchmarks)
    done: dict[int, RunRecord] = {}
    for i, record in enumerate(todo, 1):
        if log:
            log(f"evaluate [{i}/{len(todo)}] seed {record.seed} {record.name}")
        scores = evaluate_missing(
            record.path,
            benchmarks,
            max_tokens=max_tokens,
            device=device,
            data_dir=data_dir,
            progress=progress,
        )
        done[id(record)] = dataclasses.replace(record, evals={**record.evals, **scores})
    return [done.get(id(r), r) for r in records]


# ---------------------------------------------------------------------------- running
def _train_or_skip(
    run: PlannedRun, root: Path, index: int, total: int, progress: bool, log: Log | None
) -> None:
    """Train one run (what `loop.train` does), skip it if finished, resume it if interrupted.

    The trainer is built before the run is announced, so bad input (a missing corpus, too few
    tokens, an unknown tokenizer) is refused with nothing logged and nothing written.
    """
    from resstream.training.loop import Trainer

    run_dir = run.path(root)
    label = f"sweep [{index}/{total}] seed {run.seed} {run.name}"
    with locked_directory(run_dir, "train", param=None):  # as `loop.train` holds its run folder
        if (run_dir / MODEL_META).is_file():
            if log:
                log(f"{label}: finished earlier, skipped")
            return
        resume = ckpt.latest_checkpoint_step(run_dir) is not None
        trainer = Trainer(run.config, run_dir, resume=resume, progress=progress)
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
    from resstream.devices import resolve_device

    device = str(resolve_device(plan.base.run.device))
    for i, run in enumerate(plan.runs, 1):
        run_dir = run.path(root)
        _, raw = read_eval(run_dir)
        stale = raw is not None and raw.get("max_tokens") != max_tokens
        if log:
            log(f"evaluate [{i}/{len(plan.runs)}] seed {run.seed} {run.name}")
        evaluate_missing(
            run_dir,
            benchmarks,
            max_tokens=max_tokens,
            device=device,
            data_dir=plan.base.run.data_dir,
            progress=progress,
            redo_all=stale,
        )


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
    from resstream.training.distributed import writer_lock

    root = Path(out_dir)
    with writer_lock(root, "sweep", param="out_dir"):
        try:
            check_existing(plan, root)
            total = len(plan.runs)
            for index, run in enumerate(plan.runs, 1):
                _train_or_skip(run, root, index, total, progress, log)
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
