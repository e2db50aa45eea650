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
sequence's predictions, then over sequences with a 95% t-interval (`simulation.intervals`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from resstream.analysis.attribution.contributions import LogProbs
from resstream.analysis.attribution.decomposition import (
    KINDS,
    attention_base,
    neuron_terms,
    residual_points,
    sublayer_writes,
)
from resstream.analysis.attribution.readouts import readouts
from resstream.analysis.decoding.decoder import Decoder
from resstream.analysis.interventions.atp import gradients as atp_gradients
from resstream.analysis.interventions.atp import spearman as atp_spearman
from resstream.analysis.interventions.carry import carry, into_stream, raw_write
from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.effects import Readout, component_effects
from resstream.analysis.interventions.engine import DEFAULT_BATCH
from resstream.analysis.interventions.metrics import Measured, measure_direct
from resstream.analysis.interventions.runs import Run, zero_values
from resstream.display import Displayable
from resstream.reprs import summary
from resstream.simulation.intervals import Estimate, sample_interval

#: The additive scores of each level, in the order tables and figures show them.
HEAD_SCORES = ("C", "DLA", "grad_x_act")
NEURON_SCORES = ("C", "DLA", "activation", "grad_x_act")
#: Scores without a sign: correlated with |effect| instead of −effect.
MAGNITUDE_SCORES = ("activation",)
#: How the ablation curves choose their top-n neurons (module docstring).
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


# ----------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class Mean(Estimate):
    """A mean with its 95% interval (`Estimate`) and the `count` of sequences it is over (for
    one text: of predictions, and no interval)."""

    count: int = 0


@dataclass(frozen=True)
class Agreement:
    """How one additive `score` of one `level` ("head" or "neuron") agrees with the exact total
    effect: Spearman's ρ and the top-`k` overlap (module docstring), each a mean over
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
    """The share of a level's total effect that is direct (module docstring)."""

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
    (module docstring), for one text (`dataset` None) or over a corpus sample.

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


# ----------------------------------------------------------------------- one prediction


@dataclass(frozen=True)
class Settings:
    """What `measure_prediction` measures: `candidates` neurons, k of the top-k overlap, the n
    of the ablation curves, interventions per batch, and the random selection's `seed`."""

    candidates: int = TEXT_CANDIDATES
    top_k: int = TOP_K
    curve_sizes: tuple[int, ...] = CURVE_SIZES
    batch_size: int = DEFAULT_BATCH
    seed: int = 0


@dataclass(frozen=True, eq=False)
class Level:
    """One level's components at one prediction: exact `total` and `direct` effects (N,) and
    each additive score (N,), float64."""

    name: str
    components: tuple[Component, ...]
    total: Tensor
    direct: Tensor
    scores: dict[str, Tensor]


@dataclass(frozen=True, eq=False)
class PredictionMeasures:
    """Everything measured at one prediction: its levels and its curves
    {(method, n): (Δ log p, Δ reciprocal rank)}."""

    prediction: ScoredPrediction
    levels: tuple[Level, ...]
    curves: dict[tuple[str, int], tuple[float, float]]


@dataclass(frozen=True, eq=False)
class AllScores:
    """Every head's scores (name → (L, H)) and every neuron's (name → (L, d_ff)), float64."""

    heads: dict[str, Tensor]
    neurons: dict[str, Tensor]


def measure_prediction(
    run: Run,
    decoder: Decoder,
    lp: LogProbs,
    target: int,
    settings: Settings,
    *,
    sequence: int = 0,
    token_text: Callable[[int], str] = str,
    generator: torch.Generator | None = None,
) -> PredictionMeasures:
    """Scores, exact effects and ablation curves (module docstring) of the prediction of
    `target` at the last position of `run` (a run of the text up to the position: later tokens
    cannot change it)."""
    position = run.seq_len - 1
    readout = Readout(decoder, position, target)
    clean = readout.of_run(run)
    scores = all_scores(run, decoder, lp, target)
    view = run.view
    heads = tuple(Component(layer, "head", h) for layer in range(view.n_layers) for h in range(view.n_heads))
    candidates = candidate_neurons(scores.neurons, settings.candidates)
    chosen = [*heads, *candidates]
    total = exact_effects(run, readout, clean, [[c] for c in chosen], settings.batch_size)[0]
    direct = direct_effects(run, readout, clean, chosen)
    levels = (
        _level("head", heads, total[: len(heads)], direct[: len(heads)], scores.heads),
        _level("neuron", candidates, total[len(heads) :], direct[len(heads) :], scores.neurons),
    )
    curves = ablation_curves(run, readout, clean, scores.neurons, levels[1], settings, generator)
    prediction = ScoredPrediction(
        sequence, position, target, token_text(target), float(clean.logprob[0]), int(clean.rank[0])
    )
    return PredictionMeasures(prediction, levels, curves)


def _level(
    name: str, components: Sequence[Component], total: Tensor, direct: Tensor, scores: dict[str, Tensor]
) -> Level:
    picked = {
        score: torch.stack([values[c.layer, c.index] for c in components]) for score, values in scores.items()
    }
    return Level(name, tuple(components), total, direct, picked)


def all_scores(run: Run, decoder: Decoder, lp: LogProbs, target: int) -> AllScores:
    """C, DLA and gradient × activation of every head, and those and |m_k| of every neuron, at
    the last position of `run` (module docstring; C and DLA exactly as `attribution.scores`
    computes them)."""
    view, internals = run.view, run.internals
    position = run.seq_len - 1
    pos, ids = torch.tensor([position]), torch.tensor([target])
    at = (0, pos.to(internals.embedding.device))
    r = readouts(view, internals, decoder, pos, ids)
    points = residual_points(view, internals, pos).float()
    head_c, head_dla, neuron_c, neuron_dla, activation = [], [], [], [], []
    for layer, (block, rec) in enumerate(zip(view.blocks, internals.blocks, strict=True)):
        writes = sublayer_writes(view, internals, layer, "attn", pos)
        heads = writes.kinds == KINDS.index("head")
        order = writes.heads[heads].argsort()
        vectors = writes.vectors[heads][order]  # (H, 1, d)
        x = attention_base(rec, at)
        head_c.append(lp.added(x, vectors, ids.to(x.device))[:, 0].double().cpu())
        head_dla.append((vectors.double()[:, 0] @ r.attn_added[layer][0]).cpu())
        effective, values = neuron_terms(block, rec, at)
        state = points[2 * layer + 1]
        neuron_c.append(lp.neurons(state, effective, values, ids.to(state.device))[:, 0].double().cpu())
        m = rec.coefficients[at][0].double()
        W_out = block.read_mlp_weights().W_out.detach().double()
        neuron_dla.append((m * (W_out @ r.mlp[layer][0])).cpu())
        activation.append(m.abs().cpu())
    head_grad, neuron_grad = gradient_times_activation(run, Readout(decoder, position, target))
    return AllScores(
        heads={"C": torch.stack(head_c), "DLA": torch.stack(head_dla), "grad_x_act": head_grad},
        neurons={
            "C": torch.stack(neuron_c),
            "DLA": torch.stack(neuron_dla),
            "activation": torch.stack(activation),
            "grad_x_act": neuron_grad,
        },
    )


def gradient_times_activation(run: Run, readout: Readout) -> tuple[Tensor, Tensor]:
    """⟨∂ log p(target) / ∂a, a⟩ at the readout's position for every head's z_h (L, H) and every
    neuron's m_k (L, d_ff), float64, from attribution patching's one forward and backward
    (`atp`): minus plain AtP's estimate of each zero ablation."""
    grads, _ = atp_gradients(run, readout)
    position, view = readout.position, run.view
    heads, neurons = [], []
    for layer, rec in enumerate(run.internals.blocks):
        g = grads.of_layer(layer)
        z = rec.z[0, position].double().to(g["z"].device)  # (H, d_head)
        heads.append((g["z"][position].double().reshape(view.n_heads, -1) * z).sum(-1).cpu())
        m = rec.coefficients[0, position].double().to(g["m"].device)
        neurons.append((g["m"][position].double() * m).cpu())
    return torch.stack(heads), torch.stack(neurons)


def candidate_neurons(scores: dict[str, Tensor], count: int) -> list[Component]:
    """`count` neurons taken in turn from each score's ranking by |score| (module docstring),
    in (layer, index) order."""
    first = next(iter(scores.values()))
    d_ff, total = first.shape[1], first.numel()
    count = min(count, total)
    rankings = [
        values.abs().flatten().sort(descending=True, stable=True).indices.tolist()
        for values in scores.values()
    ]
    chosen: dict[int, None] = {}
    for rank in range(total):
        for ranking in rankings:
            if len(chosen) >= count:
                break
            chosen.setdefault(ranking[rank])
        if len(chosen) >= count:
            break
    return sorted(Component(i // d_ff, "neuron", i % d_ff) for i in chosen)


def exact_effects(
    run: Run, readout: Readout, clean: Measured, groups: Sequence[Sequence[Component]], batch_size: int
) -> tuple[Tensor, Tensor]:
    """The total-path change of log p(target) (N,) and of the reciprocal rank (N,) when each
    group of components is zero-ablated jointly at the prediction's position."""
    if not groups:
        return torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    effects = component_effects(
        run,
        readout,
        zero_values(run),
        groups,
        mode="zero",
        positions=torch.tensor([readout.position]),
        clean=clean,
        paths=("total",),
        batch_size=batch_size,
    )
    before = reciprocal_rank(int(clean.rank[0]))
    d_logprob = torch.tensor([e.d_logprob for e in effects], dtype=torch.float64)
    d_rr = torch.tensor([reciprocal_rank(e.rank) - before for e in effects], dtype=torch.float64)
    return d_logprob, d_rr


def reciprocal_rank(rank: int) -> float:
    """1 / (rank + 1) of a 0-based rank."""
    return 1.0 / (rank + 1)


def direct_effects(run: Run, readout: Readout, clean: Measured, components: Sequence[Component]) -> Tensor:
    """The direct-path change of log p(target) (N,) when each component alone is zero-ablated
    at the prediction's position: what `effects.component_effects` gives along "direct",
    with the components of one sub-layer carried to h_L together (`carry`)."""
    position = readout.position
    where = torch.tensor([position])
    changes = torch.zeros(len(components), run.view.d_model, dtype=torch.float64)
    groups: dict[tuple[int, str], list[int]] = {}
    for row, c in enumerate(components):
        groups.setdefault((c.layer, c.sublayer), []).append(row)
    for (_, _), rows in groups.items():
        writes = torch.cat(
            [raw_write(run, components[i], -run.activation(components[i], where)) for i in rows]
        )
        positions = where.repeat(len(rows))
        point, delta = into_stream(run, components[rows[0]], writes, positions)
        changes[rows] = carry(run, delta, positions, point, 2 * run.view.n_layers).cpu()
    state = run.block_input(run.view.n_layers)[position]
    measured = measure_direct(readout.decoder, state, changes.to(state.device), readout.target, readout.foil)
    return (measured.logprob - clean.logprob[0]).double().cpu()


def ablation_curves(
    run: Run,
    readout: Readout,
    clean: Measured,
    neuron_scores: dict[str, Tensor],
    candidates: Level,
    settings: Settings,
    generator: torch.Generator | None,
) -> dict[tuple[str, int], tuple[float, float]]:
    """{(method, n): (Δ log p, Δ reciprocal rank)} for the top-n neurons of each method ablated
    jointly (module docstring)."""
    d_ff = neuron_scores["C"].shape[1]
    keys: list[tuple[str, int]] = []
    groups: list[list[Component]] = []
    for method in SELECTIONS:
        order = selection_order(method, neuron_scores, candidates, generator)
        for n in curve_sizes(settings.curve_sizes, len(order), capped=method != "effect"):
            keys.append((method, n))
            groups.append([Component(i // d_ff, "neuron", i % d_ff) for i in order[:n]])
    d_logprob, d_rr = exact_effects(run, readout, clean, groups, settings.batch_size)
    return {key: (float(a), float(b)) for key, a, b in zip(keys, d_logprob, d_rr, strict=True)}


def selection_order(
    method: str, neuron_scores: dict[str, Tensor], candidates: Level, generator: torch.Generator | None
) -> list[int]:
    """Flat neuron indices (layer·d_ff + k) in the order `method` chooses them (module
    docstring): the largest score first, at random, or the largest exact drop among the
    candidates."""
    if method == "effect":
        d_ff = neuron_scores["C"].shape[1]
        order = candidates.total.sort(stable=True).indices.tolist()  # most negative effect first
        return [candidates.components[i].layer * d_ff + candidates.components[i].index for i in order]
    count = neuron_scores["C"].numel()
    if method == "random":
        return torch.randperm(count, generator=generator).tolist()
    return neuron_scores[method].flatten().sort(descending=True, stable=True).indices.tolist()


def curve_sizes(sizes: Iterable[int], available: int, *, capped: bool = True) -> list[int]:
    """The curve's n in increasing order, without repeats: each capped at `available` neurons,
    or (not `capped`) those above it left out."""
    kept = {min(n, available) for n in sizes if n >= 1 and (capped or n <= available)}
    return sorted(n for n in kept if n >= 1)


# ------------------------------------------------------------------------------ statistics


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
    """(Spearman ρ, top-k overlap) of one score with the total effects (module docstring's
    sign convention: −effect for a signed score, |effect| for a magnitude)."""
    against = total.abs() if score_name in MAGNITUDE_SCORES else -total
    return spearman(score, against), top_k_overlap(score, total, k)


def direct_share(direct: Tensor, total: Tensor) -> float:
    """Σ direct·sign(total) / Σ |total| (nan when nothing has an effect)."""
    denominator = float(total.abs().sum())
    return float((direct * total.sign()).sum()) / denominator if denominator > 0 else math.nan


# ------------------------------------------------------------------------------ summaries


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


def summarise(
    by_sequence: Sequence[Sequence[PredictionMeasures]],
    fields: ModelFields,
    *,
    dataset: str | None = None,
    tokens: tuple[str, ...] = (),
    num_seqs: int = 1,
    seq_len: int | None = None,
    sample: str | None = None,
    dataset_fingerprint: str | None = None,
    rules: tuple[str, ...] = (),
) -> FaithfulnessResult:
    """The result of every prediction measured, grouped by corpus window (one text: one group
    of one): each statistic averaged over a window's predictions, then over windows."""
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
    return FaithfulnessResult(
        model=fields.model,
        dataset=dataset,
        tokens=tokens,
        predictions=tuple(m.prediction for m in measured),
        agreement=tuple(agreement),
        direct_shares=tuple(shares),
        curves=tuple(curves),
        components=tuple(_component_scores(measured)),
        top_k=top_k,
        candidates=fields.candidates,
        neuron_count=fields.neuron_count,
        n_layers=fields.n_layers,
        n_heads=fields.n_heads,
        num_seqs=num_seqs,
        seq_len=seq_len,
        sample=sample,
        dataset_fingerprint=dataset_fingerprint,
        rules=rules,
        notes=fields.notes,
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


__all__ = [
    "AGREEMENT_METRICS",
    "CORPUS_CANDIDATES",
    "CURVE_METRICS",
    "CURVE_SIZES",
    "EFFECT_METRICS",
    "FAITHFULNESS_COLUMNS",
    "HEAD_SCORES",
    "MAGNITUDE_SCORES",
    "NEURON_SCORES",
    "SELECTIONS",
    "TEXT_CANDIDATES",
    "TOP_K",
    "Agreement",
    "AllScores",
    "ComponentScore",
    "CurvePoint",
    "DirectShare",
    "FaithfulnessResult",
    "Level",
    "Mean",
    "ModelFields",
    "PredictionMeasures",
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
    "gradient_times_activation",
    "measure_prediction",
    "reciprocal_rank",
    "selection_order",
    "spearman",
    "summarise",
    "top_k_overlap",
]
