"""Tables of sweep results: the per-run sweep frame (sweep.csv) and the baseline / best fixed
cut / learned gate comparison (Markdown, and its frame: compare.csv; JSON).

These functions only aggregate numbers already computed (validation losses from training,
benchmark scores from evaluation); they run no model. The notebook views of both are
registered by `resstream.reporting.experiments`.

Convention: a cell is the mean over seeds ± the sample standard deviation (ddof = 1), the ±
part only when at least two seeds contribute; n is the number of seeds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resstream.display import Displayable
from resstream.reporting.notebook import frame_csv, long_frame
from resstream.reprs import summary
from resstream.training.records import RunRecord, Scores, SweepResult

if TYPE_CHECKING:
    import pandas

DIGITS = 3
CONVENTION = (
    "mean ± sample standard deviation (ddof = 1) over seeds; ± shown only with ≥ 2 seeds; n = number of seeds"
)
BOLD_RULE = "bold: best value per column (lowest loss / perplexity, highest accuracy); accuracies in percent"


# --------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class Stat:
    """Values of one metric over seeds."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        """Number of seeds."""
        return len(self.values)

    @property
    def mean(self) -> float:
        """Arithmetic mean."""
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation (ddof = 1); None with fewer than two values."""
        return statistics.stdev(self.values) if self.n >= 2 else None

    def format(self, digits: int = DIGITS) -> str:
        """'3.000 ± 1.414' (or '3.000' for a single seed)."""
        text = f"{self.mean:.{digits}f}"
        return text if self.std is None else f"{text} ± {self.std:.{digits}f}"

    def to_dict(self) -> dict[str, Any]:
        """{"mean", "std", "n", "values"}."""
        return {"mean": self.mean, "std": self.std, "n": self.n, "values": list(self.values)}


def make_stat(values: Iterable[float | int | None]) -> Stat | None:
    """A Stat over the finite values, or None when there are none."""
    kept = tuple(float(v) for v in values if v is not None and math.isfinite(float(v)))
    return Stat(kept) if kept else None


# ------------------------------------------------------------------------------ columns
@dataclass(frozen=True)
class Column:
    """One metric column of the comparison table."""

    key: str  # "val_loss" or "<benchmark>/<metric>"
    label: str
    higher_is_better: bool = False

    def value(self, record: RunRecord) -> float | int | None:
        """This column's value for one run (None when missing)."""
        if self.key == "val_loss":
            return record.val_loss
        benchmark, metric = self.key.split("/", 1)
        return (record.evals.get(benchmark) or {}).get(metric)


def compare_columns(records: Sequence[RunRecord], benchmarks: Sequence[str]) -> tuple[Column, ...]:
    """Validation loss, then per benchmark perplexity and last-word accuracy (where present)."""
    columns = [Column("val_loss", "val loss")]
    for name in benchmarks:
        columns.append(Column(f"{name}/perplexity", f"{name} ppl"))
        accuracy = Column(f"{name}/last_word_accuracy", f"{name} last-word acc (%)", higher_is_better=True)
        if any(accuracy.value(r) is not None for r in records):
            columns.append(accuracy)
    return tuple(columns)


# --------------------------------------------------------------------------- comparison
@dataclass(frozen=True)
class CompareRow:
    """One model variant of the comparison, aggregated over seeds."""

    key: str  # baseline | fixed | learned
    label: str
    cut_layer: int | None
    alpha: float | None
    seeds: tuple[int, ...]
    cells: dict[str, Stat | None]

    @property
    def n(self) -> int:
        """Number of seeds of this row."""
        return len(self.seeds)


@dataclass(frozen=True)
class FixedCut:
    """Mean validation loss of the fixed-cut runs at one (layer, α)."""

    cut_layer: int
    alpha: float | None
    val_loss: Stat | None


@dataclass(frozen=True)
class CompareTable(Displayable, renderer="resstream.reporting.experiments"):
    """Baseline / best fixed cut / learned gate across benchmarks (compare.md).

    `to_pandas()` columns (`COMPARE_COLUMNS`; compare.csv is this frame), one row per table row
    and column: row — baseline, fixed, learned (or pretrained); model — the row's label in
    compare.md; cut_layer, alpha — the fixed cut's layer and α (empty for other rows); seeds —
    the row's number of seeds (compare.md's n); benchmark — empty for the validation loss;
    metric — val_loss, perplexity or last_word_accuracy; n — the seeds with a value in this
    cell; mean, std — their mean and sample standard deviation (std empty below two, both empty
    for no value); best — bold in compare.md (the best mean of the column).
    """

    rows: tuple[CompareRow, ...]
    columns: tuple[Column, ...]
    fixed_cuts: tuple[FixedCut, ...]
    best_fixed: FixedCut | None

    def __repr__(self) -> str:
        return summary(self, *self.summary_parts())

    def summary_parts(self) -> list[str]:
        """The lines of a short summary: each row's first column (the validation loss), then
        the columns compared."""
        if not self.columns:
            return [f"{len(self.rows)} rows, no columns"]
        first = self.columns[0]
        lines = [
            f"{row.label} (n={row.n}): {first.label} {self.cell_text(row, first, bold=False)}"
            for row in self.rows
        ]
        return [*lines, "columns: " + ", ".join(column.label for column in self.columns)]

    def best_rows(self, column: Column) -> set[str]:
        """Keys of the rows holding the best mean of `column` (several on an exact tie)."""
        means = {row.key: stat.mean for row in self.rows if (stat := row.cells.get(column.key))}
        if not means:
            return set()
        target = max(means.values()) if column.higher_is_better else min(means.values())
        return {key for key, mean in means.items() if mean == target}

    def cell_text(self, row: CompareRow, column: Column, bold: bool = True) -> str:
        """Formatted cell: mean ± std, '(n=k)' when fewer seeds than the row, bold when best."""
        stat = row.cells.get(column.key)
        if stat is None:
            return "—"
        text = stat.format()
        if stat.n != row.n:
            text += f" (n={stat.n})"
        return f"**{text}**" if bold and row.key in self.best_rows(column) else text

    def footer(self) -> str:
        """The conventions and the fixed-cut ranking, as one paragraph."""
        ranking = ", ".join(
            f"k={cut.cut_layer}: {cut.val_loss.format() if cut.val_loss else '—'}" for cut in self.fixed_cuts
        )
        parts = [CONVENTION, BOLD_RULE]
        if self.best_fixed is not None:
            same_split = any(column.key.startswith("shakespeare/") for column in self.columns)
            cells = "its val loss and the shakespeare column are" if same_split else "its val loss is"
            biased = "those two cells are" if same_split else "that cell is"
            parts.append(
                "best fixed cut: the fixed layer with the lowest mean validation loss "
                f"(val loss by layer: {ranking}); it is chosen on the split {cells} measured on, "
                f"so {biased} optimistically biased for that row"
            )
        return "; ".join(parts) + "."

    def panels(self) -> tuple[Column, ...]:
        """The columns a figure of the table draws: validation loss and each perplexity."""
        return tuple(c for c in self.columns if c.key == "val_loss" or c.key.endswith("/perplexity"))

    def to_markdown(self) -> str:
        """The table as GitHub Markdown with a footer line."""
        header = ["model", "n", *(c.label for c in self.columns)]
        lines = [
            "| " + " | ".join(header) + " |",
            "|" + "|".join([":---", "---:", *["---:"] * len(self.columns)]) + "|",
        ]
        for row in self.rows:
            cells = [row.label, str(row.n), *(self.cell_text(row, c) for c in self.columns)]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n\n" + self.footer() + "\n"

    def to_csv(self) -> str:
        """compare.csv: the table's frame (`compare_frame`)."""
        return frame_csv(compare_frame(self))

    def to_dict(self) -> dict[str, Any]:
        """Machine-readable form (compare.json)."""
        return {
            "convention": CONVENTION,
            "columns": [
                {"key": c.key, "label": c.label, "higher_is_better": c.higher_is_better} for c in self.columns
            ],
            "best_fixed_cut": _cut_dict(self.best_fixed) if self.best_fixed else None,
            "fixed_cuts": [_cut_dict(cut) for cut in self.fixed_cuts],
            "rows": [self._row_dict(row) for row in self.rows],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompareTable:
        """Inverse of `to_dict` (compare.json): each cell's values become its `Stat` again."""
        columns = tuple(
            Column(c["key"], c["label"], bool(c.get("higher_is_better"))) for c in data["columns"]
        )
        rows = tuple(
            CompareRow(
                key=row["row"],
                label=row["label"],
                cut_layer=row.get("cut_layer"),
                alpha=row.get("alpha"),
                seeds=tuple(row.get("seeds") or ()),
                cells={key: _stat_from_dict(cell) for key, cell in (row.get("cells") or {}).items()},
            )
            for row in data["rows"]
        )
        cuts = tuple(_cut_from_dict(cut) for cut in data.get("fixed_cuts") or ())
        best = data.get("best_fixed_cut")
        return cls(rows, columns, cuts, _cut_from_dict(best) if best else None)

    def _row_dict(self, row: CompareRow) -> dict[str, Any]:
        cells = {}
        for column in self.columns:
            stat = row.cells.get(column.key)
            cells[column.key] = (
                None if stat is None else {**stat.to_dict(), "best": row.key in self.best_rows(column)}
            )
        return {
            "row": row.key,
            "label": row.label,
            "cut_layer": row.cut_layer,
            "alpha": row.alpha,
            "n": row.n,
            "seeds": list(row.seeds),
            "cells": cells,
        }


def _cut_dict(cut: FixedCut) -> dict[str, Any]:
    return {
        "cut_layer": cut.cut_layer,
        "alpha": cut.alpha,
        "val_loss": cut.val_loss.to_dict() if cut.val_loss else None,
    }


def _stat_from_dict(cell: dict[str, Any] | None) -> Stat | None:
    """A cell of compare.json ({"values": [...], ...}) as a Stat; None for an empty cell."""
    return make_stat(cell.get("values") or ()) if cell else None


def _cut_from_dict(cut: dict[str, Any]) -> FixedCut:
    return FixedCut(int(cut["cut_layer"]), cut.get("alpha"), _stat_from_dict(cut.get("val_loss")))


def _fixed_groups(records: Sequence[RunRecord]) -> dict[tuple[int, float | None], list[RunRecord]]:
    groups: dict[tuple[int, float | None], list[RunRecord]] = {}
    for record in records:
        if record.gate == "fixed" and record.cut_layer is not None:
            groups.setdefault((int(record.cut_layer), record.alpha), []).append(record)
    return dict(sorted(groups.items(), key=lambda item: (item[0][0], item[0][1] or 0.0)))


def fixed_cuts(records: Sequence[RunRecord]) -> tuple[FixedCut, ...]:
    """Every fixed (layer, α) with its validation loss over seeds, by layer."""
    return tuple(
        FixedCut(k, alpha, make_stat(r.val_loss for r in runs))
        for (k, alpha), runs in _fixed_groups(records).items()
    )


def best_fixed_cut(cuts: Sequence[FixedCut]) -> FixedCut | None:
    """The cut with the lowest mean validation loss (the lower layer on a tie)."""
    scored = [(cut, cut.val_loss) for cut in cuts if cut.val_loss is not None]
    best = min(scored, key=lambda scored_cut: (scored_cut[1].mean, scored_cut[0].cut_layer), default=None)
    return None if best is None else best[0]


def _row(
    key: str,
    label: str,
    runs: Sequence[RunRecord],
    columns: Sequence[Column],
    cut_layer: int | None = None,
    alpha: float | None = None,
) -> CompareRow:
    seeds = tuple(sorted({r.seed for r in runs}))
    cells = {c.key: make_stat(c.value(r) for r in runs) for c in columns}
    return CompareRow(key, label, cut_layer, alpha, seeds, cells)


def compare_table(records: Sequence[RunRecord], benchmarks: Sequence[str]) -> CompareTable:
    """Aggregate runs into the baseline / best fixed cut / learned gate table."""
    columns = compare_columns(records, benchmarks)
    cuts = fixed_cuts(records)
    best = best_fixed_cut(cuts)
    rows = []
    baseline = [r for r in records if r.gate == "none"]
    if baseline:
        rows.append(_row("baseline", "baseline", baseline, columns))
    if best is not None:
        runs = _fixed_groups(records)[(best.cut_layer, best.alpha)]
        alpha = f", α={best.alpha:g}" if best.alpha is not None else ""
        rows.append(
            _row(
                "fixed",
                f"best fixed cut (k={best.cut_layer}{alpha})",
                runs,
                columns,
                best.cut_layer,
                best.alpha,
            )
        )
    learned = [r for r in records if r.gate == "learned"]
    if learned:
        rows.append(_row("learned", "learned gate", learned, columns))
    return CompareTable(tuple(rows), columns, cuts, best)


def model_record(name: str, scores: Scores) -> RunRecord:
    """A model that is not part of a sweep (a pretrained model, scored by `resstream eval`)
    as a record: its benchmark scores, no validation loss, gate "pretrained"."""
    return RunRecord(
        seed=0, name=name, gate="pretrained", cut_layer=None, alpha=None, val_loss=math.nan, evals=scores
    )


def model_row(record: RunRecord, columns: Sequence[Column]) -> CompareRow:
    """The row of one `model_record`, to sit beside a comparison's rows (n = 1)."""
    return _row("pretrained", record.name, [record], columns)


# ------------------------------------------------------------------------------ frames
#: The columns of `CompareTable.to_pandas()` and compare.csv, in order.
COMPARE_COLUMNS = (
    "row",
    "model",
    "cut_layer",
    "alpha",
    "seeds",
    "benchmark",
    "metric",
    "n",
    "mean",
    "std",
    "best",
)

#: The columns of `SweepResult.to_pandas()` and sweep.csv, in order.
SWEEP_COLUMNS = ("seed", "run", "gate", "cut_layer", "alpha", "benchmark", "metric", "value", "n")

#: Each benchmark score a frame shows and the count it is a mean over (a key of the same entry).
SCORE_COUNTS = (
    ("loss", "num_tokens"),
    ("perplexity", "num_tokens"),
    ("accuracy", "num_tokens"),
    ("last_word_accuracy", "num_examples"),
)

#: Scores only some benchmarks have (LAMBADA's): a row only where the entry holds a value.
OPTIONAL_SCORES = frozenset({"last_word_accuracy"})

#: Integer columns that may be empty (pandas' nullable integers, written without ".0").
_COUNTS = ("cut_layer", "seeds", "n")


def split_key(key: str) -> tuple[str | None, str]:
    """(benchmark, metric) of a column key: (None, "val_loss") or ("lambada", "perplexity")."""
    benchmark, _, metric = key.rpartition("/")
    return benchmark or None, metric


def score_rows(entry: Mapping[str, Any]) -> list[tuple[str, float, int | None]]:
    """(metric, value, n) of one benchmark's scores (an eval.json entry or a run's scores):
    every score of `SCORE_COUNTS` it has, a missing one (null in the JSON) as NaN, and the
    count it is a mean over; `last_word_accuracy` only where the benchmark has one."""
    rows = []
    for metric, count in SCORE_COUNTS:
        value = entry.get(metric)
        if value is None and metric in OPTIONAL_SCORES:
            continue
        rows.append((metric, math.nan if value is None else float(value), entry.get(count)))
    return rows


def typed_frame(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> pandas.DataFrame:
    """`long_frame` with its count columns (`_COUNTS`) as nullable integers."""
    return long_frame(columns, rows, integers=_COUNTS)


def compare_frame(table: CompareTable) -> pandas.DataFrame:
    """`CompareTable.to_pandas()`: one row per table row and column (`COMPARE_COLUMNS`)."""
    best = {column.key: table.best_rows(column) for column in table.columns}
    rows = []
    for row in table.rows:
        for column in table.columns:
            benchmark, metric = split_key(column.key)
            stat = row.cells.get(column.key)
            rows.append(
                (
                    row.key,
                    row.label,
                    row.cut_layer,
                    row.alpha,
                    row.n,
                    benchmark,
                    metric,
                    stat.n if stat else 0,
                    stat.mean if stat else math.nan,
                    stat.std if stat and stat.std is not None else math.nan,
                    row.key in best[column.key],
                )
            )
    return typed_frame(COMPARE_COLUMNS, rows)


def sweep_benchmarks(result: SweepResult) -> list[str]:
    """The benchmarks a sweep's tables show: its own, else every one a run has scores for (in
    the order the runs hold them)."""
    return list(result.benchmarks) or list(dict.fromkeys(b for r in result.runs for b in r.evals))


def sweep_frame(result: SweepResult) -> pandas.DataFrame:
    """`SweepResult.to_pandas()`: per run, its validation loss, then each benchmark's scores
    (`score_rows`; a benchmark the run has no scores for has no rows)."""
    rows: list[tuple[Any, ...]] = []
    benchmarks = sweep_benchmarks(result)
    for run in result.runs:
        who = (run.seed, run.name, run.gate, run.cut_layer, run.alpha)
        rows.append((*who, None, "val_loss", run.val_loss, None))
        for benchmark in benchmarks:
            scores = run.evals.get(benchmark)
            if scores:
                rows += [(*who, benchmark, *score) for score in score_rows(scores)]
    return typed_frame(SWEEP_COLUMNS, rows)


def sweep_table(result: SweepResult) -> CompareTable:
    """The baseline / best fixed cut / learned gate table of one sweep's runs, on its
    benchmarks (`sweep_benchmarks`)."""
    return compare_table(list(result.runs), sweep_benchmarks(result))


# ---------------------------------------------------------------------------- sweep CSV
def sweep_csv(result: SweepResult) -> str:
    """sweep.csv: the sweep's frame (`sweep_frame`)."""
    return frame_csv(sweep_frame(result))
