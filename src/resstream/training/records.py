"""Run and sweep records: what a sweep writes, and reading finished runs back from disk.

A finished run directory (see `resstream.training.checkpoint`) is summarised as a `RunRecord`:
gate, cut layer, α, final validation loss, its benchmark scores (`eval.json`) and, for the
learned gate, its final distribution over layers (from `metrics.jsonl`). A sweep's records make
a `SweepResult`, whose `to_dict` is `sweep.json`; the learned gate's distribution over training
is a `GateHistory` (`gate_history.json`).

One run's own report, `TrainResult` (what `resstream.training.loop.train` returns), holds its
config and metrics log, so that it draws its figures after its folder is gone.

`find_runs` / `load_runs` read runs back for `resstream compare`: from a sweep directory's
sweep.json, from the finished run folders of a sweep interrupted before writing it, or from one
seed-<s> folder. Nothing here trains or evaluates; `resstream.reporting` draws these records.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resstream.display import Displayable
from resstream.errors import UsageError, short_reason
from resstream.io import check_inside, is_plain_name, is_real_directory
from resstream.reprs import summary
from resstream.rundir import RUN_FILE
from resstream.training.metrics import METRICS_FILE, iter_metrics

MODEL_META = "model.json"  # a finished run's config and final validation loss
SWEEP_FILE = "sweep.json"
EVAL_FILE = "eval.json"
GATE_HISTORY_FILE = "gate_history.json"
SWEEP_FORMAT = "resstream-sweep"
SEED_DIR = re.compile(r"^seed-(-?\d+)$")
RUN_NAME = re.compile(r"^(?:baseline|learned|fixed-k(\d+))$")
#: The metrics a benchmark result carries (None where a benchmark does not have one).
EVAL_METRICS = ("loss", "perplexity", "accuracy", "num_tokens", "last_word_accuracy", "num_examples")

Scores = dict[str, dict[str, float | int | None]]  # benchmark -> metric -> value


# --------------------------------------------------------------------------- records
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
class SweepResult(Displayable, renderer="resstream.reporting.experiments"):
    """Everything a finished sweep produced (`resstream.training.sweep.run_sweep`; read back
    by `load_sweep`).

    `to_pandas()` columns (`resstream.reporting.tables.SWEEP_COLUMNS`; sweep.csv is this
    frame), per run its validation loss, then one row per benchmark score: seed; run — its
    name (baseline, fixed-k<k>, learned); gate — none, fixed or learned; cut_layer, alpha —
    the fixed cut's layer and α (empty for other runs); benchmark — empty for the validation
    loss; metric — val_loss, or loss, perplexity, accuracy, last_word_accuracy (as eval.json);
    value; n — the tokens (passages for last_word_accuracy) a benchmark score is a mean over.
    """

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

    def __repr__(self) -> str:
        cuts = ", ".join(map(str, self.layers)) or "none"
        learned = "; learned gate" if self.learned else ""
        plan = (
            f"{len(self.runs)} runs of {self.n_layer}-layer models: seeds {', '.join(map(str, self.seeds))}; "
            f"fixed cuts at layers {cuts}, α = {self.alpha:g}{learned}"
        )
        benchmarks = f"benchmarks {', '.join(self.benchmarks)}" if self.benchmarks else ""
        return summary(self, plan, self._val_loss_line(), benchmarks)

    def _val_loss_line(self) -> str:
        """'val loss (mean over seeds): baseline 3.000; k=0 3.600, k=1 2.600; learned 3.000'."""
        groups: dict[str, list[float]] = {}
        for run in self.runs:
            kind = f"k={run.cut_layer}" if run.gate == "fixed" else _VARIANT.get(run.gate, run.gate)
            groups.setdefault(kind, []).append(run.val_loss)
        means = [f"{kind} {_finite_mean(losses):.3f}" for kind, losses in groups.items()]
        return f"val loss (mean over seeds): {', '.join(means)}"

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


#: How a summary names the runs of a gate kind (fixed cuts are named by their layer).
_VARIANT = {"none": "baseline"}


def _finite_mean(values: Sequence[float]) -> float:
    """The mean of the finite values (NaN when there are none)."""
    kept = [v for v in values if math.isfinite(v)]
    return statistics.fmean(kept) if kept else math.nan


# ------------------------------------------------------------------- reading runs
def read_json(path: Path) -> Any:
    """The JSON content of `path`, None when there is no such file; UsageError when it is not JSON."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{str(path)!r} is not valid JSON ({short_reason(exc)})") from None


def gate_history(run_dir: str | Path) -> GateHistory:
    """The gate distribution logged in a run's metrics.jsonl (records with `gate` and `step`)."""
    return gate_history_of(iter_metrics(run_dir))


def gate_history_of(records: Iterable[Mapping[str, Any]]) -> GateHistory:
    """The gate distribution in metrics records (those with `gate` and `step`)."""
    by_step: dict[int, tuple[float, ...]] = {}
    for record in records:
        if isinstance(record.get("gate"), list) and "step" in record:
            by_step[int(record["step"])] = tuple(float(v) for v in record["gate"])
    steps = tuple(sorted(by_step))
    return GateHistory(steps, tuple(by_step[s] for s in steps))


@dataclass(frozen=True)
class TrainingCurve:
    """A run's training loss at each logged step and validation loss at each evaluation."""

    steps: tuple[int, ...]
    loss: tuple[float, ...]
    val_steps: tuple[int, ...]
    val_loss: tuple[float, ...]


def training_curve(run_dir: str | Path) -> TrainingCurve:
    """The losses logged in a run's metrics.jsonl (a resumed run's records count once per step)."""
    return training_curve_of(iter_metrics(run_dir))


def training_curve_of(records: Iterable[Mapping[str, Any]]) -> TrainingCurve:
    """The losses in metrics records (a step logged twice counts once, the later record)."""
    train: dict[int, float] = {}
    val: dict[int, float] = {}
    for record in records:
        if "step" not in record:
            continue
        step = int(record["step"])
        if record.get("loss") is not None:
            train[step] = float(record["loss"])
        if record.get("val_loss") is not None:
            val[step] = float(record["val_loss"])
    steps, val_steps = sorted(train), sorted(val)
    return TrainingCurve(
        tuple(steps), tuple(train[s] for s in steps), tuple(val_steps), tuple(val[s] for s in val_steps)
    )


#: Gates whose distribution p over layers is trained (and logged in metrics.jsonl as `gate`).
GATED = ("learned", "router")


@dataclass(frozen=True)
class TrainResult(Displayable, renderer="resstream.reporting.experiments"):
    """What a training run reports (`resstream.train`, `resstream.training.loop.train`): its
    folder, its steps, the final validation loss, the losses of the steps this call took, and
    the run's config (`TrainConfig.to_dict()`) and metrics log (the records of metrics.jsonl)
    as they were when the call ended.

    In a notebook it shows the run's losses and the figures `resstream train` writes:
    loss_curve.png and, for a learned or router gate, gate.png.

    `to_pandas()` columns (`resstream.reporting.experiments.TRAIN_COLUMNS`), one row per value
    of each record of metrics.jsonl (the wall-clock `time` left out): step — the optimizer step
    the record was logged after; split — train (a logged training step) or val (an
    evaluation); metric — loss (both splits; nats per token), lr, grad_norm (the whole
    model's, before clipping), tokens_per_s, mfu (only where a peak FLOP/s is known),
    layer_grad_norm (one row per block) or gate_p (a learned or router gate's p, one row per
    layer); layer — the block of a layer_grad_norm or gate_p row (empty otherwise); value.
    """

    run_dir: Path
    steps: int
    final_val_loss: float
    train_losses: tuple[float, ...]  # losses of the steps this call ran
    tokens_per_s: float
    already_complete: bool = False  # a resume found the final model of `steps` >= max_steps
    config: dict[str, Any] = field(default_factory=dict)  # the run's TrainConfig.to_dict()
    metrics: tuple[dict[str, Any], ...] = ()  # the records of the run's metrics.jsonl

    @property
    def steps_run(self) -> int:
        """Optimizer steps this call took (0 for a run that was already complete)."""
        return len(self.train_losses)

    @property
    def gate(self) -> str:
        """The run's residual gate: none, fixed, learned or router."""
        return str(self.config.get("model", {}).get("gate", "none"))

    @property
    def curve(self) -> TrainingCurve:
        """The training and validation losses of the metrics log."""
        return training_curve_of(self.metrics)

    @property
    def gate_history(self) -> GateHistory:
        """The gate's distribution p over layers at each logged step (empty for an ungated run)."""
        return gate_history_of(self.metrics)

    def __repr__(self) -> str:
        return summary(self, f"run {self.run_dir}", self._model_part(), self._steps_part(), self._loss_part())

    def _model_part(self) -> str:
        """'2 layers × 32, gate fixed (α 0.5 at layer 1)', or the gate alone without a config."""
        model = self.config.get("model", {})
        gate = self.gate
        if gate == "fixed":
            cut = model.get("cut_layer", -1)
            cut = int(model.get("n_layer", 0)) // 2 if cut == -1 else cut
            gate = f"fixed (α {model.get('alpha', math.nan):g} at layer {cut})"
        elif gate in GATED:
            gate = f"{gate}{self._gate_weight()}"
        shape = f"{model['n_layer']} layers × {model['d_model']}, " if "n_layer" in model else ""
        return f"{shape}gate {gate}"

    def _gate_weight(self) -> str:
        """' (p highest at layer 1: 0.62; uniform 0.50)' from the last gate record, or ''."""
        history = self.gate_history
        if not history.p:
            return ""
        final = history.p[-1]
        top = max(range(len(final)), key=final.__getitem__)
        return f" (p highest at layer {top}: {final[top]:.2f}; uniform {1 / len(final):.2f})"

    def _steps_part(self) -> str:
        if self.already_complete:
            return f"{self.steps} steps (already complete: nothing trained)"
        if self.steps_run < self.steps:
            return f"{self.steps} steps ({self.steps_run} trained by this call)"
        return f"{self.steps} steps"

    def _loss_part(self) -> str:
        losses = self.train_losses or self.curve.loss
        train = f"final train loss {losses[-1]:.3f}, " if losses else ""
        return f"{train}validation loss {self.final_val_loss:.3f}"


def eval_entries(data: Any) -> list[dict[str, Any]]:
    """The per-benchmark entries of an eval.json, each a dict with its `name`.

    `benchmarks` (or `results`, or the whole object) holds them as a list of entries with a
    `name`, or as a mapping from name to entry; anything else holds none.
    """
    if not isinstance(data, dict):
        return []
    results = data.get("benchmarks", data.get("results", data))
    if isinstance(results, dict):
        return [
            {"name": str(name), **{k: v for k, v in value.items() if k != "name"}}
            for name, value in results.items()
            if isinstance(value, dict)
        ]
    if isinstance(results, list):
        return [value for value in results if isinstance(value, dict) and "name" in value]
    return []


def normalise_eval(data: Any) -> Scores:
    """Benchmark scores from an eval.json (`eval_entries`)."""
    return {str(entry["name"]): {m: entry.get(m) for m in EVAL_METRICS} for entry in eval_entries(data)}


def read_eval(run_dir: Path) -> tuple[Scores, dict[str, Any] | None]:
    """(scores, raw eval.json) saved in a run directory; ({}, None) when there is none."""
    raw = read_json(Path(run_dir) / EVAL_FILE)
    return normalise_eval(raw), raw


def record_from_run_dir(run_dir: Path, seed: int) -> RunRecord:
    """Summarise a finished run from its model.json (and eval.json, gate log)."""
    meta = read_json(run_dir / MODEL_META) or {}
    model = meta.get("config", {}).get("model", {})
    gate = str(model.get("gate", "none"))
    cut = model.get("cut_layer") if gate == "fixed" else None
    if gate == "fixed" and cut == -1:
        cut = int(model.get("n_layer", 0)) // 2
    scores, _ = read_eval(run_dir)
    final_p = None
    if gate == "learned" and (run_dir / METRICS_FILE).is_file():
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
            path = _run_folder(root, run.get("dir") or f"seed-{seed}/{name}")
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


def _run_folder(root: Path, where: object) -> Path:
    """The run folder `where` (as sweep.json names it) inside the sweep directory `root`:
    UsageError for a name that leads out of it (absolute, '..', a link on the way), since
    compare writes each run's eval.json there."""
    relative = Path(where if isinstance(where, str) else "")  # not a string: no parts, refused
    parts = relative.parts
    if not parts or relative.is_absolute() or not all(is_plain_name(part) for part in parts):
        raise UsageError(
            f"{str(root / SWEEP_FILE)!r} names run folder {where!r}; allowed: a folder inside the "
            f"sweep directory (a relative path without '..')"
        )
    path = root.joinpath(*parts)
    check_inside(root, path, "a directory")
    return path


def _records_from_seed_dir(seed_dir: Path, seed: int) -> list[RunRecord]:
    return [
        record_from_run_dir(d, seed)
        for d in sorted(seed_dir.iterdir())
        if is_real_directory(d) and RUN_NAME.match(d.name) and (d / MODEL_META).is_file()
    ]


def _seed_dirs(root: Path) -> list[tuple[Path, int]]:
    """The seed-<s> folders of a sweep directory (a link named like one is not one)."""
    found = [(d, SEED_DIR.match(d.name)) for d in sorted(root.iterdir()) if is_real_directory(d)]
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
    sweep = read_json(path / SWEEP_FILE)
    if sweep is not None:
        if not isinstance(sweep, dict) or sweep.get("format") != SWEEP_FORMAT:
            raise _not_a_sweep(path, f"its {SWEEP_FILE} is not a resstream sweep record")
        return _records_from_sweep_json(path, sweep, None)
    seed_match = SEED_DIR.match(path.name)
    if seed_match:
        seed = int(seed_match.group(1))
        parent = read_json(path.parent / SWEEP_FILE)
        if isinstance(parent, dict) and str(seed) in (parent.get("runs") or {}):
            return _records_from_sweep_json(path.parent, parent, seed)
        return _records_from_seed_dir(path, seed)
    seed_dirs = _seed_dirs(path)
    if not seed_dirs:
        raise _not_a_sweep(path, f"no {SWEEP_FILE} and no seed-<s> folders")
    return [rec for d, seed in seed_dirs for rec in _records_from_seed_dir(d, seed)]


def saved_gate_history(run_dir: Path) -> GateHistory:
    """A learned run's gate distribution over training: its gate_history.json, else the
    gate records of its metrics.jsonl."""
    saved = read_json(run_dir / GATE_HISTORY_FILE)
    return GateHistory.from_dict(saved) if isinstance(saved, dict) else gate_history(run_dir)


def load_sweep(path: str | Path) -> SweepResult:
    """A finished sweep read back from its sweep.json (with each run's eval.json) and the
    learned runs' gate histories; UsageError when `path` holds no sweep.json of a sweep."""
    root = Path(path)
    data = read_json(root / SWEEP_FILE)
    if not isinstance(data, dict) or data.get("format") != SWEEP_FORMAT:
        raise _not_a_sweep(root, f"no {SWEEP_FILE} of a finished sweep")
    runs = _records_from_sweep_json(root, data, None)
    histories = {
        run.seed: saved_gate_history(run.path)
        for run in runs
        if run.gate == "learned" and run.path is not None
    }
    return SweepResult(
        root=root,
        n_layer=int(data["n_layer"]),
        alpha=float(data["alpha"]),
        seeds=tuple(int(s) for s in data.get("seeds") or ()),
        layers=tuple(int(k) for k in data.get("layers") or ()),
        learned=bool(data.get("learned")),
        benchmarks=tuple(data.get("benchmarks") or ()),
        runs=tuple(runs),
        gate_histories=histories,
        config=dict(data.get("config") or {}),
    )


def _sweep_root(path: Path) -> Path:
    """The sweep directory of a sweep directory or of one of its seed-<s> folders."""
    return path.parent if SEED_DIR.match(path.name) and not (path / SWEEP_FILE).is_file() else path


#: The tokens per benchmark `resstream.compare` scores when neither the call nor the sweeps
#: chose a cap (`sweep_eval_caps`): a quick sweep's six runs on five benchmarks take seconds
#: (docs/timings.md); `max_eval_tokens='all'` scores every token.
DEFAULT_MAX_EVAL_TOKENS = 2_000


def sweep_eval_caps(paths: Sequence[str | Path]) -> tuple[int | None, ...]:
    """The `max_eval_tokens` the sweeps of `paths` chose (their run.json; None: every token),
    each once. A sweep chose one when it set a cap or evaluated benchmarks (with every token
    when it set none); a sweep that evaluated no benchmark and set no cap chose none."""
    found: dict[int | None, None] = {}
    for path in paths:
        record = read_json(_sweep_root(Path(path)) / RUN_FILE)
        settings = record.get("config") if isinstance(record, dict) else None
        if not isinstance(settings, dict) or "max_eval_tokens" not in settings:
            continue
        cap = settings["max_eval_tokens"]
        if cap is not None or settings.get("benchmarks", True):
            found[cap] = None
    return tuple(found)


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
