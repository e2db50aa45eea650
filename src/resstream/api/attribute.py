"""`resstream.attribute(...)` and `resstream.attribute_corpus(...)`: who wrote a predicted token.

`attribute`: one text (`text` or `text_file`), the prediction at `position` (default: the
last) of `target` (default: the model's own top prediction there), attributed to layers,
heads, attention sources and FFN neurons (`analysis.attribution.scores`). `attribute_corpus`:
every position's next token of a corpus sample is the target, means over sequences
(`analysis.attribution.corpus`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Unpack

import torch
from tqdm.auto import tqdm

from resstream.analysis.attribution.corpus import attribute_batches
from resstream.analysis.attribution.results import AttributeResult, CorpusAttribution, RankBy, check_rank_by
from resstream.analysis.attribution.scores import Levels, attribute_position, decoder_trajectory
from resstream.analysis.decoding.decoder import Decoder, decoder_of
from resstream.analysis.memories.neurons import added_values, promoted_tokens
from resstream.api.decoders import DecoderLike, decoder_spec
from resstream.api.inputs import (
    check_batch_size,
    one_model,
    one_sampled_model,
    prediction_batches,
    takes_load_args,
)
from resstream.api.prediction import CorpusModeArgs, PredictionArgs, TextRequest, corpus_mode_request
from resstream.api.state_memory import check_corpus_fits, check_text_fits
from resstream.api.texts import TextLike
from resstream.api.tokenizers import tokenizer_of
from resstream.capture import block_internals
from resstream.checks import ONLY_THE_LOGIT_LENS, check_positive
from resstream.data.tokenizer import token_text
from resstream.distributed import joined, map_sharded, my_batches
from resstream.errors import UsageError
from resstream.models import ModelLike, ModelView

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PreTrainedTokenizerBase

#: Promoted tokens listed per neuron.
PROMOTED_TOKENS = 5
#: Corpus mode's defaults (its sample: `api.prediction.prediction_corpus`): neurons scored
#: exactly, sequences per forward.
DEFAULT_CANDIDATES = 64
CORPUS_BATCH_SIZE = 8


@takes_load_args
def attribute(
    text: TextLike | None = None,
    *,
    model: ModelLike = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    top: int = 20,
    sources: bool = True,
    neurons: bool = True,
    contributions: bool = True,
    decoder: DecoderLike = "logit-lens",
    rank_by: RankBy = "dla",
    progress: bool = False,
    **given: Unpack[PredictionArgs],
) -> AttributeResult:
    """Attribute the prediction at one position of one text (`text` or `text_file`; `text`
    a string, or token ids: a 1-D or (1, T) integer tensor or a list of ints, used as given).

    `position` (default the last token; negative counts from the end), `target` a string that
    must be exactly one token (or `target_id`; default: the model's top prediction at the
    position), `foil` an optional second token for a target − foil logit difference (the
    keywords of `resstream.api.prediction.PredictionArgs`); `top` items kept per list;
    `sources`/`neurons` switch the attention-source and neuron levels off (both on by default).
    `rank_by` chooses the listed sources and neurons and leads every output: "dla" (default;
    the direct logit attribution, exactly minus the zero-ablation direct effect) or "c" (the
    log-probability contribution C, the seed paper's order). The cost follows the levels
    (`analysis.attribution.scores.Levels`): DLA is one dot product per component, C a score
    of the whole vocabulary per component, so C is computed for every layer and head and,
    with "dla", for the listed sources and neurons (and the linearity check's); "c" computes
    every source's and neuron's C to rank them. `contributions=False` computes no C beyond
    the layers' (NaN in the result; DLA only: one forward plus the head projections). Every
    score decodes through the logit lens; `decoder` "tuned:DIR" (or a loaded
    lens) adds `tuned_trajectory`, the target at each block boundary through that tuned lens.
    Every next token of a corpus sample: `resstream.attribute_corpus`.

    `model` is a spec or a loaded model with its `tokenizer`, as for `resstream.lens`.
    """
    check_positive("top", top)
    rank_by = check_rank_by(rank_by)
    if rank_by == "c" and not contributions:
        raise UsageError(
            "`rank_by` 'c' ranks by the contributions C: it cannot be combined with `contributions=False`"
        )
    spec = decoder_spec(decoder)
    if spec.kind == "embedding":
        raise UsageError(ONLY_THE_LOGIT_LENS)
    asked = TextRequest.of(text, given)
    options = asked.load_options(given, tokenizer=tokenizer, progress=progress, reads_blocks=True)
    with one_model(model, options) as loaded:
        view = loaded.view
        spec.check(view)
        logit_lens = decoder_of(view)
        encoded = asked.encoded(loaded)
        ids, where, tokenizer = encoded.ids, encoded.position, encoded.tokenizer
        check_text_fits(view, ids.shape[1], 1 if sources else 0)
        internals = block_internals(view, ids, attention=[where] if sources else False)
        chosen = encoded.target(logit_lens, internals)
        foil_id = encoded.foil(chosen)

        def name(token: int) -> str:
            return token_text(tokenizer, token)

        result = attribute_position(
            view,
            internals,
            logit_lens,
            where,
            chosen,
            foil=foil_id,
            levels=Levels(
                top=top, sources=sources, neurons=neurons, rank_by=rank_by, contributions=contributions
            ),
            token_text=name,
            promoted=_promoted(view, logit_lens, name),
            model=loaded.name,
        )
        if spec.lens is None:
            return result
        tuned = spec.build(view)
        boundaries = [internals.blocks[0].block_input] + [block.block_output for block in internals.blocks]
        states = torch.stack([h[0, where] for h in boundaries])
        trajectory = decoder_trajectory(tuned, states, chosen)
        return replace(result, tuned_trajectory=trajectory, tuned_decoding=tuned.description)


@takes_load_args
def attribute_corpus(
    model: ModelLike = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    top: int = 20,
    candidates: int | None = None,
    neurons: bool = True,
    rank_by: RankBy = "dla",
    progress: bool = False,
    **given: Unpack[CorpusModeArgs],
) -> CorpusAttribution:
    """Attribute every next token of a corpus sample, averaged over sequences.

    `num_seqs` windows (default 16) of `seq_len` tokens (default 64, clipped to the model's
    context) of `dataset` (default "shakespeare") sampled with `seed`, as for `resstream.shift`
    (the keywords of `resstream.api.prediction.CorpusModeArgs`); every position's next
    token is its target. `rank_by` "dla" (default) lists the `top` neurons with the largest
    |mean DLA| and computes the exact C of the `candidates` (default 64) with the largest;
    "c" computes it for the `candidates` with the largest first-order estimate of C and lists
    the largest |mean C| among them (`neurons=False` skips that pass); `top`
    items kept per list; `batch_size` sequences (default 8) share one forward and one
    projection of each layer's W_O. Decodes through the logit lens; no attention sources.

    `model` is a spec or a loaded model with its `tokenizer`, as for `resstream.lens`.
    """
    check_positive("top", top)
    rank_by = check_rank_by(rank_by)
    batch_size = given.get("batch_size")
    batch_size = CORPUS_BATCH_SIZE if batch_size is None else batch_size
    check_batch_size(batch_size)  # before `candidates`, as the request reads
    candidates = DEFAULT_CANDIDATES if candidates is None else candidates
    if candidates < 1:
        raise UsageError(f"`candidates` {candidates} is not allowed; allowed: 1 or more")
    request = corpus_mode_request(given)
    with one_sampled_model(
        model,
        request,
        given,
        tokenizer=tokenizer,
        progress=progress,
        batch_size=batch_size,
        reads_blocks=True,
    ) as (loaded, sample, fingerprint):
        view, tokenizer = loaded.view, tokenizer_of(loaded)
        decoder = decoder_of(view)
        batches = prediction_batches(sample.sequences, batch_size)
        check_corpus_fits(view, batches, len(sample.sequences))
        passes = 2 if neurons else 1
        info = joined(view.W_E.device)  # under torchrun: the batches shared out among the ranks
        mine = sum(len(b) for _, b in my_batches(batches, info))
        bar = _bar(passes * mine, f"attribute {loaded.name}", progress and info.is_main)
        try:
            result = attribute_batches(
                view,
                decoder,
                batches,
                partial(block_internals, view),
                top=top,
                candidates=candidates if neurons else 0,
                promoted=_promoted(view, decoder, partial(token_text, tokenizer)),
                model=loaded.name,
                dataset=request.dataset,
                progress=None if bar is None else partial(_advance, bar),
                map_batches=partial(map_sharded, info=info),
                rank_by=rank_by,
            )
        finally:
            if bar is not None:
                bar.close()
        return replace(result, sample=sample.rule, dataset_fingerprint=fingerprint)


def _bar(total: int, desc: str, show: bool) -> tqdm | None:
    if not show:
        return None
    return tqdm(total=total, desc=desc, unit="seq", leave=False)


def _advance(bar: tqdm, count: int) -> None:
    """Move `bar` on by `count` sequences (tqdm's `update` also returns whether it redrew)."""
    bar.update(count)


def _promoted(
    view: ModelView, decoder: Decoder, name: Callable[[int], str]
) -> Callable[[int, torch.Tensor], tuple[tuple[str, ...], ...]]:
    """The tokens each neuron's value vector promotes most, as text."""

    def promoted(layer: int, neurons: torch.Tensor) -> tuple[tuple[str, ...], ...]:
        rows = added_values(view, layer, neurons)
        found = promoted_tokens(decoder, rows, min(PROMOTED_TOKENS, decoder.vocab_size))
        return tuple(tuple(name(t) for t in ids) for ids in found.promoted_ids)

    return promoted


__all__ = ["attribute", "attribute_corpus"]
