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
(`DIR/seed-<s>/learned/gate_history.json`). This module computes nothing for display: tables
and plots are drawn by `resstream.reporting` from the objects returned here.

The same module reads sweeps back (`load_runs`) for `resstream compare`, and evaluates runs
whose evaluation is missing (`fill_evals`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resstream.errors import UsageError, check_choice
from resstream.io import run_record, write_json
from resstream.training import checkpoint as ckpt
from resstream.training.config import TrainConfig, from_dict, identity_diff, validate

SWEEP_FILE = "sweep.json"
EVAL_FILE = "eval.json"
GATE_HISTORY_FILE = "gate_history.json"
SWEEP_FORMAT = "resstream-sweep"
SEED_DIR = re.compile(r"^seed-(-?\d+)$")
RUN_NAME = re.compile(r"^(?:baseline|learned|fixed-k(\d+))$")
#: The metrics a benchmark result carries (None where a benchmark does not have one).
EVAL_METRICS = ("loss", "perplexity", "accuracy", "num_tokens", "last_word_accuracy", "num_examples")
#: Config fields a sweep sets for each run itself; giving them as flags is refused.
SWEEP_OWNED_FIELDS = {"gate": "--layers / --no-learned", "cut_layer": "--layers", "seed": "--seeds"}

Log = Callable[[str], None]
Scores = dict[str, dict[str, float | int | None]]  # benchmark -> metric -> value


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


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """Parse '0,1,2' (spaces allowed) into integers; a UsageError names a bad element."""
    items = [item.strip() for item in str(text).split(",")]
    if not any(items):
        raise UsageError(f"{option}: {text!r} is empty; give comma-separated integers such as 0,1,2")
    values = []
    for item in items:
        try:
            values.append(int(item))
        except ValueError:
            raise UsageError(
                f"{option}: {item!r} is not an integer; give comma-separated integers such as 0,1,2"
            ) from None
    return tuple(dict.fromkeys(values))


def check_layers(layers: Iterable[int], n_layer: int) -> tuple[int, ...]:
    """Sorted unique cut layers; each must lie in [0, n_layer)."""
    layers = tuple(sorted(set(layers)))
    for k in layers:
        if not 0 <= k < n_layer:
            raise UsageError(f"--layers: {k} is outside [0, {n_layer}) for {n_layer} layers")
    return layers


def check_sweep_flags(flags: dict[str, Any]) -> None:
    """Refuse per-field flags that the sweep sets itself (gate, cut layer, seed)."""
    for name, instead in SWEEP_OWNED_FIELDS.items():
        if name in flags:
            raise UsageError(f"--{name.replace('_', '-')} is set by the sweep for each run; use {instead}")


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
    seeds = tuple(dict.fromkeys(seeds)) if seeds else (base.run.seed,)
    n_layer = base.model.n_layer
    layers = check_layers(range(n_layer) if layers is None else layers, n_layer)
    if not layers:
        raise UsageError("--layers: no cut layer given")
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


def check_existing(plan: SweepPlan, root: str | Path) -> None:
    """Refuse to restart a sweep whose finished runs were trained with another config."""
    for run in plan.runs:
        meta = _read_json(run.path(root) / ckpt.MODEL_META)
        if meta is None:
            continue
        diffs = config_diffs(meta.get("config", {}), run.config)
        if diffs:
            raise UsageError(
                f"--out {str(root)!r} already holds run seed-{run.seed}/{run.name} trained with a "
                f"different config ({'; '.join(diffs[:3])}); choose another --out"
            )


def known_benchmarks() -> tuple[str, ...]:
    """The benchmark names `evaluate_run` accepts."""
    from resstream.training.evaluate import BENCHMARKS

    return tuple(BENCHMARKS)


def check_benchmarks(names: Iterable[str]) -> tuple[str, ...]:
    """Validate benchmark names ('all' expands to every benchmark); unique, in given order."""
    allowed = known_benchmarks()
    result: list[str] = []
    for name in names:
        if name == "all":
            result += allowed
        else:
            result.append(check_choice("benchmark", name, (*allowed, "all")))
    return tuple(dict.fromkeys(result))


def check_benchmark_data(names: Iterable[str], data_dir: str | None) -> None:
    """Refuse, before any work, benchmarks whose text cannot be loaded (UsageError naming it)."""
    from resstream.data import load_corpus
    from resstream.training.evaluate import SPLITS

    if data_dir is not None and not Path(data_dir).is_dir():
        raise UsageError(f"--data-dir {str(data_dir)!r} is not a directory")
    for name in names:
        try:
            load_corpus(name, split=SPLITS[name], data_dir=data_dir)
        except UsageError as exc:
            first = str(exc).splitlines()[0] if str(exc) else "unavailable"
            raise UsageError(f"benchmark {name!r} is not available: {first}") from None


def check_max_eval_tokens(value: int | str | None) -> int | None:
    """`--max-eval-tokens` (an integer, or its text) must allow one context and one scored token."""
    if value is None:
        return None
    try:
        value = int(value)
    except ValueError:
        raise UsageError(f"--max-eval-tokens: {value!r} is not an integer") from None
    if value < 2:
        raise UsageError(f"--max-eval-tokens must be >= 2, got {value}")
    return value


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class GateHistory:
    """The learned gate's distribution p over layers at each logged training step."""

    steps: tuple[int, ...]
    p: tuple[tuple[float, ...], ...]  # one row per step, one entry per layer

    def to_dict(self) -> dict[str, Any]:
        """{"steps": [...], "p": [[...], ...]} (what gate_history.json holds)."""
        return {"steps": list(self.steps), "p": [list(row) for row in self.p]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateHistory:
        """Inverse of `to_dict`."""
        return cls(tuple(int(s) for s in data["steps"]), tuple(tuple(map(float, row)) for row in data["p"]))


@dataclass(frozen=True)
class RunRecord:
    """A finished run's summary: what sweep.json stores and compare aggregates."""

    seed: int
    name: str
    gate: str
    cut_layer: int | None
    alpha: float | None
    val_loss: float
    path: Path | None = None
    evals: Scores = field(default_factory=dict)
    gate_p: tuple[float, ...] | None = None  # learned gate: final distribution

    def to_dict(self, root: Path | None = None) -> dict[str, Any]:
        """JSON form; `dir` is relative to `root` when given."""
        where = None
        if self.path is not None:
            where = str(self.path.relative_to(root)) if root is not None else str(self.path)
        return {
            "gate": self.gate,
            "cut_layer": self.cut_layer,
            "alpha": self.alpha,
            "val_loss": self.val_loss,
            "dir": where,
            "gate_p": list(self.gate_p) if self.gate_p else None,
            "eval": self.evals or None,
        }


@dataclass(frozen=True)
class SweepResult:
    """Everything a finished sweep produced."""

    root: Path
    n_layer: int
    alpha: float
    seeds: tuple[int, ...]
    layers: tuple[int, ...]
    learned: bool
    benchmarks: tuple[str, ...]
    runs: tuple[RunRecord, ...]
    gate_histories: dict[int, GateHistory]
    config: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The content of sweep.json."""
        per_seed: dict[str, dict[str, Any]] = {}
        for run in self.runs:
            per_seed.setdefault(str(run.seed), {})[run.name] = run.to_dict(self.root)
        return {
            "format": SWEEP_FORMAT,
            "version": 1,
            "n_layer": self.n_layer,
            "alpha": self.alpha,
            "seeds": list(self.seeds),
            "layers": list(self.layers),
            "learned": self.learned,
            "benchmarks": list(self.benchmarks),
            "config": self.config,
            "runs": per_seed,
        }


# ------------------------------------------------------------------------- reading runs
def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{str(path)!r} is not valid JSON ({exc})") from None


def gate_history(run_dir: str | Path) -> GateHistory:
    """The gate distribution logged in a run's metrics.jsonl (records with `gate` and `step`)."""
    from resstream.training.metrics import iter_metrics

    by_step: dict[int, tuple[float, ...]] = {}
    for record in iter_metrics(run_dir):
        if isinstance(record.get("gate"), list) and "step" in record:
            by_step[int(record["step"])] = tuple(float(v) for v in record["gate"])
    steps = tuple(sorted(by_step))
    return GateHistory(steps, tuple(by_step[s] for s in steps))


def normalise_eval(data: Any) -> Scores:
    """Benchmark scores from an eval.json (`benchmarks`/`results` as a list or a name mapping)."""
    if not isinstance(data, dict):
        return {}
    results = data.get("benchmarks", data.get("results", data))
    if isinstance(results, dict):
        items = [(str(name), value) for name, value in results.items() if isinstance(value, dict)]
    elif isinstance(results, list):
        items = [
            (str(value["name"]), value) for value in results if isinstance(value, dict) and "name" in value
        ]
    else:
        return {}
    return {name: {m: value.get(m) for m in EVAL_METRICS} for name, value in items}


def read_eval(run_dir: Path) -> tuple[Scores, dict[str, Any] | None]:
    """(scores, raw eval.json) saved in a run directory; ({}, None) when there is none."""
    raw = _read_json(Path(run_dir) / EVAL_FILE)
    return normalise_eval(raw), raw


def _fixed_layer(name: str) -> int | None:
    match = RUN_NAME.match(name)
    return int(match.group(1)) if match and match.group(1) is not None else None


def record_from_run_dir(run_dir: Path, seed: int) -> RunRecord:
    """Summarise a finished run from its model.json (and eval.json, gate log)."""
    meta = _read_json(run_dir / ckpt.MODEL_META) or {}
    model = meta.get("config", {}).get("model", {})
    gate = str(model.get("gate", "none"))
    cut = model.get("cut_layer") if gate == "fixed" else None
    if gate == "fixed" and cut == -1:
        cut = int(model.get("n_layer", 0)) // 2
    scores, _ = read_eval(run_dir)
    final_p = None
    if gate == "learned" and (run_dir / "metrics.jsonl").is_file():
        history = gate_history(run_dir)
        final_p = history.p[-1] if history.p else None
    return RunRecord(
        seed=seed,
        name=run_dir.name,
        gate=gate,
        cut_layer=cut,
        alpha=float(model["alpha"]) if gate == "fixed" else None,
        val_loss=float(meta.get("val_loss", math.nan)),
        path=run_dir,
        evals=scores,
        gate_p=final_p,
    )


def _records_from_sweep_json(root: Path, data: dict[str, Any], only_seed: int | None) -> list[RunRecord]:
    records = []
    for seed_key, runs in (data.get("runs") or {}).items():
        seed = int(seed_key)
        if only_seed is not None and seed != only_seed:
            continue
        for name, run in runs.items():
            path = root / (run.get("dir") or f"seed-{seed}/{name}")
            saved, _ = read_eval(path)
            evals = {**normalise_eval({"results": run.get("eval") or {}}), **saved}
            records.append(
                RunRecord(
                    seed=seed,
                    name=name,
                    gate=str(run.get("gate")),
                    cut_layer=run.get("cut_layer"),
                    alpha=run.get("alpha"),
                    val_loss=float(run["val_loss"]) if run.get("val_loss") is not None else math.nan,
                    path=path,
                    evals=evals,
                    gate_p=tuple(run["gate_p"]) if run.get("gate_p") else None,
                )
            )
    return records


def _records_from_seed_dir(seed_dir: Path, seed: int) -> list[RunRecord]:
    return [
        record_from_run_dir(d, seed)
        for d in sorted(seed_dir.iterdir())
        if d.is_dir() and RUN_NAME.match(d.name) and (d / ckpt.MODEL_META).is_file()
    ]


def _seed_dirs(root: Path) -> list[tuple[Path, int]]:
    found = [(d, SEED_DIR.match(d.name)) for d in sorted(root.iterdir()) if d.is_dir()]
    return [(d, int(m.group(1))) for d, m in found if m]


def _not_a_sweep(path: Path, reason: str) -> UsageError:
    return UsageError(
        f"{str(path)!r} is not a sweep directory ({reason}); expected a directory "
        f"written by `resstream sweep` (with {SWEEP_FILE} or seed-<s>/ run folders) "
        f"or one of its seed-<s> folders"
    )


def find_runs(path: str | Path) -> list[RunRecord]:
    """The finished runs of a sweep directory or of one seed-<s> directory of a sweep."""
    path = Path(path)
    if not path.exists():
        raise UsageError(
            f"{str(path)!r} does not exist; expected a sweep directory written by "
            f"`resstream sweep` or one of its seed-<s> folders"
        )
    if not path.is_dir():
        raise _not_a_sweep(path, "it is a file")
    sweep = _read_json(path / SWEEP_FILE)
    if sweep is not None:
        if not isinstance(sweep, dict) or sweep.get("format") != SWEEP_FORMAT:
            raise _not_a_sweep(path, f"its {SWEEP_FILE} is not a resstream sweep record")
        return _records_from_sweep_json(path, sweep, None)
    seed_match = SEED_DIR.match(path.name)
    if seed_match:
        seed = int(seed_match.group(1))
        parent = _read_json(path.parent / SWEEP_FILE)
        if isinstance(parent, dict) and str(seed) in (parent.get("runs") or {}):
            return _records_from_sweep_json(path.parent, parent, seed)
        return _records_from_seed_dir(path, seed)
    seed_dirs = _seed_dirs(path)
    if not seed_dirs:
        raise _not_a_sweep(path, f"no {SWEEP_FILE} and no seed-<s> folders")
    return [rec for d, seed in seed_dirs for rec in _records_from_seed_dir(d, seed)]


def load_runs(paths: Sequence[str | Path]) -> list[RunRecord]:
    """Finished runs of several sweep / seed directories (a run listed twice counts once)."""
    records: dict[Path, RunRecord] = {}
    for path in paths:
        for record in find_runs(path):
            key = (
                record.path.resolve()
                if record.path is not None
                else Path(f"{path}/{record.seed}/{record.name}")
            )
            records.setdefault(key, record)
    if not records:
        raise UsageError(
            f"no finished runs found in {', '.join(repr(str(p)) for p in paths)}; "
            f"train them with `resstream sweep` first"
        )
    return list(records.values())


# ----------------------------------------------------------------------------- evaluation
def _raw_entries(raw: Any, exclude: Sequence[str]) -> list[dict[str, Any]]:
    """The per-benchmark entries of a saved eval.json, as a list of dicts with `name`."""
    if not isinstance(raw, dict):
        return []
    results = raw.get("benchmarks", raw.get("results"))
    if isinstance(results, dict):
        results = [{"name": name, **value} for name, value in results.items() if isinstance(value, dict)]
    if not isinstance(results, list):
        return []
    return [entry for entry in results if isinstance(entry, dict) and entry.get("name") not in exclude]


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

    raw = None if redo_all else read_eval(run_dir)[1]
    saved = normalise_eval(raw)
    missing = [b for b in benchmarks if b not in saved]
    if not missing:
        return saved
    report = evaluate_run(
        run_dir, tuple(missing), data_dir=data_dir, device=device, max_tokens=max_tokens, progress=progress
    )
    payload = report.to_dict()
    payload["benchmarks"] = _raw_entries(raw, missing) + list(payload["benchmarks"])
    write_json(run_dir / EVAL_FILE, payload)
    return normalise_eval(payload)


def runs_to_evaluate(records: Sequence[RunRecord], benchmarks: Sequence[str]) -> list[RunRecord]:
    """Runs lacking scores for some of `benchmarks` that have weights to evaluate."""
    return [
        r
        for r in records
        if any(b not in r.evals for b in benchmarks)
        and r.path is not None
        and (r.path / ckpt.MODEL_META).is_file()
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
    if (run_dir / ckpt.MODEL_META).is_file():
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
    first = _read_json(plan.runs[0].path(result.root) / "run.json") or {}
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
    root = Path(out_dir)
    check_existing(plan, root)
    total = len(plan.runs)
    for index, run in enumerate(plan.runs, 1):
        _train_or_skip(run, root, index, total, progress, log)
    if benchmarks:
        _evaluate_all(plan, root, benchmarks, max_eval_tokens, progress, log)
    result = collect(plan, root, benchmarks)
    _write_outputs(result, plan, max_eval_tokens)
    return result
