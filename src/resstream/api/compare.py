"""`resstream.compare(...)`: baseline / best fixed cut / learned gate of finished sweeps across
benchmarks, each run evaluated where its cached scores do not answer (`resstream compare`).

Which scores are used, and when a run is evaluated, is `resstream.training.sweep.fill_evals`
(its two halves, `check_evals` then `run_evals`, with compare's notes between them);
the table is `resstream.reporting.tables.compare_table`. The result, a `Comparison`, holds
the table and what compare.json records beside it (inputs, benchmarks, token cap and where it
came from, skipped benchmarks, what was reused or evaluated).

The token cap (`token_cap`): the one given (`max_eval_tokens`, 'all' for every token), else the
sweeps' own (their run.json: a sweep that evaluated benchmarks or set a cap chose one, so its
cached scores are reused), else `DEFAULT_MAX_EVAL_TOKENS`, which keeps the comparison of a quick
sweep that evaluated nothing in seconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from resstream.display import Displayable
from resstream.errors import UsageError
from resstream.reporting.notebook import NotebookView, notebook_view, tidy_frame
from resstream.reporting.tables import CompareTable, compare_frame, compare_table
from resstream.reprs import summary
from resstream.training.evaluate import BENCHMARKS, BenchmarkData, check_benchmarks
from resstream.training.records import DEFAULT_MAX_EVAL_TOKENS, RunRecord
from resstream.training.sweep import EvalSummary

if TYPE_CHECKING:
    import pandas

#: Where progress lines and notes go (one line each).
Log = Callable[[str], None]
#: Where a comparison's token cap came from (`Comparison.max_eval_tokens_from`).
CapSource = Literal["given", "sweep", "default"]


@dataclass(frozen=True)
class TokenCap:
    """A comparison's tokens per benchmark (`tokens`, None: every token) and where the value
    came from (`source`)."""

    tokens: int | None
    source: CapSource

    def text(self) -> str:
        """'at most 2,000 tokens per benchmark' or 'every token of each benchmark'."""
        if self.tokens is None:
            return "every token of each benchmark"
        return f"at most {self.tokens:,} tokens per benchmark"

    def line(self) -> str | None:
        """The note saying a cap the call did not give (None for a given one)."""
        if self.source == "given":
            return None
        if self.source == "sweep":
            return (
                f"compare: {self.text()}, the sweeps' own (their run.json), so their cached scores are reused"
            )
        return (
            f"compare: {self.text()}, the default (the sweeps evaluated no benchmark); "
            f"`max_eval_tokens` 'all' scores every token"
        )


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
    max_eval_tokens_from: CapSource  # given, the sweeps' own or the default (`token_cap`)
    skipped: dict[str, str]  # benchmark -> why it was left out of the default set
    evaluations: EvalSummary  # what was reused from the runs' eval.json, what evaluated now
    runs: tuple[RunRecord, ...]  # every run compared, with the scores used
    device: str  # where runs were evaluated

    def __repr__(self) -> str:
        cap = TokenCap(self.max_eval_tokens, self.max_eval_tokens_from)
        source = {"given": "as given", "sweep": "the sweeps' own", "default": "the default"}[cap.source]
        names = ", ".join(self.benchmarks) or "none"
        benchmarks = f"{len(self.runs)} runs; benchmarks {names}, {cap.text()} ({source})"
        skipped = f"skipped {', '.join(self.skipped)}" if self.skipped else ""
        return summary(self, *self.table.summary_parts(), benchmarks, skipped)

    def to_dict(self) -> dict[str, Any]:
        """compare.json: the table's `to_dict`, the inputs, benchmarks, token cap (and where it
        came from: given, sweep or default), the skipped benchmarks and the evaluations' summary."""
        return {
            **self.table.to_dict(),
            "inputs": list(self.inputs),
            "benchmarks": list(self.benchmarks),
            "max_eval_tokens": self.max_eval_tokens,
            "max_eval_tokens_from": self.max_eval_tokens_from,
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


def _prefixed(log: Log | None) -> Log | None:
    """`log` with each line marked as compare's (None stays None)."""
    if log is None:
        return None
    target = log
    return lambda line: target(f"compare: {line}")


def token_cap(max_eval_tokens: int | Literal["all"] | None, inputs: Sequence[Path]) -> TokenCap:
    """The tokens per benchmark of a comparison (see the module docstring); UsageError for a
    bad value, or for sweeps that chose different caps when none is given."""
    from resstream.training.records import sweep_eval_caps

    if max_eval_tokens == "all":
        return TokenCap(None, "given")
    if max_eval_tokens is not None:
        if isinstance(max_eval_tokens, bool) or not isinstance(max_eval_tokens, int):
            raise UsageError(f"`max_eval_tokens` must be an integer >= 2 or 'all', got {max_eval_tokens!r}")
        if max_eval_tokens < 2:
            raise UsageError(f"`max_eval_tokens` must be >= 2, got {max_eval_tokens}")
        return TokenCap(max_eval_tokens, "given")
    caps = sweep_eval_caps(inputs)
    if len(caps) > 1:
        values = ", ".join("all" if cap is None else str(cap) for cap in sorted(caps, key=str))
        raise UsageError(
            f"the sweeps were evaluated with different `max_eval_tokens` ({values}); give `max_eval_tokens`"
        )
    return TokenCap(caps[0], "sweep") if caps else TokenCap(DEFAULT_MAX_EVAL_TOKENS, "default")


def compare(
    run_dirs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    benchmarks: str | Iterable[str] | None = None,
    *,
    max_eval_tokens: int | Literal["all"] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    device: str = "auto",
    progress: bool = False,
    log: Log | None = None,
) -> Comparison:
    """Baseline, best fixed cut and learned gate of finished sweeps (`run_dirs`: sweep
    directories written by `resstream sweep`, or their seed-<s> folders) on `benchmarks`.

    `benchmarks` is comma-separated or a sequence ('all': every one); by default every
    benchmark whose text can be read here (`data_dir`, else RESSTREAM_DATA, else Hugging Face),
    the others named in `Comparison.skipped`. Each benchmark scores its first
    `max_eval_tokens` tokens ('all': every token; default: the sweeps' own cap, their run.json,
    else `DEFAULT_MAX_EVAL_TOKENS` (2,000): `token_cap`). Each run's score is reused from its
    eval.json when it was made with that cap, of the same weights and benchmark text; otherwise
    the run is evaluated now on `device` and its eval.json updated. `log` receives the notes
    (a cap not given, skipped benchmarks, what was reused and what evaluated), and with
    `progress` the estimate (tokens, runs, benchmarks, about how long, on which device) before
    the first evaluation, one line per run and benchmark evaluated, and progress bars.
    """
    from resstream.devices import resolve_device
    from resstream.training import sweep as sw
    from resstream.training.evaluate import EvalSettings, find_benchmark_data
    from resstream.training.records import load_runs

    inputs = _inputs(run_dirs)
    names = _benchmark_names(benchmarks)
    cap = token_cap(max_eval_tokens, inputs)
    dev = str(resolve_device(device))
    records = load_runs(inputs)
    local = str(data_dir) if data_dir is not None else None
    skipped: dict[str, str] = {}
    data = None
    if names is None:
        data = find_benchmark_data(BENCHMARKS, local)
        names, skipped = tuple(data.fingerprints), dict(data.unavailable)
    settings = EvalSettings(names, data_dir=local, max_tokens=cap.tokens, device=dev)
    tasks, evaluations = sw.check_evals(records, settings, data)  # refused before any note
    for line in (skipped_line(data, data_dir) if data is not None else None, cap.line()):
        if line and log:
            log(line)
    records = sw.run_evals(tasks, settings, progress=progress, log=_prefixed(log) if progress else None)
    if log:
        for line in evaluations.lines():
            log(f"compare: {line}")
    return Comparison(
        table=compare_table(records, names),
        inputs=tuple(str(p) for p in inputs),
        benchmarks=tuple(names),
        max_eval_tokens=cap.tokens,
        max_eval_tokens_from=cap.source,
        skipped=skipped,
        evaluations=evaluations,
        runs=tuple(records),
        device=dev,
    )


__all__ = [
    "DEFAULT_MAX_EVAL_TOKENS",
    "CapSource",
    "Comparison",
    "Log",
    "TokenCap",
    "compare",
    "skipped_line",
    "token_cap",
]
