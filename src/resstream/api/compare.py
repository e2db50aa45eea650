"""`resstream.compare(...)`: baseline / best fixed cut / learned gate of finished sweeps across
benchmarks, each run evaluated where its cached scores do not answer (`resstream compare`).

Which scores are used, and when a run is evaluated, is `resstream.training.sweep.fill_evals`;
the table is `resstream.reporting.tables.compare_table`. The result, a `Comparison`, holds
the table and what compare.json records beside it (inputs, benchmarks, token cap, skipped
benchmarks, what was reused or evaluated).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resstream.display import Displayable
from resstream.errors import UsageError
from resstream.reporting.notebook import NotebookView, notebook_view, tidy_frame
from resstream.reporting.tables import CompareTable, compare_frame, compare_table
from resstream.reprs import summary
from resstream.training.evaluate import BENCHMARKS, BenchmarkData, check_benchmarks
from resstream.training.records import RunRecord
from resstream.training.sweep import EvalSummary

if TYPE_CHECKING:
    import pandas

#: Where progress lines and notes go (one line each).
Log = Callable[[str], None]


@dataclass(frozen=True)
class Comparison(Displayable):
    """A comparison of finished sweeps: the table (`CompareTable`) and the settings it was
    made with; `to_dict()` is compare.json.

    `to_pandas()` columns: those of `table` (`resstream.reporting.tables.COMPARE_COLUMNS`;
    compare.csv is this frame): row, model, cut_layer, alpha, seeds, benchmark, metric, n,
    mean, std, best (see `CompareTable`).
    """

    table: CompareTable
    inputs: tuple[str, ...]  # the sweep or seed directories, as given
    benchmarks: tuple[str, ...]  # the benchmarks compared
    max_eval_tokens: int | None  # tokens per benchmark (None: all)
    skipped: dict[str, str]  # benchmark -> why it was left out of the default set
    evaluations: EvalSummary  # what was reused from the runs' eval.json, what evaluated now
    runs: tuple[RunRecord, ...]  # every run compared, with the scores used
    device: str  # where runs were evaluated

    def __repr__(self) -> str:
        cap = f"at most {self.max_eval_tokens:,} tokens each" if self.max_eval_tokens else "every token"
        benchmarks = f"{len(self.runs)} runs; benchmarks {', '.join(self.benchmarks) or 'none'}, {cap}"
        skipped = f"skipped {', '.join(self.skipped)}" if self.skipped else ""
        return summary(self, *self.table.summary_parts(), benchmarks, skipped)

    def to_dict(self) -> dict[str, Any]:
        """compare.json: the table's `to_dict`, the inputs, benchmarks, token cap, the skipped
        benchmarks and the evaluations' summary."""
        return {
            **self.table.to_dict(),
            "inputs": list(self.inputs),
            "benchmarks": list(self.benchmarks),
            "max_eval_tokens": self.max_eval_tokens,
            "skipped": dict(self.skipped),
            "evaluations": self.evaluations.to_dict(),
        }


def _table_frame(comparison: Comparison) -> pandas.DataFrame:
    return compare_frame(comparison.table)


def _table_view(comparison: Comparison) -> NotebookView:
    from resstream.reporting.experiments import compare_view  # matplotlib: only when drawn

    return compare_view(comparison.table)


# Registered by class (a decorator would evaluate the return annotation, pandas, at import).
tidy_frame.register(Comparison, _table_frame)
notebook_view.register(Comparison, _table_view)


def skipped_line(data: BenchmarkData, data_dir: str | os.PathLike[str] | None) -> str | None:
    """One line naming the benchmarks left out of the default set, and why (None: none was)."""
    from resstream.data.sources import data_dir as local_data_dir

    if not data.unavailable:
        return None
    names = ", ".join(data.unavailable)
    messages = list(data.unavailable.values())
    if all("is not in the data directory" in m for m in messages):
        where = local_data_dir(data_dir)
        reason = (
            "no data directory is set (give `data_dir` or set RESSTREAM_DATA) "
            "and Hugging Face could not be reached"
            if where is None
            else f"they are not in the data directory {str(where)!r} and Hugging Face could not be reached"
        )
    else:
        reason = messages[0]
    kept = ", ".join(data.fingerprints) or "none"
    return f"compare: skipped {names}: {reason}; comparing validation loss and {kept}"


def _inputs(run_dirs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> tuple[Path, ...]:
    """The sweep / seed directories: one path or several; UsageError for none."""
    paths = (run_dirs,) if isinstance(run_dirs, str | os.PathLike) else tuple(run_dirs)
    if not paths:
        raise UsageError("`run_dirs` is empty; give the sweep directories (or their seed-<s> folders)")
    return tuple(Path(p) for p in paths)


def _benchmark_names(benchmarks: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """The benchmarks named (comma-separated or a sequence, 'all' for every one), checked;
    None for the default."""
    if benchmarks is None:
        return None
    given = benchmarks.split(",") if isinstance(benchmarks, str) else list(benchmarks)
    names = check_benchmarks([name.strip() for name in given if name.strip()], allow_all=True)
    if not names:
        raise UsageError(
            f"`benchmarks` {benchmarks!r} names no benchmark; allowed: {', '.join(BENCHMARKS)}, all"
        )
    return names


def compare(
    run_dirs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    benchmarks: str | Iterable[str] | None = None,
    *,
    max_eval_tokens: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    device: str = "auto",
    progress: bool = False,
    log: Log | None = None,
) -> Comparison:
    """Baseline, best fixed cut and learned gate of finished sweeps (`run_dirs`: sweep
    directories written by `resstream sweep`, or their seed-<s> folders) on `benchmarks`.

    `benchmarks` is comma-separated or a sequence ('all': every one); by default every
    benchmark whose text can be read here (`data_dir`, else RESSTREAM_DATA, else Hugging Face),
    the others named in `Comparison.skipped`. Each run's score is reused from its eval.json
    when it was made with `max_eval_tokens` (default: the sweeps' own, their run.json), of
    the same weights and benchmark text; otherwise the run is evaluated now on `device` and
    its eval.json updated. `log` receives the notes (skipped benchmarks, what was reused and
    what evaluated), and with `progress` one line per run evaluated and progress bars.
    """
    from resstream.devices import resolve_device
    from resstream.training import sweep as sw
    from resstream.training.evaluate import EvalSettings, find_benchmark_data
    from resstream.training.records import load_runs, sweep_max_eval_tokens

    inputs = _inputs(run_dirs)
    names = _benchmark_names(benchmarks)
    if max_eval_tokens is not None and max_eval_tokens < 2:
        raise UsageError(f"`max_eval_tokens` must be >= 2, got {max_eval_tokens}")
    dev = str(resolve_device(device))
    records = load_runs(inputs)
    if max_eval_tokens is None:
        max_eval_tokens = sweep_max_eval_tokens(inputs)
    local = str(data_dir) if data_dir is not None else None
    skipped: dict[str, str] = {}
    data = None
    if names is None:
        data = find_benchmark_data(BENCHMARKS, local)
        names, skipped = tuple(data.fingerprints), dict(data.unavailable)
        line = skipped_line(data, data_dir)
        if line and log:
            log(line)
    settings = EvalSettings(names, data_dir=local, max_tokens=max_eval_tokens, device=dev)
    records, evaluations = sw.fill_evals(
        records, settings, progress=progress, log=log if progress else None, data=data
    )
    if log:
        for line in evaluations.lines():
            log(f"compare: {line}")
    return Comparison(
        table=compare_table(records, names),
        inputs=tuple(str(p) for p in inputs),
        benchmarks=tuple(names),
        max_eval_tokens=max_eval_tokens,
        skipped=skipped,
        evaluations=evaluations,
        runs=tuple(records),
        device=dev,
    )


__all__ = ["Comparison", "Log", "compare", "skipped_line"]
