"""`resstream.faithfulness(...)`: do the additive scores predict what ablating a component does?

One text (`text` or `text_file`): the prediction at `position` (default the last) of `target`
(default the model's own top prediction there). A corpus (`dataset`): `num_seqs` windows
(default 16) of `seq_len` tokens (default 64) sampled with `seed`, and in each window
`positions_per_seq` positions (default 4) drawn at random (seeded) among those with a next
token, each position's next token its target — every position of every window would cost one
ablation of every head and candidate neuron per position, so a few per window are measured
and the statistics are averaged over a window's positions, then over windows (95% intervals
over windows, as `attribute_corpus`).

Each prediction is measured by `analysis.interventions.faithfulness.measure_prediction`:
every head and `candidates` neurons (default 300 for one text, 100 per corpus prediction)
zero-ablated alone at the prediction's position, their exact total and direct effects compared
with C, DLA, activation magnitude and gradient × activation (Spearman's ρ, top-`top_k`
overlap), and the ablation curves over `curve_sizes`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Unpack

import torch
from tqdm.auto import tqdm

from resstream.analysis.attribution.contributions import log_probs_of
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.interventions.engine import DEFAULT_BATCH
from resstream.analysis.interventions.faithfulness import (
    CORPUS_CANDIDATES,
    CURVE_SIZES,
    TEXT_CANDIDATES,
    FaithfulnessResult,
    ModelFields,
    PredictionMeasures,
    SampleFields,
    Settings,
    measure_prediction,
    summarise,
)
from resstream.analysis.interventions.runs import capture_run
from resstream.api.inputs import (
    check_next_tokens,
    one_model,
    one_sampled_model,
    refuse_device_map,
    takes_load_args,
)
from resstream.api.prediction import (
    DEFAULT_NUM_SEQS,
    DEFAULT_SEQ_LEN,
    TargetArgs,
    TextRequest,
    prediction_corpus,
    text_keywords,
)
from resstream.api.texts import TextLike
from resstream.api.tokenizers import tokenizer_of
from resstream.data.sampling import SequenceSample
from resstream.data.tokenizer import token_text
from resstream.errors import UsageError, refuse_set
from resstream.models import LoadedModel, ModelLike

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Corpus mode's positions measured per window (its sample: `api.prediction.prediction_corpus`).
POSITIONS_PER_SEQ = 4


@takes_load_args
def faithfulness(
    text: TextLike | None = None,
    *,
    dataset: str | None = None,
    model: ModelLike = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    num_seqs: int | None = None,
    seq_len: int | None = None,
    positions_per_seq: int | None = None,
    seed: int = 0,
    data_dir: str | os.PathLike[str] | None = None,
    top_k: int = 10,
    candidates: int | None = None,
    curve_sizes: Sequence[int] | None = None,
    batch_size: int = DEFAULT_BATCH,
    progress: bool = False,
    **given: Unpack[TargetArgs],
) -> FaithfulnessResult:
    """How well C, DLA, activation magnitude and gradient × activation predict the exact
    zero-ablation effect of every head and of candidate neurons, and the ablation curves of
    the top-n neurons by each (module docstring), for one text or over `dataset`.

    One text: `text` a string, or token ids (a 1-D integer tensor, a (1, T) tensor or a list of
    ints, used exactly as given; a model object then needs no `tokenizer`), `position`,
    `target`/`target_id` as for `resstream.attribute`. A corpus:
    `num_seqs`, `seq_len`, `positions_per_seq`, `seed`, `data_dir` (the single-text keywords are
    refused). `top_k` is k of the top-k overlap; `candidates` the neurons ablated one by one per
    prediction; `curve_sizes` the n of the ablation curves (default 1, 2, 5, ..., 300, capped at
    the neuron count); `batch_size` interventions run together. `model` is a spec or a loaded
    model with its `tokenizer`, as for `resstream.lens`.
    """
    refuse_device_map(given, "faithfulness", "interventions restart blocks on one device")
    settings = _settings(dataset, top_k, candidates, curve_sizes, batch_size, seed)
    if dataset is None:
        corpus_options = {
            "num_seqs": num_seqs,
            "seq_len": seq_len,
            "positions_per_seq": positions_per_seq,
            "data_dir": data_dir,
        }
        refuse_set(corpus_options, "is for a corpus (`dataset`); without one, give only a text")
        asked = TextRequest.of(text, given)
        options = asked.load_options(given, tokenizer=tokenizer, progress=progress)
        with one_model(model, options) as loaded:
            return _one_text(loaded, asked, settings)
    text_options = {"text": text, **text_keywords(given)}
    refuse_set(text_options, "is for one text; with `dataset` every position's next token is the target")
    per_seq = POSITIONS_PER_SEQ if positions_per_seq is None else positions_per_seq
    if per_seq < 1:
        raise UsageError(f"`positions_per_seq` {per_seq} is not allowed; allowed: 1 or more")
    request = prediction_corpus(dataset, num_seqs, seq_len, seed, data_dir)
    with one_sampled_model(
        model, request, given, tokenizer=tokenizer, progress=progress, batch_size=batch_size
    ) as (loaded, sample, fingerprint):
        return _corpus(loaded, sample, fingerprint, dataset, per_seq, settings, progress)


def _settings(
    dataset: str | None,
    top_k: int,
    candidates: int | None,
    curve_sizes: Sequence[int] | None,
    batch_size: int,
    seed: int,
) -> Settings:
    if top_k < 1:
        raise UsageError(f"`top_k` {top_k} is not allowed; allowed: 1 or more")
    if batch_size < 1:
        raise UsageError(f"`batch_size` {batch_size} is not allowed; allowed: 1 or more")
    count = (TEXT_CANDIDATES if dataset is None else CORPUS_CANDIDATES) if candidates is None else candidates
    if count < 1:
        raise UsageError(f"`candidates` {count} is not allowed; allowed: 1 or more")
    sizes = tuple(CURVE_SIZES if curve_sizes is None else curve_sizes)
    if not sizes or any(n < 1 for n in sizes):
        raise UsageError(
            f"`curve_sizes` {list(sizes)} is not allowed; allowed: one or more counts, each 1 or more"
        )
    return Settings(candidates=count, top_k=top_k, curve_sizes=sizes, batch_size=batch_size, seed=seed)


def _one_text(loaded: LoadedModel, asked: TextRequest, settings: Settings) -> FaithfulnessResult:
    """The prediction asked for in the text, from a run of the text up to its position."""
    view, encoded = loaded.view, asked.encoded(loaded)
    ids, where = encoded.ids, encoded.position
    run = capture_run(view, ids[:, : where + 1], attention=False)
    decoder = decoder_of(view)
    chosen = encoded.target(decoder, run.internals)
    measured = measure_prediction(
        run,
        decoder,
        log_probs_of(decoder),
        chosen,
        settings,
        token_text=partial(token_text, encoded.tokenizer),
        generator=torch.Generator().manual_seed(settings.seed),
    )
    return summarise(
        [[measured]],
        _model_fields(loaded, settings),
        SampleFields(
            tokens=encoded.tokens(),
            seq_len=int(ids.shape[1]),
            rules=_rules(settings, None),
        ),
    )


def _corpus(
    loaded: LoadedModel,
    sample: SequenceSample,
    fingerprint: str | None,
    dataset: str,
    per_seq: int,
    settings: Settings,
    progress: bool,
) -> FaithfulnessResult:
    """`per_seq` predictions of every window of the sample (module docstring)."""
    view, tokenizer = loaded.view, tokenizer_of(loaded)
    decoder = decoder_of(view)
    lp = log_probs_of(decoder)
    check_next_tokens(sample.sequences)
    sequences = [torch.as_tensor(s, dtype=torch.long) for s in sample.sequences]
    generator = torch.Generator().manual_seed(settings.seed)
    chosen = [chosen_positions(len(s), per_seq, generator) for s in sequences]
    bar = tqdm(total=sum(map(len, chosen)), desc="faithfulness", unit="prediction", disable=not progress)
    by_sequence: list[list[PredictionMeasures]] = []
    name = partial(token_text, tokenizer)
    try:
        for index, (ids, positions) in enumerate(zip(sequences, chosen, strict=True)):
            group = []
            for where in positions:
                run = capture_run(view, ids[None, : where + 1].to(view.W_E.device), attention=False)
                target = int(ids[where + 1])
                group.append(
                    measure_prediction(
                        run,
                        decoder,
                        lp,
                        target,
                        settings,
                        sequence=index,
                        token_text=name,
                        generator=generator,
                    )
                )
                bar.update(1)
            by_sequence.append(group)
    finally:
        bar.close()
    return summarise(
        by_sequence,
        _model_fields(loaded, settings),
        SampleFields(
            dataset=dataset,
            num_seqs=len(sequences),
            seq_len=max(len(s) for s in sequences),
            sample=sample.rule,
            dataset_fingerprint=fingerprint,
            rules=_rules(settings, per_seq),
        ),
    )


def chosen_positions(length: int, count: int, generator: torch.Generator) -> list[int]:
    """`count` positions (all when fewer) drawn without replacement among the `length` − 1 that
    have a next token, in increasing order."""
    available = length - 1
    if count >= available:
        return list(range(available))
    return sorted(torch.randperm(available, generator=generator)[:count].tolist())


def _model_fields(loaded: LoadedModel, settings: Settings) -> ModelFields:
    """What every result records of the model and the settings."""
    view = loaded.view
    return ModelFields(
        model=loaded.name,
        top_k=settings.top_k,
        candidates=settings.candidates,
        neuron_count=sum(block.d_ff for block in view.blocks),
        n_layers=view.n_layers,
        n_heads=view.n_heads,
        notes=tuple(view.notes),
    )


def _rules(settings: Settings, per_seq: int | None) -> tuple[str, ...]:
    """How the components and positions were chosen, in words (saved with the result)."""
    rules = [
        "every component zero-ablated at the prediction's position only; effects on log p(target)",
        f"neurons: the {settings.candidates} taken in turn from the rankings by |C|, |DLA|, |m| and "
        "|grad×act| are ablated one by one; the curves choose among all neurons",
        "signed scores are correlated with −effect, the activation magnitude with |effect|; "
        "grad×act = −(plain AtP estimate of the zero ablation)",
        f"random selection seeded with {settings.seed}",
    ]
    if per_seq is not None:
        rules.append(
            f"{per_seq} positions per window drawn at random (seed {settings.seed}) among those with a "
            "next token"
        )
    return tuple(rules)


#: The corpus mode's default sample is `prediction_corpus`'s, also read from here.
__all__ = ["DEFAULT_NUM_SEQS", "DEFAULT_SEQ_LEN", "chosen_positions", "faithfulness"]
