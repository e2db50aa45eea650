"""What every analysis command does before it analyses: models in, corpus sampled, batches out.

* `each_model` turns the models a user gave — spec strings to load, or models already in
  memory (`resstream.models.as_loaded`) — into `LoadedModel`s one at a time: every spec is
  checked before any model is loaded, each model gets its corpus sample (models that share a
  tokenizer share one sample), and the sample must fit the model's vocabulary and context.
  A model held in memory is analysed in eval mode and handed back in the mode it had.
* `each_batch` stacks the sampled sequences into batches with a progress bar.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from resstream.data.sampling import SequenceSample, check_vocabulary
from resstream.errors import UsageError
from resstream.models import LoadedModel, ModelLike, ModelView, as_loaded, check_model, is_spec, load_model

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class CorpusRequest:
    """What to sample for an analysis: `num_seqs` windows of `seq_len` tokens of `dataset`
    with `seed`, or the rows of a pinned `.jsonl` (see `sample_corpus`)."""

    dataset: str
    num_seqs: int
    seq_len: int
    seed: int
    data_dir: str | os.PathLike[str] | None


@dataclass(frozen=True)
class LoadOptions:
    """How spec strings are loaded (`resstream.models.load_model`); models passed as objects
    are used as they are, with `tokenizer`."""

    tokenizer: PreTrainedTokenizerBase | None = None
    dtype: str = "auto"
    device: str = "auto"
    device_map: str | None = None
    trust_remote_code: bool = False
    progress: bool = True


def check_length(length: int, view: ModelView, what: str) -> None:
    """UsageError when `length` tokens exceed the model's context; `what` names them ({n})."""
    if view.max_positions is not None and length > view.max_positions:
        raise UsageError(
            f"{what.format(n=length)} is longer than the model's context of "
            f"{view.max_positions} tokens; allowed: 2..{view.max_positions}"
        )


def check_top_k(top_k: int, vocab: int) -> None:
    """`top_k` must lie in [1, vocab]."""
    if not 1 <= top_k <= vocab:
        raise UsageError(f"`top_k` {top_k} is outside [1, {vocab}] (the model's vocabulary)")


def check_batch_size(batch_size: int) -> None:
    """`batch_size` must be >= 1."""
    if batch_size < 1:
        raise UsageError(f"`batch_size` {batch_size} must be >= 1")


def loaded_models(models: ModelLike | Sequence[ModelLike], options: LoadOptions) -> Iterator[LoadedModel]:
    """Each model ready for analysis, loaded (specs) or wrapped (objects) one at a time.

    `models` is one model or a list or tuple of them (an empty one: the reference model).
    Every spec is checked and every object wrapped before the first model is loaded, so a bad
    one is refused before time is spent on the others. The generator drops its reference to
    a model before loading the next; the caller should too.
    """
    entries = (list(models) if isinstance(models, (list, tuple)) else [models]) or [None]
    _check_options(entries, options)
    wrapped = {}
    for index, model in enumerate(entries):
        if is_spec(model):
            check_model(
                model,
                trust_remote_code=options.trust_remote_code,
                dtype=options.dtype,
                device=options.device,
                device_map=options.device_map,
            )
        else:
            wrapped[index] = as_loaded(model, options.tokenizer)
    for index, model in enumerate(entries):
        if index in wrapped:
            with eval_mode(wrapped[index].model):
                yield wrapped[index]
        else:
            yield load_model(
                model,
                dtype=options.dtype,
                device=options.device,
                device_map=options.device_map,
                trust_remote_code=options.trust_remote_code,
                progress=options.progress,
            )


def _check_options(entries: Sequence[ModelLike], options: LoadOptions) -> None:
    """Refuse options that would apply to none of the models, rather than ignore them."""
    if options.tokenizer is not None and not any(
        isinstance(m, (torch.nn.Module, ModelView)) for m in entries
    ):
        raise UsageError(
            "`tokenizer` is used only with a model passed as an object; a model loaded from a spec, "
            "or a LoadedModel, brings its own"
        )
    if any(is_spec(m) for m in entries):
        return
    given = {"dtype": "auto", "device": "auto", "device_map": None, "trust_remote_code": False}
    for name, default in given.items():
        if getattr(options, name) != default:
            raise UsageError(
                f"`{name}` applies to models loaded from a spec; a model passed as an object is "
                f"analysed where it is, in its own dtype (move or cast it first)"
            )


@contextmanager
def one_model(model: ModelLike, options: LoadOptions) -> Iterator[LoadedModel]:
    """One model ready for analysis for the duration of the block (`loaded_models`)."""
    with closing(loaded_models(model, options)) as models:  # a model in memory gets its modes back
        yield next(models)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """`model` in eval mode (no dropout) for the block; every module's mode restored after."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.train(training)


def each_model(
    models: ModelLike | Sequence[ModelLike],
    corpus: CorpusRequest,
    options: LoadOptions,
    *,
    check: Callable[[ModelView], None] | None = None,
) -> Iterator[tuple[LoadedModel, SequenceSample, str | None]]:
    """(model, its sample, dataset fingerprint) for each model in turn (module docstring).

    Each model passes `check(view)` (if given) before its sample is drawn. Use it in
    `contextlib.closing`, so that a model held in memory gets its modes back when the caller
    stops early or fails.
    """
    from resstream.data import tokenizer_fingerprint

    samples: dict[str, tuple[SequenceSample, str | None]] = {}  # by tokenizer
    with closing(loaded_models(models, options)) as each_loaded:  # closed even on an error
        for loaded in each_loaded:
            if check is not None:
                check(loaded.view)
            if not corpus.dataset.endswith(".jsonl"):  # pinned rows are checked once read
                check_length(corpus.seq_len, loaded.view, "`seq_len` {n}")
            key = tokenizer_fingerprint(loaded.tokenizer)
            if key not in samples:
                samples[key] = sample_corpus(corpus, loaded.tokenizer, loaded.view.W_U.shape[0])
            sample, fingerprint = samples[key]
            _check_vocabulary(sample, loaded.view.W_U.shape[0], corpus.dataset)
            _check_sample_length(sample, loaded.view, corpus.dataset)
            yield loaded, sample, fingerprint
            del loaded


def sample_corpus(
    corpus: CorpusRequest, tokenizer: PreTrainedTokenizerBase, vocab_size: int
) -> tuple[SequenceSample, str | None]:
    """The sample a `CorpusRequest` asks for from `tokenizer`'s token stream, and the dataset
    fingerprint (a pinned `.jsonl` of input_ids: its rows as given, fingerprinted by file,
    each id checked against the model's `vocab_size`)."""
    from resstream.data import default_split, load_token_rows, stream_corpus
    from resstream.data.sampling import sample_sequences, sample_token_rows

    dataset = corpus.dataset
    if dataset.endswith(".jsonl") and Path(dataset).is_file():
        rows = load_token_rows(dataset)
        if rows is not None:
            digest = hashlib.sha256(Path(dataset).read_bytes()).hexdigest()[:16]
            return sample_token_rows(rows, source=dataset, vocab_size=vocab_size), digest
    stream = stream_corpus(dataset, split=default_split(dataset), data_dir=corpus.data_dir)
    sample = sample_sequences(
        stream,
        tokenizer,
        num_seqs=corpus.num_seqs,
        seq_len=corpus.seq_len,
        seed=corpus.seed,
        corpus_name=dataset,
    )
    return sample, stream.fingerprint


def _check_sample_length(sample: SequenceSample, view: ModelView, source: str) -> None:
    """The longest sampled sequence (or pinned row, named by number) must fit the context."""
    lengths = [len(seq) for seq in sample.sequences]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    what = (
        "`seq_len` {n}"
        if sample.windows_available is not None
        else f"row {longest + 1} of {source!r} ({{n}} tokens)"
    )
    check_length(lengths[longest], view, what)


def _check_vocabulary(sample: SequenceSample, vocab: int, source: str) -> None:
    """Every token id must index the model's vocabulary (pinned rows may hold any integer)."""
    for row, seq in enumerate(sample.sequences, start=1):
        where = f"row {row} of {source!r}" if sample.windows_available is None else f"{source!r}"
        check_vocabulary(int(seq.max()), vocab, where)


def each_batch(
    sequences: Sequence[torch.Tensor], batch_size: int, desc: str, progress: bool
) -> Iterator[torch.Tensor]:
    """The sequences stacked into batches of equal length (pinned rows may differ), with a
    progress bar counting sequences."""
    by_length: dict[int, list[torch.Tensor]] = {}
    for seq in sequences:
        by_length.setdefault(len(seq), []).append(seq)
    with tqdm(total=len(sequences), desc=desc, unit="seq", disable=not progress) as bar:
        for group in by_length.values():
            for start in range(0, len(group), batch_size):
                batch = torch.stack(group[start : start + batch_size])
                yield batch
                bar.update(len(batch))
