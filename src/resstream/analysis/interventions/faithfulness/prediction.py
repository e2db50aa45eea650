"""One prediction measured (`faithfulness` package docstring): every additive score of every
head and neuron, the exact total and direct zero-ablation effects of the heads and candidate
neurons, and the ablation curves."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

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
from resstream.analysis.attribution.readouts import Readouts, readouts
from resstream.analysis.decoding.decoder import Decoder
from resstream.analysis.interventions.atp import gradients as atp_gradients
from resstream.analysis.interventions.carry import carry, into_stream, raw_write
from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.effects import Readout, component_effects
from resstream.analysis.interventions.engine import DEFAULT_BATCH
from resstream.analysis.interventions.faithfulness.results import (
    CURVE_SIZES,
    SELECTIONS,
    TEXT_CANDIDATES,
    TOP_K,
    ScoredPrediction,
)
from resstream.analysis.interventions.metrics import Measured, measure_direct
from resstream.analysis.interventions.runs import Run, zero_values
from resstream.models.adapters.base import Internals, ModelView


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
    """Scores, exact effects and ablation curves (package docstring) of the prediction of
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
    the last position of `run` (package docstring; C and DLA exactly as `attribution.scores`
    computes them)."""
    view, internals = run.view, run.internals
    position = run.seq_len - 1
    pos, ids = torch.tensor([position]), torch.tensor([target])
    at = (0, pos.to(internals.embedding.device))
    r = readouts(view, internals, decoder, pos, ids)
    points = residual_points(view, internals, pos).float()
    head_c, head_dla, neuron_c, activation = [], [], [], []
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
        activation.append(rec.coefficients[at][0].double().abs().cpu())
    neuron_dla = [dla.cpu() for dla in neuron_dlas(view, internals, r, position)]
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


def neuron_dlas(view: ModelView, internals: Internals, read: Readouts, position: int) -> list[Tensor]:
    """Every neuron's DLA at `position` of sequence 0, m_k · ⟨W_out[k], r⟩ with r the MLP's
    read-out direction of `read` (computed at that position alone), one (d_ff,) float64 tensor
    per block."""
    found = []
    for layer, block in enumerate(view.blocks):
        m = internals.blocks[layer].coefficients[0, position].double()
        W_out = block.read_mlp_weights().W_out.detach().double()
        found.append(m * (W_out @ read.mlp[layer][0].to(W_out.device)))
    return found


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
    """`count` neurons taken in turn from each score's ranking by |score| (package docstring),
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
    jointly (package docstring)."""
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
