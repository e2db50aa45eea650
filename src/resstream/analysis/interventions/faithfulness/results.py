"""The result of the faithfulness check (`faithfulness` package docstring): the scores and
selections it compares, and the frozen records of what it measured."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from resstream.display import Displayable
from resstream.reprs import summary
from resstream.simulation.intervals import Estimate

#: The additive scores of each level, in the order tables and figures show them.
HEAD_SCORES = ("C", "DLA", "grad_x_act")
NEURON_SCORES = ("C", "DLA", "activation", "grad_x_act")
#: Scores without a sign: correlated with |effect| instead of −effect.
MAGNITUDE_SCORES = ("activation",)
#: How the ablation curves choose their top-n neurons (package docstring).
SELECTIONS = ("C", "DLA", "activation", "grad_x_act", "random", "effect")
#: The n of the ablation curves (capped at the neuron count; `effect` stops at the candidates).
CURVE_SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 300)
#: Neurons whose exact effect is measured (one text; a corpus prediction), and k of the overlap.
TEXT_CANDIDATES = 300
CORPUS_CANDIDATES = 100
TOP_K = 10
#: What each table of the long frame holds (`FaithfulnessResult` docstring).
AGREEMENT_METRICS = ("spearman", "top_k_overlap")
CURVE_METRICS = ("d_logprob", "d_reciprocal_rank")
EFFECT_METRICS = ("total", "direct", "direct_share")
#: The columns of `FaithfulnessResult.to_pandas()` (documented there).
FAITHFULNESS_COLUMNS = (
    "table",
    "level",
    "score",
    "n",
    "prediction",
    "component",
    "layer",
    "index",
    "metric",
    "value",
    "low",
    "high",
    "count",
)


@dataclass(frozen=True)
class Mean(Estimate):
    """A mean with its 95% interval (`Estimate`) and the `count` of sequences it is over (for
    one text: of predictions, and no interval)."""

    count: int = 0


@dataclass(frozen=True)
class Agreement:
    """How one additive `score` of one `level` ("head" or "neuron") agrees with the exact total
    effect: Spearman's ρ and the top-`k` overlap (package docstring), each a mean over
    predictions (over a corpus: over sequences, with its 95% interval); `components` scored
    per prediction."""

    level: str
    score: str
    spearman: Mean
    top_k_overlap: Mean
    k: int
    components: int


@dataclass(frozen=True)
class DirectShare:
    """The share of a level's total effect that is direct (package docstring)."""

    level: str
    share: Mean


@dataclass(frozen=True)
class CurvePoint:
    """The top-`n` neurons chosen by `method` (`SELECTIONS`) ablated jointly: the change of
    log p(target) and of the reciprocal rank (patched − clean)."""

    method: str
    n: int
    d_logprob: Mean
    d_reciprocal_rank: Mean


@dataclass(frozen=True)
class ScoredPrediction:
    """One prediction measured: `target` after `position` of corpus window `sequence` (0 for
    one text), its clean log-probability and 0-based rank."""

    sequence: int
    position: int
    target_id: int
    target: str
    logprob: float
    rank: int


@dataclass(frozen=True)
class ComponentScore:
    """One component at one prediction (an index into `predictions`): its exact `total` and
    `direct` zero-ablation effect on log p(target) and its additive `scores` by name."""

    prediction: int
    level: str
    component: str
    layer: int
    index: int
    total: float
    direct: float
    scores: dict[str, float]

    @property
    def direct_share(self) -> float:
        """direct / total (nan for a component without effect)."""
        return self.direct / self.total if self.total != 0.0 else math.nan


@dataclass(frozen=True)
class FaithfulnessResult(Displayable, renderer="resstream.reporting.faithfulness"):
    """How well each additive score predicts the exact effect of ablating a component
    (package docstring), for one text (`dataset` None) or over a corpus sample.

    `predictions`: every prediction measured; `agreement`: per level and score, Spearman's ρ
    and the top-`top_k` overlap with the total effect; `direct_shares`: per level;
    `curves`: the ablation curves; `components`: every component at every prediction with
    its effects and scores. `candidates` neurons (of `neuron_count`) had their effect measured
    per prediction; `rules` says how candidates and positions were chosen.

    `to_pandas()` columns: table — "agreement", "direct_share", "curve" or "component";
    level — "head" or "neuron"; score — the additive score (for curve rows the selection
    method); n — k of a top-k overlap, or the neurons ablated jointly in a curve; prediction —
    index into `predictions` (component rows); component — its name ("L3.H2", "L5.N1031"); layer
    and index — of the component (head or neuron); metric — "spearman", "top_k_overlap",
    "direct_share", "d_logprob", "d_reciprocal_rank", "total", "direct", or a score name for a
    component's score; value — the mean (a component's own value); low, high — its 95%
    interval over sequences (empty for one text and for component rows); count — the
    sequences (or predictions, for one text) the mean is over.
    """

    model: str
    dataset: str | None
    tokens: tuple[str, ...]
    predictions: tuple[ScoredPrediction, ...]
    agreement: tuple[Agreement, ...]
    direct_shares: tuple[DirectShare, ...]
    curves: tuple[CurvePoint, ...]
    components: tuple[ComponentScore, ...]
    top_k: int
    candidates: int
    neuron_count: int
    n_layers: int
    n_heads: int
    num_seqs: int = 1
    seq_len: int | None = None
    sample: str | None = None
    dataset_fingerprint: str | None = None
    rules: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def agreement_of(self, level: str, score: str) -> Agreement:
        """The agreement of one level and score."""
        for each in self.agreement:
            if each.level == level and each.score == score:
                return each
        raise KeyError(f"no agreement for {level} {score}")

    def curve(self, method: str) -> list[CurvePoint]:
        """One selection method's curve, by n."""
        return [point for point in self.curves if point.method == method]

    def to_dict(self) -> dict[str, Any]:
        """The content of ablate.json (`resstream.io.write_json` writes nan as null), with
        `command` "ablate" and `mode` "faithfulness" first, which tell it from an ablation's."""
        return {"command": "ablate", "mode": "faithfulness", **asdict(self)}

    def __repr__(self) -> str:
        where = f"on {self.dataset}" if self.dataset else "on one text"
        heads = _headline(self, "head", "C")
        neurons = _headline(self, "neuron", "C")
        return summary(
            self,
            "zero-ablation faithfulness",
            self.model,
            f"{len(self.predictions)} predictions {where}",
            f"Spearman ρ(C, −effect): heads {heads}, neurons {neurons}",
        )


def _headline(result: FaithfulnessResult, level: str, score: str) -> str:
    try:
        value = result.agreement_of(level, score).spearman.value
    except KeyError:
        return "–"
    return "nan" if math.isnan(value) else f"{value:.2f}"
