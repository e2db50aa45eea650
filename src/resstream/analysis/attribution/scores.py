"""The attribution of one prediction: who wrote the target's logit and its probability.

`attribute_position` scores every layer, head (or attention source) and FFN neuron at one
position by direct logit attribution (`readouts`: one dot product per write) and by
log-probability contribution (`contributions.LogProbs`), follows the target through the 2L+1
residual points (`decoder_trajectory`), and checks that the parts add up to the actual logit.
`query_contributions` asks the question one level down: which lower writes switch a chosen
neuron on (its pre-activation split over `decomposition.decompose`'s components).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from resstream.analysis.attribution.contributions import LogProbs, log_probs_of
from resstream.analysis.attribution.decomposition import (
    KINDS,
    Decomposition,
    attention_base,
    decompose,
    neuron_terms,
    point_count,
    point_name,
    residual_points,
    source_terms,
    sublayer_writes,
)
from resstream.analysis.attribution.readouts import Readouts, actual_logits, readouts
from resstream.analysis.attribution.results import (
    AttributeResult,
    AttributionCheck,
    ExpertAttribution,
    HeadAttribution,
    LayerAttribution,
    LinearityCheck,
    NeuronAttribution,
    QueryContribution,
    QueryShare,
    RankBy,
    SourceAttribution,
    TrajectoryPoint,
    ranked_score,
)
from resstream.analysis.decoding.decoder import Decoder
from resstream.analysis.norms import norm_form
from resstream.models.adapters.base import ExpertsView, Internals, ModelView


@dataclass(frozen=True)
class Levels:
    """What `attribute_position` computes beyond layers and heads: `top` items kept per list,
    attention `sources`, all `neurons`, the `linearity` check, and query contributions for
    the `queries` top neurons; `rank_by` which score chooses the listed sources and neurons
    ("dla": the largest |DLA|, "c": the largest |C|); `contributions` whether C is computed
    beyond the layers (whose C the trajectory gives for free).

    The cost follows the levels. DLA is one dot product per component; C scores the whole
    vocabulary per component. So C is computed for every head, and for sources and neurons
    only where it is needed: for the listed ones and the linearity check's with `rank_by`
    "dla", for all of them with "c" (which ranks by it: the seed paper's neuron scores).
    Without `contributions` every C but the layers' is NaN and the linearity check is
    skipped: the cost is one forward plus the head-output projections."""

    top: int = 20
    sources: bool = True
    neurons: bool = True
    linearity: bool = True
    queries: int = 3
    linearity_count: int = 100
    rank_by: RankBy = "dla"
    contributions: bool = True

    def __post_init__(self) -> None:
        if self.rank_by == "c" and not self.contributions:
            raise ValueError("rank_by 'c' ranks by the contributions C: it needs contributions=True")

    def describe(self) -> str:
        """What these levels compute, in one line (`AttributeResult.computed`)."""
        if not self.contributions:
            c_of = "no C beyond the layers'"
        elif self.every_c:
            c_of = (
                "C of every layer, head"
                + (", source" if self.sources else "")
                + (" and neuron" if self.neurons else "")
            )
        else:
            listed = " and ".join(n for n, on in (("sources", self.sources), ("neurons", self.neurons)) if on)
            c_of = "C of every layer and head" + (
                f", and of the {self.top} listed {listed}" if listed else ""
            )
        dla = (
            "DLA of every layer, head"
            + (", source" if self.sources else "")
            + (" and neuron" if self.neurons else "")
        )
        return f"{dla}; {c_of}"

    @property
    def every_c(self) -> bool:
        """Whether every source's and neuron's C is computed (`rank_by` "c")."""
        return self.contributions and self.rank_by == "c"


def attribute_position(
    view: ModelView,
    internals: Internals,
    decoder: Decoder,
    position: int,
    target: int,
    *,
    foil: int | None = None,
    levels: Levels = Levels(),
    token_text: Callable[[int], str] = str,
    promoted: Callable[[int, Tensor], tuple[tuple[str, ...], ...]] | None = None,
    model: str = "",
) -> AttributeResult:
    """Who wrote `target` into the stream at `position` of sequence 0 of `internals` (recorded
    with `attention=True` when `levels.sources`): trajectory, per-layer / head / source /
    neuron contribution C and DLA, query contributions and the exactness checks.
    `promoted(layer, neuron_ids)` gives the tokens each neuron's value vector promotes."""
    p = _prediction(view, internals, decoder, position, target, foil, token_text)
    r, points, point_lp, ids, foil_ids = p.readouts, p.points, p.point_lp, p.ids, p.foil_ids
    layers, heads, neurons, experts = [], [], [], []
    sources: list[_SourceLayer] = []
    for layer in range(view.n_layers):
        layers.append(_layer_scores(p, layer))
        heads += _head_scores(p, layer, levels.contributions)
        if levels.sources:
            sources.append(_source_scores(p, layer, levels.every_c))
        if levels.neurons:
            neurons.append(_neuron_scores(p, layer, levels.every_c))
            if levels.contributions:
                experts += _expert_scores(p, neurons[-1])
    listed = _listed_sources(p, sources, levels)
    top_neurons = _top_neurons(p, neurons, levels, promoted)
    result_check = _check(p, levels)
    trajectory = _trajectory(p)
    logit = actual_logits(decoder, points[-1], ids)[0]
    at = p.at
    return AttributeResult(
        model=model,
        decoder=decoder.description,
        tokens=tuple(token_text(int(t)) for t in internals.input_ids[0].tolist()),
        position=position,
        target_id=target,
        target=token_text(target),
        logit=float(logit),
        logprob=float(point_lp[-1]),
        probability=float(point_lp[-1].exp()),
        rank=trajectory[-1].rank,
        layers=tuple(layers),
        heads=tuple(heads),
        sources=tuple(listed),
        neurons=top_neurons,
        trajectory=trajectory,
        query_contributions=_queries(view, internals, p.pos, top_neurons, levels) if levels.neurons else (),
        linearity=_linearity(p, neurons, layers, levels)
        if levels.neurons and levels.linearity and levels.contributions
        else None,
        check=result_check,
        embed_dla=float((internals.embedding[at].double() * r.embed).sum()),
        bias_dla=float(r.constant[0]),
        foil_id=foil,
        foil=None if foil is None else token_text(foil),
        logit_difference=None
        if foil is None
        else float(actual_logits(decoder, points[-1], ids, foil_ids)[0]),
        notes=view.notes,
        logit_softcap=view.logit_softcap,
        experts=tuple(experts),
        rank_by=levels.rank_by,
        computed=levels.describe(),
    )


@dataclass(frozen=True, eq=False)
class _Prediction:
    """What every part of `attribute_position` reads: the model, its recorded internals, the
    position and target (as 1-element tensors), the states at the 2L+1 points (`states` in the
    model's dtype, `points` in float32) with the target's log-probability there, and the DLA
    read-outs."""

    view: ModelView
    internals: Internals
    decoder: Decoder
    lp: LogProbs
    readouts: Readouts
    pos: Tensor
    ids: Tensor
    foil_ids: Tensor | None
    states: Tensor
    points: Tensor
    point_lp: Tensor
    token_text: Callable[[int], str]

    @property
    def at(self) -> tuple[int, Tensor]:
        """The index of the position in sequence 0 of the internals."""
        return (0, self.pos.to(self.internals.embedding.device))


def _prediction(
    view: ModelView,
    internals: Internals,
    decoder: Decoder,
    position: int,
    target: int,
    foil: int | None,
    token_text: Callable[[int], str],
) -> _Prediction:
    lp = log_probs_of(decoder)
    pos, ids = torch.tensor([position]), torch.tensor([target])
    foil_ids = None if foil is None else torch.tensor([foil])
    states = residual_points(view, internals, pos)  # (2L+1, 1, d), the model's dtype
    points = states.float()
    point_lp = lp.of_states(points, ids.to(points.device))[:, 0]  # (2L+1,)
    r = readouts(view, internals, decoder, pos, ids, foil_ids)
    return _Prediction(
        view, internals, decoder, lp, r, pos, ids, foil_ids, states, points, point_lp, token_text
    )


@dataclass(frozen=True, eq=False)
class _NeuronLayer:
    """One layer's neuron scores at the position, and what the linearity check reuses."""

    layer: int
    contribution: Tensor  # (d_ff,)
    dla: Tensor  # (d_ff,)
    coefficient: Tensor  # m (d_ff,)
    effective: Tensor  # m as added (Gemma-2: times the post norm's frozen 1/s) (d_ff,)
    values: Tensor  # value vectors as added (Gemma-2: times the post norm's gain) (d_ff, d)
    base: Tensor  # x = L_res (1, d)
    experts: ExpertsView | None = None  # a mixture of experts: how flat neurons map to experts


def _layer_scores(p: _Prediction, layer: int) -> LayerAttribution:
    rec, block, r, point_lp, at = (
        p.internals.blocks[layer],
        p.view.blocks[layer],
        p.readouts,
        p.point_lp,
        p.at,
    )
    b_out = block.read_mlp_weights().b_out
    return LayerAttribution(
        layer=layer,
        attn_contribution=float(point_lp[2 * layer + 1] - point_lp[2 * layer]),
        mlp_contribution=float(point_lp[2 * layer + 2] - point_lp[2 * layer + 1]),
        attn_dla=float((rec.attn_raw[at].double() * r.attn[layer]).sum()),
        mlp_dla=float((rec.mlp_raw[at].double() * r.mlp[layer]).sum()),
        attn_bias_dla=_bias_dla(block.b_O, r.attn[layer]),
        mlp_bias_dla=_bias_dla(b_out, r.mlp[layer]),
    )


def _bias_dla(bias: Tensor | None, readout: Tensor) -> float:
    """⟨bias, r⟩ at the one position (0 without a bias)."""
    if bias is None:
        return 0.0
    return float((bias.detach().double().to(readout.device) * readout[0]).sum())


def _head_scores(p: _Prediction, layer: int, contributions: bool) -> list[HeadAttribution]:
    writes = sublayer_writes(p.view, p.internals, layer, "attn", p.pos)
    heads = writes.kinds == KINDS.index("head")
    if contributions:
        x = attention_base(p.internals.blocks[layer], p.at)
        contribution = p.lp.added(x, writes.vectors[heads], p.ids.to(x.device))[:, 0]
    else:
        contribution = torch.full((int(heads.sum()),), math.nan)
    dla = writes.vectors[heads].double()[:, 0] @ p.readouts.attn_added[layer][0]
    sinks = _sink_shares(p, layer)
    return [
        HeadAttribution(layer, int(h), float(c), float(d), None if sinks is None else sinks[int(h)])
        for h, c, d in zip(writes.heads[heads].tolist(), contribution.tolist(), dla.tolist(), strict=True)
    ]


def _sink_shares(p: _Prediction, layer: int) -> list[float] | None:
    """The attention mass each head's sink took at the position, 1 − Σ_j α_{t,j}, for a block
    with attention sinks and recorded probabilities; None otherwise."""
    rec = p.internals.blocks[layer]
    if p.view.blocks[layer].sinks is None or rec.probs is None:
        return None
    rows = rec.probs_at(0, p.pos)[:, 0, :].double()  # (H, key)
    shares: list[float] = (1.0 - rows.sum(-1)).tolist()
    return shares


def _expert_scores(p: _Prediction, neurons: _NeuronLayer) -> list[ExpertAttribution]:
    """Every routed expert of a mixture-of-experts block at the position: C of its write (its
    flat neurons' sum) added to L_res, and its DLA (its neurons' DLA summed)."""
    layer = neurons.layer
    experts, rec = p.view.blocks[layer].experts, p.internals.blocks[layer]
    if experts is None or rec.expert_index is None or rec.expert_weight is None:
        return []
    index = rec.expert_index[p.at][0].long().cpu()  # (top_k,)
    weight = rec.expert_weight[p.at][0].double().cpu()
    writes = (neurons.effective.unsqueeze(-1) * neurons.values).reshape(experts.n_experts, experts.width, -1)
    vectors = writes.sum(1)[index.to(writes.device)]  # (top_k, d)
    x = neurons.base
    contribution = p.lp.added(x, vectors.unsqueeze(1), p.ids.to(x.device))[:, 0]
    dla = neurons.dla.reshape(experts.n_experts, experts.width).sum(1)[index.to(neurons.dla.device)]
    scores = zip(index.tolist(), weight.tolist(), contribution.tolist(), dla.tolist(), strict=True)
    return [ExpertAttribution(layer, int(e), float(w), float(c), float(d)) for e, w, c, d in scores]


@dataclass(frozen=True, eq=False)
class _SourceLayer:
    """One layer's source scores at the position: (H, j) tensors of C (NaN where not computed)
    and DLA."""

    layer: int
    contribution: Tensor
    dla: Tensor


def _source_scores(p: _Prediction, layer: int, contributions: bool) -> _SourceLayer:
    """Every head's sources j ≤ t, α_{t,j}·(x_j W_V[h] + b_V[h])·W_O[h] as added (Gemma-2:
    through the post-attention norm frozen at the actual output), scored through each head's
    d_head-wide output space (`LogProbs.low_rank_added`); without `contributions` their C is
    NaN (`_listed_sources` computes it for the listed ones)."""
    rec = p.internals.blocks[layer]
    coefficients, basis = source_terms(
        p.view.blocks[layer], rec, 0, int(p.pos[0])
    )  # (H, j, d_head), (H, d_head, d)
    x = attention_base(rec, p.at)[0]
    readout = p.readouts.attn_added[layer][0].float()
    if contributions:
        contribution = p.lp.low_rank_added(x, coefficients, basis, p.ids[0].to(x.device))  # (H, j)
    else:
        contribution = torch.full(coefficients.shape[:2], math.nan, device=x.device)
    dla = torch.einsum("hjd,hd->hj", coefficients, basis @ readout)
    return _SourceLayer(layer, contribution, dla)


def _listed_sources(p: _Prediction, layers: list[_SourceLayer], levels: Levels) -> list[SourceAttribution]:
    """The `levels.top` sources with the largest |score| of `levels.rank_by` (ties: the earlier
    layer, head and position), largest first; with contributions but not every C, their C is
    computed here: each vector added onto its layer's attention base."""
    if not layers:
        return []
    field = "dla" if levels.rank_by == "dla" else "contribution"
    scores = torch.cat([getattr(s, field).double().cpu().flatten() for s in layers])
    order = scores.abs().argsort(descending=True, stable=True)[: levels.top].tolist()
    n_heads, width = layers[0].dla.shape
    picked = [(index // (n_heads * width), *divmod(index % (n_heads * width), width)) for index in order]
    c = [float(layers[i].contribution[h, j]) for i, h, j in picked]
    if levels.contributions and not levels.every_c:
        c = _source_c(p, [(layers[i].layer, h, j) for i, h, j in picked])
    tokens = p.internals.input_ids[0].tolist()
    return [
        SourceAttribution(layers[i].layer, h, j, p.token_text(tokens[j]), c[n], float(layers[i].dla[h, j]))
        for n, (i, h, j) in enumerate(picked)
    ]


def _source_c(p: _Prediction, picked: list[tuple[int, int, int]]) -> list[float]:
    """C of the sources (layer, head, position) `picked`, each vector α_{t,j}·(x_j W_V + b_V)·W_O
    added onto its layer's attention base, all scored in one batch."""
    terms = {
        layer: source_terms(p.view.blocks[layer], p.internals.blocks[layer], 0, int(p.pos[0]))
        for layer in {layer for layer, _, _ in picked}
    }
    bases = torch.stack(
        [attention_base(p.internals.blocks[layer], p.at)[0].float() for layer, _, _ in picked]
    )
    vectors = torch.stack([(terms[layer][0][h, j] @ terms[layer][1][h]).float() for layer, h, j in picked])
    return _added_c(p, bases, vectors).tolist()


def _added_c(p: _Prediction, bases: Tensor, vectors: Tensor) -> Tensor:
    """C of each vector (n, d) added onto its own base state (n, d): log p(w | x + v) − log p(w | x)."""
    ids = p.ids.to(bases.device).expand(bases.shape[0])
    return p.lp.of_states(bases + vectors, ids) - p.lp.of_states(bases, ids)


def _neuron_scores(p: _Prediction, layer: int, contributions: bool) -> _NeuronLayer:
    """One layer's neuron scores; without `contributions` their C is NaN until `_fill_c`."""
    block, rec = p.view.blocks[layer], p.internals.blocks[layer]
    m = rec.coefficients[p.at].float()  # (1, d_ff)
    effective, values = neuron_terms(block, rec, p.at)
    x = p.points[2 * layer + 1]
    if contributions:
        contribution = p.lp.neurons(x, effective, values, p.ids.to(x.device))[:, 0]
    else:
        contribution = torch.full((m.shape[1],), math.nan, device=x.device)
    dla = m[0].double() * (block.read_mlp_weights().W_out.detach().double() @ p.readouts.mlp[layer][0])
    return _NeuronLayer(layer, contribution, dla, m[0], effective[0], values, x, block.experts)


def _fill_c(p: _Prediction, wanted: list[tuple[_NeuronLayer, Tensor]]) -> None:
    """Compute in place, in one batch, the C of the neurons `ks` of each (layer, ks) of
    `wanted` that is still NaN: m_k·v_k added onto the layer's MLP base."""
    todo = []
    for neurons, ks in wanted:
        ks = ks.cpu()
        ks = ks[torch.isnan(neurons.contribution.cpu()[ks])]
        if ks.numel():
            todo.append((neurons, ks.to(neurons.effective.device)))
    if not todo:
        return
    bases = torch.cat([n.base.float().expand(len(ks), -1) for n, ks in todo])
    vectors = torch.cat([n.effective[ks].float().unsqueeze(-1) * n.values[ks].float() for n, ks in todo])
    found = _added_c(p, bases, vectors)
    start = 0
    for neurons, ks in todo:
        part = found[start : start + len(ks)]
        neurons.contribution[ks.to(neurons.contribution.device)] = part.to(neurons.contribution.device)
        start += len(ks)


def _top_neurons(
    p: _Prediction,
    layers: list[_NeuronLayer],
    levels: Levels,
    promoted: Callable[[int, Tensor], tuple[tuple[str, ...], ...]] | None,
) -> tuple[NeuronAttribution, ...]:
    """The `levels.top` neurons of every layer with the largest |score| of `levels.rank_by`
    (ties: the earlier layer and neuron), largest first."""
    if not layers:
        return ()
    scores = torch.cat([ranked_score(n, levels.rank_by).double().cpu() for n in layers])
    order = scores.abs().argsort(descending=True, stable=True)[: levels.top].tolist()
    d_ff = [len(n.contribution) for n in layers]
    starts = [sum(d_ff[:i]) for i in range(len(layers))]
    picked: list[tuple[int, int]] = []
    for flat in order:
        index = max(i for i, s in enumerate(starts) if s <= flat)
        picked.append((index, flat - starts[index]))
    if levels.contributions:
        chosen = sorted({i for i, _ in picked})
        _fill_c(p, [(layers[i], torch.tensor([k for j, k in picked if j == i])) for i in chosen])
    tokens: dict[tuple[int, int], tuple[str, ...]] = {}
    if promoted is not None:
        for index in sorted({i for i, _ in picked}):
            ks = [k for i, k in picked if i == index]
            for k, words in zip(ks, promoted(layers[index].layer, torch.tensor(ks)), strict=True):
                tokens[(index, k)] = words
    return tuple(
        NeuronAttribution(
            layer=layers[i].layer,
            neuron=k,
            coefficient=float(layers[i].coefficient[k]),
            contribution=float(layers[i].contribution[k]),
            dla=float(layers[i].dla[k]),
            promoted=tokens.get((i, k), ()),
            expert=_expert_of(layers[i].experts, k),
        )
        for i, k in picked
    )


def _expert_of(experts: ExpertsView | None, neuron: int) -> tuple[int, int] | None:
    """(expert, its neuron) of a flat neuron of a mixture of experts; None for a dense MLP."""
    return None if experts is None else experts.expert_of(neuron)


def _ranks(p: _Prediction) -> list[int]:
    """Exact ranks of the target at every point, from the states in the model's own dtype
    (the decoder applies the model's final norm module)."""
    states = p.states[:, 0, :]
    with torch.no_grad():
        ranks, _ = p.decoder.exact().ranks(states, p.ids.reshape(1, 1).expand(states.shape[0], 1))
    return [int(r) for r in ranks[:, 0].tolist()]


def decoder_trajectory(decoder: Decoder, states: Tensor, target: int) -> tuple[TrajectoryPoint, ...]:
    """The target's probability, rank and log-probability at each block boundary, states
    (L+1, d) = h_0..h_L (points L_in_0, L_out_0, ..., L_out_{L-1}), each decoded by the
    decoder of its layer (`Decoder.at`: a tuned lens applies that layer's translator)."""
    scorer = decoder.exact()
    ids = torch.tensor([[target]], device=scorer.engine.device)
    out = []
    with torch.no_grad():
        for layer in range(states.shape[0]):
            h = states[layer : layer + 1]
            at = scorer.at(layer)
            logprob = float(torch.log_softmax(at.decoder.logits(h).double(), dim=-1)[0, target])
            rank = int(at.ranks(h, ids)[0][0, 0])
            out.append(_trajectory_point(2 * layer, logprob, rank))
    return tuple(out)


def _trajectory(p: _Prediction) -> tuple[TrajectoryPoint, ...]:
    points = zip(p.point_lp.tolist(), _ranks(p), strict=True)
    return tuple(_trajectory_point(index, logprob, rank) for index, (logprob, rank) in enumerate(points))


def _trajectory_point(point: int, logprob: float, rank: int) -> TrajectoryPoint:
    """The target at residual point number `point` (`point_name`)."""
    name = point_name(point)
    stage, layer = name.split("_")[1], int(name.rsplit("_", 1)[1])
    return TrajectoryPoint(name, layer, stage, math.exp(logprob), rank, logprob)


def _check(p: _Prediction, levels: Levels) -> AttributionCheck:
    """The decomposition's residual at every point (by heads and MLPs; the last point also by
    sources and neurons, where those levels are asked) and the DLA's: Σ parts + constant
    against the actual logit."""
    view, internals, pos, r, at = p.view, p.internals, p.pos, p.readouts, p.at
    worst_abs, worst_rel = 0.0, 0.0
    last = point_count(view.n_layers) - 1
    for point in range(last + 1):
        finest = point == last
        parts = decompose(
            view,
            internals,
            pos,
            point=point,
            sources=finest and levels.sources and internals.blocks[0].probs is not None,
            neurons=finest and levels.neurons,
        )
        absolute, relative = parts.residual()
        worst_abs, worst_rel = max(worst_abs, absolute), max(worst_rel, relative)
    total = (internals.embedding[at].double() * r.embed).sum() + r.constant[0]
    for layer, rec in enumerate(internals.blocks):
        total = (
            total
            + (rec.attn_raw[at].double() * r.attn[layer]).sum()
            + (rec.mlp_raw[at].double() * r.mlp[layer]).sum()
        )
    dla_residual = abs(float(total - actual_logits(p.decoder, p.points[-1], p.ids, p.foil_ids)[0]))
    return AttributionCheck(worst_abs, worst_rel, dla_residual)


def _queries(
    view: ModelView, internals: Internals, pos: Tensor, neurons: tuple[NeuronAttribution, ...], levels: Levels
) -> tuple[QueryContribution, ...]:
    out: list[QueryContribution] = []
    for neuron in neurons[: levels.queries]:
        out += query_contributions(
            view, internals, neuron.layer, neuron.neuron, int(pos[0]), sources=levels.sources, top=levels.top
        )
    return tuple(out)


def query_contributions(
    view: ModelView,
    internals: Internals,
    layer: int,
    neuron: int,
    position: int,
    *,
    sources: bool = True,
    top: int = 20,
    sequence: int = 0,
) -> list[QueryContribution]:
    """Which lower vectors switch neuron `neuron` of `layer` on at `position`: the stream the
    MLP reads (L_res_l; L_in_l for a parallel block) as components — embedding, heads (or
    their sources), lower neurons, biases — each passed through the MLP's input norm frozen at
    the actual stream and projected on the neuron's key (gate and up separately for gated
    MLPs). Shares + constant = the actual pre-activation (checked: `residual`)."""
    block, rec = view.blocks[layer], internals.blocks[layer]
    point = 2 * layer if block.parallel else 2 * layer + 1
    pos = torch.tensor([position])
    parts = decompose(view, internals, pos, point=point, sequence=sequence, sources=sources, neurons=True)
    form = norm_form(block.ln2 if block.norm_position == "pre" else None).to(torch.float64)
    frozen = form.freeze(parts.state.double())
    normed = frozen.apply(parts.vectors.double())[:, 0]  # (C, d)
    weights = block.read_mlp_weights()
    actual_input = rec.mlp_input[(sequence, pos.to(rec.mlp_input.device))].double()[0]
    keys = [("gate" if weights.gated else "key", weights.W_in, weights.b_in)]
    if weights.W_up is not None:  # gated
        keys.append(("up", weights.W_up, weights.b_up))
    out = []
    for name, matrix, bias in keys:
        key = matrix.detach()[:, neuron].double()
        bias = None if bias is None else bias.detach()
        shares = normed @ key
        constant = float((form.offset(key) * key).sum()) + (0.0 if bias is None else float(bias[neuron]))
        pre = float(actual_input @ key) + (0.0 if bias is None else float(bias[neuron]))
        order = shares.abs().argsort(descending=True)[:top].tolist()
        listed = tuple(
            QueryShare(parts.label(i), _layer_of(parts, i), parts.kind(i), float(shares[i])) for i in order
        )
        residual = abs(float(shares.sum()) + constant - pre)
        out.append(QueryContribution(layer, neuron, name, pre, constant, listed, residual))
    return out


def _layer_of(parts: Decomposition, index: int) -> int | None:
    layer = int(parts.layers[index])
    return None if layer < 0 else layer


def _linearity(
    p: _Prediction, layers: list[_NeuronLayer], layer_scores: list[LayerAttribution], levels: Levels
) -> LinearityCheck | None:
    """The layer with the largest |MLP contribution|: its neurons ranked by the `rank_by`
    score (largest first), then C(v_1 + … + v_n) against Σ_{i≤n} C(v_i) for n = 1 ..
    `levels.linearity_count` (C computed for those neurons where it is not yet)."""
    if not layers:
        return None
    lp, ids = p.lp, p.ids
    mlp_change = {layer.layer: abs(layer.mlp_contribution) for layer in layer_scores}
    chosen = max(layers, key=lambda neurons: mlp_change[neurons.layer])
    order = ranked_score(chosen, levels.rank_by).argsort(descending=True)[: levels.linearity_count]
    _fill_c(p, [(chosen, order)])
    vectors = chosen.effective[order].unsqueeze(-1) * chosen.values[order]  # (n, d)
    cumulative = lp.added(chosen.base, vectors.cumsum(0).unsqueeze(1), ids.to(vectors.device))[:, 0]
    summed = chosen.contribution[order].cumsum(0)
    return LinearityCheck(
        layer=chosen.layer,
        counts=tuple(range(1, len(order) + 1)),
        cumulative=tuple(cumulative.tolist()),
        summed=tuple(summed.tolist()),
        correlation=_pearson(cumulative, summed),
        ceiling=-float(lp.of_states(chosen.base, ids.to(chosen.base.device))[0]),
    )


def _pearson(a: Tensor, b: Tensor) -> float:
    if len(a) < 2:
        return math.nan
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    denominator = float(a.norm() * b.norm())
    return float((a * b).sum()) / denominator if denominator > 0 else math.nan


__all__ = ["Levels", "attribute_position", "decoder_trajectory", "query_contributions"]
