"""`resstream.routes(...)` and `resstream.routes_corpus(...)`: by which route a prediction was made.

`routes`: one text, the prediction at `position` (default the last): every term's importance
at every residual state from one recorded forward (`analysis.routes.importance`), the route
kept above `threshold` (`analysis.routes.graph`), and what each node on it holds (the logit
lens's top tokens, its largest terms, an MLP node's largest neurons). `routes_corpus`: every
next-token prediction of a corpus sample, counted (`analysis.routes.corpus`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

import torch
from tqdm.auto import tqdm

from resstream.analysis.attribution.decomposition import neuron_terms, residual_points
from resstream.analysis.decoding.decoder import Decoder, decoder_of
from resstream.analysis.names import bias_name, neuron_name, source_name, sublayer_name
from resstream.analysis.routes import (
    DEFAULT_THRESHOLD,
    CorpusRoutes,
    CorpusTally,
    FlowImportances,
    RouteEdge,
    RouteNode,
    RoutesResult,
    Scored,
    check_threshold,
    flow_importances,
    head_traffic,
    mlp_traffic,
    propagate,
    proximity,
    route_edges,
    sequence_counts,
)
from resstream.api.inputs import (
    one_model,
    one_sampled_model,
    prediction_batches,
    refuse_device_map,
    takes_load_args,
)
from resstream.api.prediction import CorpusModeArgs, PositionArgs, TextRequest, corpus_mode_request
from resstream.api.texts import TextLike
from resstream.capture import Internals, block_internals
from resstream.data.tokenizer import token_text
from resstream.models import ModelLike, ModelView

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PreTrainedTokenizerBase

#: Tokens, terms and neurons listed per node.
NODE_TOP = 5
#: Corpus mode's sequences per forward (its sample: `api.prediction.prediction_corpus`).
CORPUS_BATCH_SIZE = 4


@takes_load_args
def routes(
    text: TextLike | None = None,
    *,
    model: ModelLike = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    progress: bool = False,
    **given: Unpack[PositionArgs],
) -> RoutesResult:
    """The information-flow route of the prediction at `position` (default the last token;
    negative counts from the end) of one text (`text` or `text_file`): the edges whose
    importance is at least `threshold` (in (0, 1); default 0.04, the paper's), recursively
    from the prediction's node down to the embeddings, with what each node on the route holds
    and every head's flow (`RoutesResult`).

    `text`: a string, or token ids (a 1-D integer tensor, a (1, T) tensor or a list of ints,
    used exactly as given; a model object then needs no `tokenizer`: `resstream.lens`).
    `model` is a spec or a loaded model with its `tokenizer`, as for `resstream.lens`.
    UsageError for a threshold outside (0, 1), a position outside the text or an empty text.
    """
    check_threshold(threshold)
    refuse_device_map(given, "routes", "its read-outs assume one device")
    asked = TextRequest.of(text, given)
    options = asked.load_options(given, tokenizer=tokenizer, progress=progress)
    with one_model(model, options) as loaded:
        view, encoded = loaded.view, asked.encoded(loaded)
        tokenizer, where = encoded.tokenizer, encoded.position
        internals = block_internals(view, encoded.ids, attention=True)
        imp = flow_importances(view, internals)
        decoder = decoder_of(view)

        def name(token: int) -> str:
            return token_text(tokenizer, token)

        return route_result(view, internals, imp, decoder, where, threshold, name, model=loaded.name)


def route_result(
    view: ModelView,
    internals: Internals,
    imp: FlowImportances,
    decoder: Decoder,
    position: int,
    threshold: float,
    name: Callable[[int], str],
    *,
    model: str,
) -> RoutesResult:
    """The `RoutesResult` of the prediction at `position` of sequence 0 of `internals`."""
    found = route_edges(imp, position, threshold)
    edges = tuple(
        RouteEdge(
            kind=found.kind(i),
            layer=int(found.layers[i]),
            head=int(found.heads[i]) if found.kind(i) == "head" else None,
            source=int(found.sources[i]),
            target=int(found.targets[i]),
            from_point=int(found.from_points[i]),
            to_point=int(found.to_points[i]),
            importance=float(found.importances[i]),
        )
        for i in range(len(found))
    )
    flow = propagate(imp, torch.tensor([position]), None)
    nodes = _nodes(view, internals, imp, decoder, edges, position, name)
    prediction = nodes[0].lens[0]  # the prediction's node comes first: the lens of h_L is the model's logits
    return RoutesResult(
        model=model,
        family=view.family,
        tokens=tuple(name(int(t)) for t in internals.input_ids[0]),
        position=position,
        threshold=threshold,
        prediction=prediction.name,
        probability=prediction.score,
        n_layers=view.n_layers,
        n_heads=view.n_heads,
        edges=edges,
        nodes=nodes,
        head_flow=tuple(tuple(row) for row in head_traffic(imp, flow, None)[0].tolist()),
        mlp_flow=tuple(mlp_traffic(imp, flow, None)[0].tolist()),
        degenerate=imp.degenerate,
    )


def _nodes(
    view: ModelView,
    internals: Internals,
    imp: FlowImportances,
    decoder: Decoder,
    edges: tuple[RouteEdge, ...],
    position: int,
    name: Callable[[int], str],
) -> tuple[RouteNode, ...]:
    """Every node the route's edges join (and the prediction's), top of the stream first."""
    keys = {(2 * view.n_layers, position)}
    for edge in edges:
        keys |= {(edge.from_point, edge.source), (edge.to_point, edge.target)}
    ordered = sorted(keys, key=lambda key: (-key[0], key[1]))
    positions = sorted({p for _, p in ordered})
    states = residual_points(view, internals, positions)  # (2L+1, N, d)
    column = {p: i for i, p in enumerate(positions)}
    with torch.no_grad():
        lens = decoder.logits(torch.stack([states[point, column[pos]] for point, pos in ordered]))
    probs = lens.float().softmax(-1)
    shown = min(NODE_TOP, probs.shape[-1])
    values, tokens = probs.topk(shown, dim=-1)
    return tuple(
        RouteNode(
            point=point,
            position=pos,
            lens=tuple(Scored(name(int(t)), float(v)) for t, v in zip(tokens[n], values[n], strict=True)),
            top_terms=_top_terms(imp, point, pos),
            top_neurons=_top_neurons(view, internals, point, pos),
        )
        for n, (point, pos) in enumerate(ordered)
    )


def _top_terms(imp: FlowImportances, point: int, position: int) -> tuple[Scored, ...]:
    """The terms of node (point, position) with the largest importances, largest first."""
    if point == 0:
        return ()
    layer, stage = divmod(point - 1, 2)
    if stage == 1:
        terms = [
            (sublayer_name(layer, "mlp"), float(imp.mlp[layer, position])),
            ("residual", float(imp.mlp_residual[layer, position])),
        ]
    else:
        weights = imp.heads[layer, position]  # (H, T)
        count = min(NODE_TOP, weights.numel())
        values, flat = weights.reshape(-1).topk(count)
        terms = [
            (source_name(layer, int(i) // weights.shape[1], int(i) % weights.shape[1]), float(v))
            for v, i in zip(values, flat, strict=True)
        ]
        terms += [("residual", float(imp.attn_residual[layer, position]))]
        terms += [(bias_name(layer, "attn_bias"), float(imp.attn_bias[layer, position]))]
    ranked = sorted((t for t in terms if t[1] > 0), key=lambda t: -t[1])[:NODE_TOP]
    return tuple(Scored(label, value) for label, value in ranked)


def _top_neurons(view: ModelView, internals: Internals, point: int, position: int) -> tuple[Scored, ...]:
    """An MLP node's neurons with the largest importance in the MLP's output (each neuron's
    write m_k·W_out[k] as a term of the output, bias included; proximity as for every term)."""
    if point == 0 or point % 2 == 1:
        return ()
    layer = (point - 2) // 2
    block, rec = view.blocks[layer], internals.blocks[layer]
    at = (0, torch.tensor([position], device=rec.block_input.device))
    m, values = neuron_terms(block, rec, at)
    total = rec.mlp_output[at].float()[0]
    writes = m[0, :, None] * values  # (d_ff, d)
    weights = block.read_mlp_weights()
    terms = (
        writes if weights.b_out is None else torch.cat([writes, total[None] - writes.sum(0, keepdim=True)])
    )
    closeness = proximity(terms, total)
    share = closeness / closeness.sum().clamp_min(torch.finfo(closeness.dtype).tiny)
    count = min(NODE_TOP, len(writes))
    values_, index = share[: len(writes)].topk(count)
    return tuple(
        Scored(neuron_name(layer, int(i)), float(v))
        for v, i in zip(values_, index, strict=True)
        if float(v) > 0
    )


@takes_load_args
def routes_corpus(
    model: ModelLike = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    progress: bool = False,
    **given: Unpack[CorpusModeArgs],
) -> CorpusRoutes:
    """The routes of every next-token prediction of a corpus sample: how often each head and
    MLP lies on them, which positions their head edges come from, a per-layer profile, each
    rate with a 95% interval over sequences (`CorpusRoutes`).

    `num_seqs` windows (default 16) of `seq_len` tokens (default 64, clipped to the model's
    context) of `dataset` (default "shakespeare") sampled with `seed`, as for `resstream.shift`
    (the keywords of `resstream.api.prediction.CorpusModeArgs`); `batch_size` sequences
    (default 4) share one recorded forward.
    """
    check_threshold(threshold)
    refuse_device_map(given, "routes", "its read-outs assume one device")
    batch_size = given.get("batch_size")
    batch_size = CORPUS_BATCH_SIZE if batch_size is None else batch_size
    request = corpus_mode_request(given)
    with one_sampled_model(
        model, request, given, tokenizer=tokenizer, progress=progress, batch_size=batch_size
    ) as (loaded, sample, fingerprint):
        view = loaded.view
        batches = prediction_batches(sample.sequences, batch_size)
        tally = CorpusTally()
        bar = tqdm(
            total=len(sample.sequences),
            desc=f"routes {loaded.name}",
            unit="seq",
            leave=False,
            disable=not progress,
        )
        try:
            for batch in batches:
                internals = block_internals(view, batch, attention=True)
                for sequence in range(batch.shape[0]):
                    tally.add(
                        sequence_counts(flow_importances(view, internals, sequence=sequence), threshold)
                    )
                    bar.update(1)
        finally:
            bar.close()
        return CorpusRoutes(
            model=loaded.name,
            family=view.family,
            dataset=request.dataset,
            dataset_fingerprint=fingerprint,
            num_seqs=len(sample.sequences),
            seq_len=int(batches[0].shape[1]),
            positions=tally.positions,
            threshold=threshold,
            n_layers=view.n_layers,
            n_heads=view.n_heads,
            **tally.rates(),  # type: ignore[arg-type]
        )


__all__ = ["routes", "routes_corpus"]
