"""Faithfulness of the additive scores: does a component's additive share predict what removing
it does to the prediction?

For one prediction (the target token at one position) every head and a candidate set of FFN
neurons are zero-ablated, each alone, **at the prediction's position only** (the position the
additive scores describe; ablating at every position would add what later positions read from
earlier ones, which no additive score at this position accounts for). The exact total effect
on log p(target) (`effects.component_effects`, everything downstream recomputed) and the
direct effect (the change carried to the logits along the residual stream alone, every later
component and the final norm's scale held: `carry`) are compared with each additive score:

* ``C``: the log-probability contribution (Yu & Ananiadou), log p(w | x + v) − log p(w | x)
  through the logit lens at the point the component writes to (`attribution.contributions`);
* ``DLA``: direct logit attribution, the component's share of the target's final logit
  (`attribution.readouts`);
* ``grad_x_act``: gradient × activation, ⟨∂ log p(target) / ∂a, a⟩ for the component's
  activation a at the position (z_h for a head, m_k for a neuron), from attribution
  patching's one forward and backward through the whole model (`atp`). Plain AtP estimates
  the effect of setting a to a' as ⟨∂ log p / ∂a, a' − a⟩, so for a zero ablation its
  estimate is exactly −grad_x_act: this score's agreement is also AtP's;
* ``activation`` (neurons only): the activation magnitude |m_k|.

Sign convention: ablating a component removes its contribution, so the effect of ablating is
minus the contribution. A signed score is therefore correlated with **minus** the total effect
(a positive correlation is agreement); the activation magnitude, which has no sign, with the
effect's magnitude |effect|. Agreement per level and score: Spearman's ρ (average ranks for
ties) and the top-k overlap |top-k by |score| ∩ top-k by |effect|| / k. The direct share of a
level: Σ direct·sign(total) / Σ |total| over its components (the |total|-weighted mean of each
component's direct / total).

Neuron candidates: scoring all neurons is cheap, ablating them one by one is not, so the exact
effects are measured for `candidates` neurons taken in turn from each neuron score's ranking
by |score| (the first of C's, of DLA's, of |m|'s, of grad×act's, then the second of each, ...),
so that every score's own top neurons are in the set; Spearman and top-k of the neuron level
are over that set.

Ablation curves (Yu & Ananiadou's comparison): for each selection method the top-n neurons
among **all** neurons — by largest C, DLA, activation magnitude, gradient × activation, at
random (seeded), and by the exact single-neuron effect (`effect`: the largest drops among the
candidates, a reference the additive scores can be held against; its curve stops at the
candidate count) — are zero-ablated jointly (one intervention) at the position, for each n of
the curve (capped at the neuron count), and the change of log p(target) and of the reciprocal
rank 1/(rank + 1) is recorded (patched − clean: a drop is negative). n = 0 changes nothing.

Over a corpus every prediction is measured alike and each statistic is averaged over a
sequence's predictions, then over sequences with a 95% t-interval (`simulation.intervals`);
over fewer than `USABLE_WINDOWS` windows a note says the intervals are too wide to read.

The parts: `results` (the scores and selections compared, the result and the records it holds:
`Agreement`, `DirectShare`, `CurvePoint`, `ComponentScore`), `prediction` (one prediction
measured), `summary` (the statistics, and the result over windows). What the API, the reports and
the tests use is importable from the package itself.
"""

from __future__ import annotations

from resstream.analysis.interventions.faithfulness.prediction import (
    Level,
    PredictionMeasures,
    Settings,
    ablation_curves,
    all_scores,
    candidate_neurons,
    curve_sizes,
    direct_effects,
    exact_effects,
    gradient_times_activation,
    measure_prediction,
    neuron_dlas,
    reciprocal_rank,
    selection_order,
)
from resstream.analysis.interventions.faithfulness.results import (
    CORPUS_CANDIDATES,
    CURVE_SIZES,
    FAITHFULNESS_COLUMNS,
    HEAD_SCORES,
    MAGNITUDE_SCORES,
    NEURON_SCORES,
    SELECTIONS,
    TEXT_CANDIDATES,
    TOP_K,
    FaithfulnessResult,
    Mean,
    ScoredPrediction,
)
from resstream.analysis.interventions.faithfulness.summary import (
    USABLE_WINDOWS,
    ModelFields,
    SampleFields,
    agreement_values,
    direct_share,
    few_windows_note,
    spearman,
    summarise,
    top_k_overlap,
)

__all__ = [
    "CORPUS_CANDIDATES",
    "CURVE_SIZES",
    "FAITHFULNESS_COLUMNS",
    "HEAD_SCORES",
    "MAGNITUDE_SCORES",
    "NEURON_SCORES",
    "SELECTIONS",
    "TEXT_CANDIDATES",
    "TOP_K",
    "USABLE_WINDOWS",
    "FaithfulnessResult",
    "Level",
    "Mean",
    "ModelFields",
    "PredictionMeasures",
    "SampleFields",
    "ScoredPrediction",
    "Settings",
    "ablation_curves",
    "agreement_values",
    "all_scores",
    "candidate_neurons",
    "curve_sizes",
    "direct_effects",
    "direct_share",
    "exact_effects",
    "few_windows_note",
    "gradient_times_activation",
    "measure_prediction",
    "neuron_dlas",
    "reciprocal_rank",
    "selection_order",
    "spearman",
    "summarise",
    "top_k_overlap",
]
