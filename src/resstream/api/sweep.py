"""`resstream.sweep(...)`: a residual-attenuation sweep, as `resstream sweep` runs it.

Per seed: the baseline, a fixed cut (α = `alpha`) at each of `layers` and the learned gate,
trained with the same initial weights and batches (`resstream.training.sweep.plan_sweep`),
then evaluated on the benchmarks named; the sweep directory gets what the command writes
(`run_planned_sweep`, shared with it): sweep.json, run.json, sweep.csv, sweep_val_loss.png,
learned_gate_heatmap.png, and each run's folder its own loss_curve.png (and gate.png).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resstream.api.train import check_field_names
from resstream.errors import UsageError
from resstream.notices import say
from resstream.training.config import build_config
from resstream.training.records import SweepResult

if TYPE_CHECKING:
    from resstream.training.sweep import SweepPlan

#: Where the sweep's progress lines go (one line each).
Log = Callable[[str], None]

#: Config fields the sweep sets for each run itself, and the parameters that choose them instead.
SWEEP_OWNED_FIELDS = {"gate": "`layers` and `learned`", "cut_layer": "`layers`", "seed": "`seeds`"}


def write_sweep_files(result: SweepResult) -> list[Path]:
    """What `resstream sweep` writes beside sweep.json (`run_sweep` writes that): sweep.csv,
    sweep_val_loss.png, learned_gate_heatmap.png (when a learned gate logged its distribution)
    and each run's own figures, as `resstream train` writes them."""
    from resstream.io import write_text
    from resstream.reporting.plots import plot_gate_heatmap, plot_sweep_val_loss, write_run_figures
    from resstream.reporting.tables import sweep_csv

    root = result.root
    written = [root / "sweep.csv"]
    write_text(written[0], sweep_csv(result))
    written.append(plot_sweep_val_loss(result, root / "sweep_val_loss.png"))
    if any(history.steps for history in result.gate_histories.values()):
        written.append(plot_gate_heatmap(result.gate_histories, root / "learned_gate_heatmap.png"))
    for run in result.runs:
        if run.path is not None:
            written += write_run_figures(run.path, run.gate)
    return written


def run_planned_sweep(
    plan: SweepPlan,
    out_dir: str | os.PathLike[str],
    *,
    benchmarks: Sequence[str] = (),
    max_eval_tokens: int | None = None,
    progress: bool = False,
    log: Log | None = None,
) -> SweepResult:
    """Run `plan` into `out_dir` as `resstream sweep` does: refuse finished runs of another
    config and unreadable benchmarks before training, train and evaluate
    (`resstream.training.sweep.run_sweep`), then write its files (`write_sweep_files`; the
    main process of a torchrun job only)."""
    from resstream.training import sweep as sw
    from resstream.training.distributed import launched_rank, writer_lock
    from resstream.training.evaluate import check_benchmark_data

    root = Path(out_dir)
    with writer_lock(root, "sweep", param="out_dir"):
        sw.check_existing(plan, root)
        if benchmarks:
            check_benchmark_data(benchmarks, plan.base.run.data_dir)
        result = sw.run_sweep(
            plan, root, benchmarks=benchmarks, max_eval_tokens=max_eval_tokens, progress=progress, log=log
        )
        if launched_rank() == 0:
            write_sweep_files(result)
    return result


def check_sweep_fields(fields: Iterable[str]) -> None:
    """Refuse config fields that the sweep sets for each run itself (gate, cut layer, seed)."""
    for name, instead in SWEEP_OWNED_FIELDS.items():
        if name in fields:
            raise UsageError(f"`{name}` is set by the sweep for each run; use {instead}")


def benchmark_names(benchmarks: str | Iterable[str]) -> tuple[str, ...]:
    """The benchmarks named (comma-separated or a sequence; 'all': every one), checked."""
    from resstream.training.evaluate import check_benchmarks

    given = benchmarks.split(",") if isinstance(benchmarks, str) else list(benchmarks)
    return check_benchmarks([name.strip() for name in given if name.strip()], allow_all=True)


def sweep(
    out_dir: str | os.PathLike[str],
    *,
    preset: str | None = "tiny",
    seeds: Sequence[int] | None = None,
    layers: Sequence[int] | None = None,
    learned: bool = True,
    benchmarks: str | Iterable[str] = (),
    max_eval_tokens: int | None = None,
    progress: bool = False,
    **fields: Any,
) -> SweepResult:
    """Train the baseline, a fixed cut at each of `layers` (default: every layer) and, unless
    `learned=False`, the learned gate, for each of `seeds` (default: the config's seed), into
    the sweep directory `out_dir`, as `resstream sweep` does; evaluate every run on
    `benchmarks` (comma-separated or a sequence, 'all': every one; default none), at most
    `max_eval_tokens` tokens each.

    The runs' config is `preset` (None: the base config) with any config field set by name
    (`alpha=0.5` is the fixed cuts' identity-path scale, `max_steps=40`, ...); the sweep sets
    `gate`, `cut_layer` and `seed` itself. Writes into `out_dir` a `resstream train` run
    folder per run (seed-<s>/baseline, seed-<s>/fixed-k<k>, seed-<s>/learned), sweep.json,
    run.json, sweep.csv, sweep_val_loss.png and, with the learned gate, learned_gate_heatmap.png.
    Finished runs are skipped when the same sweep is run again and an interrupted one
    resumes. `progress` shows a line per run and the progress bars. Returns the
    `SweepResult`, which displays the comparison table and figures in a notebook.
    """
    from resstream.training.sweep import plan_sweep

    check_field_names(
        fields,
        ("out_dir", "preset", "seeds", "layers", "learned", "benchmarks", "max_eval_tokens", "progress"),
    )
    check_sweep_fields(fields)
    names = benchmark_names(benchmarks)
    plan = plan_sweep(build_config(fields, preset=preset), seeds=seeds, layers=layers, learned=learned)
    log = say if progress else None
    return run_planned_sweep(
        plan, out_dir, benchmarks=names, max_eval_tokens=max_eval_tokens, progress=progress, log=log
    )


__all__ = [
    "SWEEP_OWNED_FIELDS",
    "Log",
    "benchmark_names",
    "check_sweep_fields",
    "run_planned_sweep",
    "sweep",
    "write_sweep_files",
]
