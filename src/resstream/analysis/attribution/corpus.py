"""Attribution over a corpus: every position's next token is the target.

For each sequence, every scored position (0..T−2, target t_{i+1}) gets the per-layer attention
and MLP contribution C and DLA and the per-head C and DLA of `attribution.py`, averaged over
the sequence's positions; the result is the mean over sequences with a 95% t-interval over
sequences (positions of one sequence are not independent).

Neurons: the DLA of every neuron is cheap (one d_ff × d product per position) and is averaged
for all of them, and so is a first-order estimate of every neuron's C,
m_k·⟨∂log p(w | x)/∂x, w_k⟩ at the state x = L_res its layer writes into (one gradient of the
logit lens per layer and position). The exact C of every neuron at every position is not
affordable on a corpus (L·d_ff·V exponentials per position), so a second pass scores exactly
the `candidates` neurons with the largest |mean estimate| at every position (the rule is
recorded with the result); with `rank_by="c"` the reported neurons are those with the largest
|mean C| among them. The DLA at the final state is a poor screen for C: C is measured at the
layer's own point, and an early neuron can raise log p a lot through the lens at its layer with
almost no direct effect on the final logits. With `rank_by="dla"` (the default) no estimate is
needed: every neuron's DLA is exact, the `candidates` with the largest |mean DLA| get their
exact C in the second pass, and the reported neurons are the largest |mean DLA| of all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from resstream.analysis.attribution.contributions import LogProbs, log_probs_of
from resstream.analysis.attribution.decomposition import (
    KINDS,
    attention_base,
    decompose,
    neuron_terms,
    post_norm_factors,
    residual_points,
    sublayer_writes,
)
from resstream.analysis.attribution.readouts import actual_logits, readouts
from resstream.analysis.attribution.results import (
    AttributionCheck,
    CorpusAttribution,
    HeadSummary,
    LayerSummary,
    NeuronSummary,
    RankBy,
)
from resstream.analysis.decoding.decoder import Decoder
from resstream.models.adapters.base import Internals, ModelView
from resstream.simulation.intervals import Estimate, sample_interval


@dataclass(frozen=True, eq=False)
class SequenceScores:
    """One sequence's scores, each averaged over its scored positions."""

    attn_contribution: Tensor  # (L,)
    mlp_contribution: Tensor
    attn_dla: Tensor
    mlp_dla: Tensor
    head_contribution: Tensor  # (L, H)
    head_dla: Tensor
    neuron_dla: Tensor  # (L, d_ff)
    neuron_estimate: Tensor  # (L, d_ff): first-order C, m_k·⟨∂log p/∂x at L_res, w_k⟩
    neuron_coefficient: Tensor  # (L, d_ff)
    dla_residual: float
    decomposition_residual: tuple[float, float]  # max |Σ components − h_L| and relative


def batch_scores(
    view: ModelView, internals: Internals, decoder: Decoder, lp: LogProbs
) -> list[SequenceScores]:
    """Every scored position of every sequence of `internals` (module docstring). The heads'
    C go layer by layer over the whole batch, so each layer's W_O is projected into the
    vocabulary once per batch (`LogProbs.low_rank_added`)."""
    n_seqs = internals.input_ids.shape[0]
    head_c = torch.stack([_head_contributions(view, internals, lp, layer) for layer in range(view.n_layers)])
    return [
        _sequence_scores(view, internals, decoder, lp, sequence, head_c[:, :, sequence])
        for sequence in range(n_seqs)
    ]


def _head_contributions(view: ModelView, internals: Internals, lp: LogProbs, layer: int) -> Tensor:
    """Mean C of every head of `layer` per sequence, (H, S): v = z_h·W_O[h] as added (Gemma-2:
    through the post-attention norm frozen at the actual output), x = α·L_in."""
    block, rec = view.blocks[layer], internals.blocks[layer]
    ids = internals.input_ids
    n_seqs, n_pos = ids.shape[0], ids.shape[1] - 1
    pos = torch.arange(n_pos)
    x = torch.cat(
        [attention_base(rec, (s, pos.to(rec.block_input.device))) for s in range(n_seqs)]
    )  # (S·N, d)
    z = rec.z[:, :n_pos].reshape(n_seqs * n_pos, *rec.z.shape[2:]).float()  # (S·N, H, d_head)
    bases = block.W_O.detach().float()
    if block.post_attn_norm is not None:
        raw = rec.attn_raw[:, :n_pos].reshape(n_seqs * n_pos, -1)
        scale, gain = post_norm_factors(block.post_attn_norm, raw, "heads")
        z, bases = z * scale.unsqueeze(-1), bases * gain
    scores = lp.low_rank_added(x, z.permute(1, 0, 2), bases, ids[:, 1:].reshape(-1))  # (H, S·N)
    return scores.reshape(-1, n_seqs, n_pos).mean(-1)


def _sequence_scores(
    view: ModelView, internals: Internals, decoder: Decoder, lp: LogProbs, sequence: int, head_c: Tensor
) -> SequenceScores:
    """One sequence's scores other than the heads' C (`head_c`, (L, H), already computed)."""
    ids = internals.input_ids[sequence]
    pos = torch.arange(len(ids) - 1)
    target = ids[1:]
    at = (sequence, pos.to(internals.embedding.device))
    points = residual_points(view, internals, pos, sequence=sequence).float()
    point_lp, slopes = _points_log_probs(lp, points, target.to(points.device))
    r = readouts(view, internals, decoder, pos, target, sequence=sequence)
    attn_dla, mlp_dla, head_dla, neuron_dla, coefficient, estimate = [], [], [], [], [], []
    total = (internals.embedding[at].double() * r.embed).sum(-1) + r.constant
    for layer, (block, rec) in enumerate(zip(view.blocks, internals.blocks, strict=True)):
        attn = (rec.attn_raw[at].double() * r.attn[layer]).sum(-1)
        mlp = (rec.mlp_raw[at].double() * r.mlp[layer]).sum(-1)
        total = total + attn + mlp
        attn_dla.append(attn.mean())
        mlp_dla.append(mlp.mean())
        writes = sublayer_writes(view, internals, layer, "attn", pos, sequence=sequence)
        heads = writes.kinds == KINDS.index("head")
        head_dla.append((writes.vectors[heads].double() * r.attn_added[layer]).sum(-1).mean(-1))
        W_out = block.read_mlp_weights().W_out.detach().double()
        m = rec.coefficients[at].double()
        neuron_dla.append((m * (r.mlp[layer] @ W_out.T)).mean(0))
        coefficient.append(m.mean(0))
        effective, values = neuron_terms(block, rec, at)
        estimate.append((effective * (slopes[layer] @ values.T)).mean(0))
    actual = actual_logits(decoder, points[-1], target)
    return SequenceScores(
        attn_contribution=(point_lp[1::2] - point_lp[0:-1:2]).mean(-1),
        mlp_contribution=(point_lp[2::2] - point_lp[1::2]).mean(-1),
        attn_dla=torch.stack(attn_dla),
        mlp_dla=torch.stack(mlp_dla),
        head_contribution=head_c,
        head_dla=torch.stack(head_dla),
        neuron_dla=torch.stack(neuron_dla),
        neuron_estimate=torch.stack(estimate),
        neuron_coefficient=torch.stack(coefficient),
        dla_residual=float((total - actual).abs().max()),
        decomposition_residual=decompose(view, internals, pos, sequence=sequence).residual(),
    )


def _on_cpu(scores: SequenceScores) -> SequenceScores:
    """`scores` with every tensor on the CPU (the same values: a copy rounds nothing)."""
    moved = {
        f.name: getattr(scores, f.name).cpu()
        for f in dataclasses.fields(scores)
        if isinstance(getattr(scores, f.name), Tensor)
    }
    return dataclasses.replace(scores, **moved)


def _points_log_probs(lp: LogProbs, points: Tensor, target: Tensor) -> tuple[Tensor, list[Tensor]]:
    """log p(target) at every residual point (2L+1, N), and at each L_res_l — where layer l's
    neurons' C is measured — the gradient that screens them, from the same decode."""
    point_lp = torch.empty(points.shape[:2], dtype=torch.float32, device=points.device)
    slopes = []
    for index, states in enumerate(points):
        if index % 2 == 1:  # L_res_l
            point_lp[index], slope = lp.log_prob_and_gradient(states, target)
            slopes.append(slope)
        else:
            point_lp[index] = lp.of_states(states, target)
    return point_lp, slopes


def neuron_contributions(
    view: ModelView, internals: Internals, lp: LogProbs, chosen: list[tuple[int, int]], sequence: int = 0
) -> Tensor:
    """Exact C of the `chosen` (layer, neuron) pairs at every scored position of one sequence,
    averaged over positions: (len(chosen),). A neuron's write m_k·w_k is rank 1, so its scores
    are s·(A(x) + m_k·A(w_k)) + b with A(w_k) computed once (`LogProbs.low_rank_added`)."""
    ids = internals.input_ids[sequence]
    pos = torch.arange(len(ids) - 1)
    target = ids[1:]
    at = (sequence, pos.to(internals.embedding.device))
    points = residual_points(view, internals, pos, sequence=sequence).float()
    out = torch.zeros(len(chosen), dtype=torch.float64)
    for layer in sorted({layer for layer, _ in chosen}):
        rows = [i for i, (l_, _) in enumerate(chosen) if l_ == layer]
        ks = torch.tensor([chosen[i][1] for i in rows])
        m, values = neuron_terms(view.blocks[layer], internals.blocks[layer], at)
        m, values = m[:, ks], values[ks]
        x = points[2 * layer + 1]
        # each neuron's write is rank 1: scored through its value vector projected once
        scores = lp.low_rank_added(x, m.T.unsqueeze(-1), values.unsqueeze(1), target.to(x.device))
        out[rows] = scores.mean(-1).double().cpu()
    return out


def _estimate(values: list[float]) -> Estimate:
    """Mean over sequences with its 95% t-interval."""
    return sample_interval(values)


def attribute_batches(
    view: ModelView,
    decoder: Decoder,
    batches: Iterable[Tensor],
    record: Callable[[Tensor], Internals],
    *,
    top: int = 20,
    candidates: int = 64,
    promoted: Callable[[int, Tensor], tuple[tuple[str, ...], ...]] | None = None,
    model: str = "",
    dataset: str = "",
    progress: Callable[[int], None] | None = None,
    map_batches: BatchMap | None = None,
    rank_by: RankBy = "dla",
) -> CorpusAttribution:
    """Corpus mode (module docstring) over `batches` of token ids (batch, T), T ≥ 2, whose
    block internals `record(ids)` captures (`capture.block_internals` bound to the view). Each
    batch is run twice: once for everything but the neurons' C, once (after the candidates
    are known) for the candidates' exact C (`candidates` 0: no second pass, no neurons);
    `progress(n)` is told of n sequences done after each batch of either pass. `map_batches`
    runs a per-batch function over the batches and returns its results in batch order (by
    default a plain loop; `resstream.distributed.map_sharded` shares the batches out among
    the ranks of a torchrun job, with the same results). `rank_by` chooses the candidates and
    the listed neurons: "dla" by |mean DLA|, "c" by the first-order estimate, then |mean C|."""
    lp = log_probs_of(decoder)
    batches = list(batches)
    each = _plain_map if map_batches is None else map_batches

    def first_pass(ids: Tensor) -> list[SequenceScores]:  # on the CPU: parts may travel pickled
        found = [_on_cpu(score) for score in batch_scores(view, record(ids), decoder, lp)]
        if progress is not None:
            progress(ids.shape[0])
        return found

    scores = [score for part in each(first_pass, batches) for score in part]
    if not scores:
        raise ValueError("no sequences to attribute")
    screen = torch.stack([_screen(s, rank_by) for s in scores]).mean(0)  # (L, d_ff)
    flat = screen.abs().flatten().argsort(descending=True, stable=True)[:candidates].tolist()
    d_ff = screen.shape[1]
    chosen = [(i // d_ff, i % d_ff) for i in flat]
    neurons: tuple[NeuronSummary, ...] = ()
    if chosen:

        def second_pass(ids: Tensor) -> list[Tensor]:
            internals = record(ids)
            found = [neuron_contributions(view, internals, lp, chosen, s).cpu() for s in range(ids.shape[0])]
            if progress is not None:
                progress(ids.shape[0])
            return found

        per_sequence_c = [c for part in each(second_pass, batches) for c in part]
        exact_c = torch.stack(per_sequence_c)
        ranking = exact_c if rank_by == "c" else screen.flatten()[flat].unsqueeze(0)
        neurons = _neuron_summaries(scores, chosen, exact_c, ranking, top, promoted)
    positions = sum(int(ids.shape[0]) * (int(ids.shape[1]) - 1) for ids in batches)
    return CorpusAttribution(
        model=model,
        decoder=decoder.description,
        dataset=dataset,
        num_seqs=len(scores),
        seq_len=int(batches[0].shape[1]),
        positions=positions,
        layers=_layer_summaries(scores),
        heads=_head_summaries(scores),
        neurons=neurons,
        neuron_rule=_neuron_rule(len(chosen), screen.numel(), rank_by),
        check=AttributionCheck(
            max(s.decomposition_residual[0] for s in scores),
            max(s.decomposition_residual[1] for s in scores),
            max(s.dla_residual for s in scores),
        ),
        notes=view.notes,
        rank_by=rank_by,
    )


#: How `attribute_batches` runs a per-batch function over the batches: results in batch order.
BatchMap = Callable[[Callable[[Tensor], list[Any]], Sequence[Tensor]], list[list[Any]]]


def _plain_map(function: Callable[[Tensor], list[Any]], batches: Sequence[Tensor]) -> list[list[Any]]:
    """`function` of each batch, in order, in this process."""
    return [function(ids) for ids in batches]


def _screen(scores: SequenceScores, rank_by: RankBy) -> Tensor:
    """What chooses the neurons whose C is computed exactly, per neuron (L, d_ff): the exact
    DLA ("dla") or the first-order estimate of C ("c")."""
    return scores.neuron_dla if rank_by == "dla" else scores.neuron_estimate


def _neuron_rule(chosen: int, total: int, rank_by: RankBy) -> str:
    """How the listed neurons were chosen, in words (`CorpusAttribution.neuron_rule`)."""
    if not chosen:
        return "neurons not scored (candidates = 0)"
    if rank_by == "dla":
        return (
            f"listed: the largest |mean DLA| of all {total} neurons (DLA is exact for every neuron); "
            f"exact C at every position for the {chosen} with the largest |mean DLA|"
        )
    return (
        f"exact C at every position for the {chosen} neurons whose first-order estimate "
        f"m_k·⟨∂log p/∂x, w_k⟩ at their own layer (all {total} neurons) has the largest "
        f"|mean|; listed: the largest |mean C| among them"
    )


def _layer_summaries(scores: list[SequenceScores]) -> tuple[LayerSummary, ...]:
    n_layers = len(scores[0].attn_contribution)

    def est(name: str, layer: int) -> Estimate:
        return _estimate([float(getattr(s, name)[layer]) for s in scores])

    return tuple(
        LayerSummary(
            layer,
            est("attn_contribution", layer),
            est("mlp_contribution", layer),
            est("attn_dla", layer),
            est("mlp_dla", layer),
        )
        for layer in range(n_layers)
    )


def _head_summaries(scores: list[SequenceScores]) -> tuple[HeadSummary, ...]:
    n_layers, n_heads = scores[0].head_contribution.shape
    return tuple(
        HeadSummary(
            layer,
            head,
            _estimate([float(s.head_contribution[layer, head]) for s in scores]),
            _estimate([float(s.head_dla[layer, head]) for s in scores]),
        )
        for layer in range(n_layers)
        for head in range(n_heads)
    )


def _neuron_summaries(
    scores: list[SequenceScores],
    chosen: list[tuple[int, int]],
    neuron_c: Tensor,
    ranking: Tensor,
    top: int,
    promoted: Callable[[int, Tensor], tuple[tuple[str, ...], ...]] | None,
) -> tuple[NeuronSummary, ...]:
    """The `top` of the `chosen` neurons with the largest |mean of `ranking`| (per sequence ×
    chosen), largest first, each with its exact C (`neuron_c`) and DLA over sequences."""
    order = ranking.mean(0).abs().argsort(descending=True, stable=True)[:top].tolist()
    words: dict[int, tuple[str, ...]] = {}
    if promoted is not None:
        for layer in sorted({chosen[i][0] for i in order}):
            rows = [i for i in order if chosen[i][0] == layer]
            found = promoted(layer, torch.tensor([chosen[i][1] for i in rows]))
            words.update(dict(zip(rows, found, strict=True)))
    out = []
    for i in order:
        layer, k = chosen[i]
        out.append(
            NeuronSummary(
                layer=layer,
                neuron=k,
                contribution=_estimate(neuron_c[:, i].tolist()),
                dla=_estimate([float(s.neuron_dla[layer, k]) for s in scores]),
                mean_coefficient=float(torch.stack([s.neuron_coefficient[layer, k] for s in scores]).mean()),
                promoted=words.get(i, ()),
            )
        )
    return tuple(out)


__all__ = ["SequenceScores", "attribute_batches", "batch_scores", "neuron_contributions"]
