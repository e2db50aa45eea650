"""The statistics of the faithfulness check (`faithfulness` package docstring): agreement of a
score with the exact effects, the direct share, and the result of every prediction measured,
averaged over a window's predictions and then over windows."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import partial

from torch import Tensor

from resstream.analysis.interventions.atp import spearman as atp_spearman
from resstream.analysis.interventions.faithfulness.prediction import PredictionMeasures
from resstream.analysis.interventions.faithfulness.results import (
    MAGNITUDE_SCORES,
    Agreement,
    ComponentScore,
    CurvePoint,
    DirectShare,
    FaithfulnessResult,
    Mean,
)
from resstream.simulation.intervals import sample_interval, t_quantile


def spearman(x: Tensor, y: Tensor) -> float:
    """Spearman's rank correlation of x and y (N,) (`atp.spearman`: average ranks for ties);
    nan with fewer than two values or when either is constant."""
    found = atp_spearman(x.double().tolist(), y.double().tolist())
    return math.nan if found is None else found


def top_k_overlap(score: Tensor, effect: Tensor, k: int) -> float:
    """|top-k by |score| ∩ top-k by |effect|| / k, k capped at the number of components (ties
    broken by order); nan for no components."""
    k = min(k, score.numel())
    if k < 1:
        return math.nan
    top_score = set(score.abs().sort(descending=True, stable=True).indices[:k].tolist())
    top_effect = set(effect.abs().sort(descending=True, stable=True).indices[:k].tolist())
    return len(top_score & top_effect) / k


def agreement_values(score_name: str, score: Tensor, total: Tensor, k: int) -> tuple[float, float]:
    """(Spearman ρ, top-k overlap) of one score with the total effects (package docstring's
    sign convention: −effect for a signed score, |effect| for a magnitude)."""
    against = total.abs() if score_name in MAGNITUDE_SCORES else -total
    return spearman(score, against), top_k_overlap(score, total, k)


def direct_share(direct: Tensor, total: Tensor) -> float:
    """Σ direct·sign(total) / Σ |total| (nan when nothing has an effect)."""
    denominator = float(total.abs().sum())
    return float((direct * total.sign()).sum()) / denominator if denominator > 0 else math.nan


#: The fewest corpus windows whose 95% interval lies within ± one spread (standard deviation) of
#: the per-window values, t(0.975, n − 1)/√n < 1 (`few_windows_note`).
USABLE_WINDOWS = 7


@dataclass(frozen=True)
class ModelFields:
    """What a result records of the model measured and the settings (`summarise`)."""

    model: str
    top_k: int
    candidates: int
    neuron_count: int
    n_layers: int
    n_heads: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SampleFields:
    """What a result records of the text or corpus sample measured (`summarise`): the corpus
    (None for one text), the text's tokens, windows, their length, the sampling rule, the
    corpus fingerprint, and how components and positions were chosen."""

    dataset: str | None = None
    tokens: tuple[str, ...] = ()
    num_seqs: int = 1
    seq_len: int | None = None
    sample: str | None = None
    dataset_fingerprint: str | None = None
    rules: tuple[str, ...] = ()


def summarise(
    by_sequence: Sequence[Sequence[PredictionMeasures]],
    fields: ModelFields,
    sample: SampleFields = SampleFields(),
) -> FaithfulnessResult:
    """The result of every prediction measured, grouped by corpus window (one text: one group
    of one): each statistic averaged over a window's predictions, then over windows; over a
    corpus of fewer than `USABLE_WINDOWS` windows a note says the intervals are too wide to
    read (`few_windows_note`)."""
    measured = [m for group in by_sequence for m in group]
    if not measured:
        raise ValueError("no predictions were measured")
    top_k = fields.top_k
    agreement, shares = [], []
    for index, level in enumerate(measured[0].levels):
        k = min(top_k, len(level.components))
        for score in level.scores:
            rho = _over_sequences(
                by_sequence, partial(_agreement, level=index, score=score, k=top_k, which=0), (-1.0, 1.0)
            )
            overlap = _over_sequences(
                by_sequence, partial(_agreement, level=index, score=score, k=top_k, which=1), (0.0, 1.0)
            )
            agreement.append(Agreement(level.name, score, rho, overlap, k, len(level.components)))
        share = _over_sequences(by_sequence, partial(_direct_share_of, level=index))
        shares.append(DirectShare(level.name, share))
    curves = [
        CurvePoint(
            method,
            n,
            _over_sequences(by_sequence, partial(_curve_value, key=(method, n), which=0)),
            _over_sequences(by_sequence, partial(_curve_value, key=(method, n), which=1)),
        )
        for method, n in dict.fromkeys(key for m in measured for key in m.curves)
    ]
    few = few_windows_note(len(by_sequence)) if sample.dataset is not None else None
    return FaithfulnessResult(
        predictions=tuple(m.prediction for m in measured),
        agreement=tuple(agreement),
        direct_shares=tuple(shares),
        curves=tuple(curves),
        components=tuple(_component_scores(measured)),
        **{**asdict(fields), "notes": fields.notes + ((few,) if few else ())},
        **asdict(sample),
    )


def few_windows_note(windows: int) -> str | None:
    """A note for a corpus sample of fewer than `USABLE_WINDOWS` windows (None for more): a 95%
    t-interval over n windows spans ± t(0.975, n − 1)/√n times the spread of the per-window
    values: 8.98 times it at n = 2, 0.92 at n = 7."""
    if windows >= USABLE_WINDOWS:
        return None
    usable = t_quantile(0.975, USABLE_WINDOWS - 1) / math.sqrt(USABLE_WINDOWS)
    advice = f"{USABLE_WINDOWS} windows or more (`num_seqs`) give ± {usable:.2f} times the spread or less"
    if windows < 2:
        return f"too few sequences: one window gives no interval over windows; {advice}"
    factor = t_quantile(0.975, windows - 1) / math.sqrt(windows)
    useless = ", so these say next to nothing (a Spearman ρ's can reach all of [−1, 1])" if factor > 2 else ""
    return (
        f"too few sequences: a 95% interval over {windows} windows spans ± {factor:.2f} times the spread "
        f"(standard deviation) of the per-window values{useless}; {advice}"
    )


def _agreement(m: PredictionMeasures, *, level: int, score: str, k: int, which: int) -> float:
    """Spearman's ρ (`which` 0) or the top-k overlap (1) of one score at one prediction."""
    found = m.levels[level]
    return agreement_values(score, found.scores[score], found.total, k)[which]


def _direct_share_of(m: PredictionMeasures, *, level: int) -> float:
    return direct_share(m.levels[level].direct, m.levels[level].total)


def _curve_value(m: PredictionMeasures, *, key: tuple[str, int], which: int) -> float:
    found = m.curves.get(key)
    return math.nan if found is None else found[which]


def _over_sequences(
    by_sequence: Sequence[Sequence[PredictionMeasures]],
    value: Callable[[PredictionMeasures], float],
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> Mean:
    """The mean over sequences of each sequence's mean over its predictions (nan values left
    out), with its 95% t-interval; one sequence: the mean over its predictions, no interval."""
    groups = [[v for v in (value(m) for m in group) if not math.isnan(v)] for group in by_sequence]
    if len(by_sequence) == 1:
        kept = groups[0]
        return Mean(sum(kept) / len(kept) if kept else math.nan, math.nan, math.nan, len(kept))
    means = [sum(g) / len(g) for g in groups if g]
    if not means:
        return Mean(math.nan, math.nan, math.nan, 0)
    found = sample_interval(means, bounds=bounds)
    return Mean(found.value, found.low, found.high, len(means))


def _component_scores(measured: Sequence[PredictionMeasures]) -> Iterable[ComponentScore]:
    for index, m in enumerate(measured):
        for level in m.levels:
            for row, c in enumerate(level.components):
                yield ComponentScore(
                    prediction=index,
                    level=level.name,
                    component=c.name,
                    layer=c.layer,
                    index=c.index,
                    total=float(level.total[row]),
                    direct=float(level.direct[row]),
                    scores={name: float(values[row]) for name, values in level.scores.items()},
                )
