"""What every analysis command does before it analyses: models in, corpus sampled, batches out.

* `each_model` turns the models a user gave — spec strings to load, or models already in
  memory (`resstream.models.as_loaded`) — into `LoadedModel`s one at a time. Before any
  model is loaded, every spec is checked (from its config), the corpus is found and the
  sequence length is settled: a length the user left to the default is clipped to the
  shortest context among the models (with a notice), one they asked for must fit every
  model. Each model then gets its corpus sample (models that share a tokenizer share one),
  which must fit its vocabulary and context. A model held in memory is analysed in eval mode
  and handed back in the mode it had.
* `each_batch` stacks the sampled sequences into batches with a progress bar;
  `measure_batches` runs an analysis over them, shared out among the ranks under torchrun.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import os
import typing
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from tqdm.auto import tqdm

from resstream.api.tokenizers import fast_tokenizer_of
from resstream.checks import check_batch_size
from resstream.data.sampling import SequenceSample, check_sample_request, check_vocabulary
from resstream.data.store_windows import TokenWindows
from resstream.distributed import joined, launched, launched_rank, run_sharded
from resstream.errors import UsageError
from resstream.models import (
    LoadArgs,
    LoadedModel,
    ModelLike,
    ModelSpec,
    ModelView,
    as_loaded,
    check_model,
    is_spec,
    load_model,
    view_of,
)
from resstream.models.dispatch import weights_resident
from resstream.notices import notify

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from resstream.data import CorpusStream


@dataclass(frozen=True)
class CorpusRequest:
    """What to sample for an analysis: `num_seqs` windows of `seq_len` tokens of `dataset`
    with `seed`, or the rows of a pinned `.jsonl` (see `sample_corpus`). `seq_len` None
    asks for `default_seq_len`, clipped to the shortest context among the models
    (`settled_seq_len`)."""

    dataset: str
    num_seqs: int
    seq_len: int | None
    seed: int
    data_dir: str | os.PathLike[str] | None
    default_seq_len: int = 128

    @property
    def pinned(self) -> bool:
        """Whether the dataset is a `.jsonl` whose rows may be token ids used as given."""
        return self.dataset.endswith(".jsonl")


@dataclass(frozen=True)
class CheckedModel:
    """A model an analysis was given, checked but not loaded: the spec to load or, for a model
    in memory, its `LoadedModel`; its name and its context (None: unbounded or unknown)."""

    entry: ModelSpec | LoadedModel
    name: str
    context: int | None


@dataclass(frozen=True)
class LoadOptions:
    """How spec strings are loaded (`resstream.models.load_model`); models passed as objects
    are used as they are, with `tokenizer` (required unless `needs_tokenizer` is False: an
    analysis of the weights alone). `reads_blocks`: the analysis reads every block's weights,
    so weights a `device_map` offloads are loaded for it (`resident_blocks`)."""

    tokenizer: PreTrainedTokenizerBase | None = None
    dtype: str = "auto"
    device: str = "auto"
    device_map: str | None = None
    trust_remote_code: bool = False
    progress: bool = False
    needs_tokenizer: bool = True
    reads_blocks: bool = False
    reads_ids: bool = False

    @classmethod
    def of(
        cls,
        load: LoadArgs,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        progress: bool = False,
        needs_tokenizer: bool = True,
        reads_blocks: bool = False,
        reads_ids: bool = False,
    ) -> LoadOptions:
        """The options of an API call: its `load` keywords (of a group that adds to them, e.g.
        `resstream.api.prediction.PredictionArgs`, the loading ones), `tokenizer` and `progress`;
        `reads_blocks` for an analysis that reads every block's weights (`resident_blocks`);
        `reads_ids` when the text comes as token ids: a model object may then come without its
        tokenizer (a spec still loads its own, which names the tokens in the results).
        Under torchrun a `device_map` is refused: each process holds its own copy of the model
        on its own GPU there, while a map spreads one copy over every GPU it sees."""
        if load.get("device_map") is not None and launched():
            raise UsageError(
                "`device_map` spreads one model over the GPUs, and under torchrun every process "
                "loads its own copy on its own GPU: use one or the other (`device` under torchrun)"
            )
        loading = typing.cast(LoadArgs, {k: v for k, v in load.items() if k in LoadArgs.__annotations__})
        return cls(
            tokenizer,
            progress=progress,
            needs_tokenizer=needs_tokenizer,
            reads_blocks=reads_blocks,
            reads_ids=reads_ids,
            **loading,
        )


F = TypeVar("F", bound=Callable[..., Any])
#: How `each_model` draws a model's sample: (request, tokenizer, vocabulary size, the corpus
#: opened already or None) -> (sample, dataset fingerprint), as `sample_corpus` does.
Sampler = Callable[
    ["CorpusRequest", "PreTrainedTokenizerBase", int, "CorpusStream | None"],
    tuple[SequenceSample, str | None],
]
P = TypeVar("P")
G = TypeVar("G", bound=Mapping[str, Any])


#: The defaults of the keyword groups that declare some (`keyword_defaults`), by group.
_GROUP_DEFAULTS: dict[type, Mapping[str, Any]] = {}


def keyword_defaults(group: type, **defaults: Any) -> Mapping[str, Any]:
    """Declare the defaults of keyword `group` (a TypedDict that adds to `LoadArgs`), once: the
    signature of a function that takes the group shows them (`takes_load_args`) and
    `with_defaults` fills them in. A keyword not named defaults to `LoadOptions`' default (a
    loading keyword) or None. Returns them, read-only; TypeError for a name not in `group`."""
    unknown = sorted(set(defaults).difference(group.__annotations__))
    if unknown:
        raise TypeError(f"{group.__name__} has no keyword {', '.join(map(repr, unknown))}")
    _GROUP_DEFAULTS[group] = MappingProxyType(dict(defaults))
    return _GROUP_DEFAULTS[group]


def group_defaults(group: type) -> dict[str, Any]:
    """Every keyword of `group` with its default, in the group's order (`keyword_defaults`)."""
    loading = {f.name: f.default for f in dataclasses.fields(LoadOptions)}
    declared = _GROUP_DEFAULTS.get(group, {})
    return {name: declared.get(name, loading.get(name)) for name in group.__annotations__}


def with_defaults(group: type[G], given: Mapping[str, Any]) -> G:
    """`given`, a call's keywords of `group`, with the group's defaults for those not given
    (`group_defaults`): the values the function's signature shows."""
    return typing.cast(G, {**group_defaults(group), **given})


def takes_load_args(func: F) -> F:
    """`func`, whose ``**`` keywords (``**load: Unpack[LoadArgs]``, or a group that adds to the
    loading keywords, e.g. ``**given: Unpack[PredictionArgs]``: `resstream.api.prediction`)
    are shown as the keyword parameters they are (with the group's defaults: `group_defaults`)
    by `help`, `inspect.signature` and a notebook's completion, and checked as such: an
    unknown keyword is Python's own TypeError."""
    return _with_keywords(func)


def takes_load_args_on_one_device(func: F) -> F:
    """`takes_load_args` for a function that reads its model on one device: it has no
    `device_map` (given one, it is an unknown keyword)."""
    return _with_keywords(func, leave_out=("device_map",))


def _with_keywords(func: F, leave_out: tuple[str, ...] = ()) -> F:
    """`func` with the keywords of its ``**`` group (but `leave_out`) in its signature, in the
    group's order (the loading keywords first, as the API reference shows them), checked on
    every call."""
    signature = inspect.signature(func)
    kept = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    group = _keyword_group(func, signature)
    types = typing.get_type_hints(group)
    keyword = inspect.Parameter.KEYWORD_ONLY
    added = [
        inspect.Parameter(name, keyword, annotation=types[name], default=default)
        for name, default in group_defaults(group).items()
        if name not in leave_out
    ]
    expanded = signature.replace(parameters=[*kept, *added])

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            expanded.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{func.__name__}() {exc}") from None
        return func(*args, **kwargs)

    checked.__signature__ = expanded  # type: ignore[attr-defined]
    return typing.cast(F, checked)


def _keyword_group(func: Callable[..., Any], signature: inspect.Signature) -> type:
    """The TypedDict of `func`'s ``**`` parameter, ``Unpack[Group]`` (with postponed
    annotations, `Group` is a name that `func`'s module imports)."""
    (annotation,) = (p.annotation for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD)
    if not isinstance(annotation, str):
        return typing.get_args(annotation)[0]
    return func.__globals__[annotation.removeprefix("Unpack[").removesuffix("]")]


def refuse_device_map(load: LoadArgs, function: str, why: str = "") -> None:
    """UsageError when `load` spreads the model over devices, which `function` cannot read."""
    if load.get("device_map") is not None:
        because = f" ({why})" if why else ""
        raise UsageError(f"`device_map` is not supported by {function} yet{because}; use `device`")


def check_length(length: int, view: ModelView, what: str) -> None:
    """UsageError when `length` tokens exceed the model's context; `what` names them ({n})."""
    check_fits(length, view.max_positions, what)


def check_fits(length: int, context: int | None, what: str, model: str | None = None) -> None:
    """UsageError when `length` tokens exceed `context` (None: unbounded); `what` names the
    tokens ({n}), `model` the model whose context it is, when several are in play."""
    if context is None or length <= context:
        return
    whose = (
        f"the model's context of {context} tokens"
        if model is None
        else f"the context of model {model!r} ({context} tokens)"
    )
    raise UsageError(f"{what.format(n=length)} is longer than {whose}; allowed: 2..{context}")


def check_top_k(top_k: int, vocab: int, name: str = "top_k") -> None:
    """`top_k` must lie in [1, vocab]; `name` is the parameter that gave it."""
    if not 1 <= top_k <= vocab:
        raise UsageError(f"`{name}` {top_k} is outside [1, {vocab}] (the model's vocabulary)")


def checked_models(models: ModelLike | Sequence[ModelLike], options: LoadOptions) -> list[CheckedModel]:
    """Every model checked, none loaded: specs from their configs (`check_model`), objects
    wrapped (`as_loaded`). `models` is one model or a list or tuple of them (an empty one:
    the reference model)."""
    entries = model_list(models) or [None]
    _check_options(entries, options)
    checked = []
    for model in entries:
        if model is None or isinstance(model, (str, os.PathLike)):  # `is_spec`, spelled so it narrows
            context = check_model(
                model,
                trust_remote_code=options.trust_remote_code,
                dtype=options.dtype,
                device=options.device,
                device_map=options.device_map,
                tokenizer=options.needs_tokenizer,
            )
            checked.append(CheckedModel(model, "reference" if model is None else str(model), context))
        else:
            needs = options.needs_tokenizer and not options.reads_ids
            loaded = as_loaded(model, options.tokenizer, needs_tokenizer=needs)
            checked.append(CheckedModel(loaded, loaded.name, loaded.view.max_positions))
    return checked


def model_list(models: ModelLike | Sequence[ModelLike]) -> list[ModelLike]:
    """The models an analysis was given, as a list: a list or tuple as its items, anything else
    as one model. Another kind of sequence (neither a model nor a list of them) is refused."""
    if isinstance(models, (list, tuple)):
        return list(models)
    if isinstance(models, str) or not isinstance(models, Sequence):
        return [models]
    raise UsageError(
        f"`models` holds a {type(models).__name__}; allowed: a model spec (run directory, "
        f"Hugging Face directory or hub name, 'reference'), a loaded model or its ModelView"
    )


def loaded_models(
    models: ModelLike | Sequence[ModelLike], options: LoadOptions
) -> Generator[LoadedModel, None, None]:
    """Each model ready for analysis, loaded (specs) or wrapped (objects) one at a time.

    Every model is checked (`checked_models`) before the first is loaded, so a bad one is
    refused before time is spent on the others. The generator drops its reference to a model
    before loading the next; the caller should too.
    """
    yield from _load_each(checked_models(models, options), options)


def _load_each(checked: list[CheckedModel], options: LoadOptions) -> Generator[LoadedModel, None, None]:
    """The checked models loaded one at a time (a model in memory: in eval mode meanwhile)."""
    for model in checked:
        if isinstance(model.entry, LoadedModel):
            with eval_mode(model.entry.model), resident_blocks(model.entry, options.reads_blocks) as loaded:
                yield loaded
        else:
            fresh = load_model(
                model.entry,
                dtype=options.dtype,
                device=options.device,
                device_map=options.device_map,
                trust_remote_code=options.trust_remote_code,
                progress=options.progress,
                tokenizer=options.needs_tokenizer,
            )
            with resident_blocks(fresh, options.reads_blocks) as loaded:
                yield loaded
            del fresh, loaded


@contextmanager
def resident_blocks(loaded: LoadedModel, reads_blocks: bool = True) -> Iterator[LoadedModel]:
    """`loaded` for an analysis that reads every block's weights (`reads_blocks`): where
    accelerate offloads some (a `device_map` with "cpu" or "disk" entries) they are loaded
    onto their blocks' devices for the block, with a view over them
    (`resstream.models.dispatch.weights_resident`); any other model as it is. A model whose
    blocks compute on several devices is refused (`check_one_device`). Every analysis reads
    the embedding, the final norm and the unembedding: those are made resident in any case."""
    if not reads_blocks:
        with weights_resident(loaded.model, among=_read_out_modules(loaded)) as offloaded:
            yield replace(loaded, view=view_of(loaded.model)) if offloaded else loaded
        return
    with weights_resident(loaded.model) as offloaded:
        ready = replace(loaded, view=view_of(loaded.model)) if offloaded else loaded
        check_one_device(ready.view)
        yield ready


def _read_out_modules(loaded: LoadedModel) -> list[torch.nn.Module]:
    """The modules whose weights every analysis reads: embedding, final norm, unembedding."""
    model = loaded.model
    found = [loaded.view.final_norm]
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, getter, lambda: None)()
        if isinstance(module, torch.nn.Module):
            found.append(module)
    return [m for m in found if isinstance(m, torch.nn.Module)]


def check_one_device(view: ModelView) -> None:
    """UsageError when the blocks and the read-out (unembedding) of `view` compute on several
    devices (a `device_map` over several GPUs): the analyses that read every block's weights
    read them on one device."""
    devices = {str(block.W_O.device) for block in view.blocks} | {str(view.W_U.device)}
    if len(devices) > 1:
        raise UsageError(
            f"`device_map` placed the blocks on several devices ({', '.join(sorted(devices))}); this "
            f"analysis reads every block on one: use a `device_map` that runs every block on one device "
            f"and offloads what it cannot hold to 'cpu' or 'disk'"
        )


def settled_seq_len(corpus: CorpusRequest, checked: Sequence[CheckedModel]) -> int:
    """The sequence length an analysis uses, decided before any model is loaded.

    A length given (`corpus.seq_len`) must fit the shortest context among the models
    (UsageError naming that model). Left to the default, it is `corpus.default_seq_len`,
    clipped to the shortest context, with a notice saying so.
    """
    bounded = [(model.context, model.name) for model in checked if model.context is not None]
    shortest = min(bounded, key=lambda bound: bound[0], default=None)  # (context, model name)
    default = corpus.default_seq_len if shortest is None else min(shortest[0], corpus.default_seq_len)
    if corpus.pinned:  # token-id rows bring their own lengths, checked once read
        return corpus.seq_len or default
    if corpus.seq_len is not None:
        if shortest is not None:
            check_fits(corpus.seq_len, shortest[0], "`seq_len` {n}", shortest[1])
        return corpus.seq_len
    if shortest is not None and default < corpus.default_seq_len:
        notify(
            f"`seq_len` {default}: the default {corpus.default_seq_len} is longer than "
            f"the context of model {shortest[1]!r} ({default} tokens)"
        )
    return default


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
    sampler: Sampler | None = None,
) -> Generator[tuple[LoadedModel, SequenceSample, str | None], None, None]:
    """(model, its sample, dataset fingerprint) for each model in turn (module docstring).

    Before the first model loads, every model is checked, the corpus found and the sequence
    length settled (`settled_seq_len`). Each model passes `check(view)` (if given) before its
    sample is drawn, by `sampler` (default `sample_corpus`; tune-lens reads its windows from a
    token store). Use it in `contextlib.closing`, so that a model held in memory gets its
    modes back when the caller stops early or fails.
    """
    from resstream.data import tokenizer_fingerprint

    checked = checked_models(models, options)
    check_sample_request(corpus.num_seqs, corpus.seq_len or corpus.default_seq_len)
    stream = corpus_stream(corpus)
    corpus = replace(corpus, seq_len=settled_seq_len(corpus, checked))
    samples: dict[str, tuple[SequenceSample, str | None]] = {}  # by tokenizer
    with closing(_load_each(checked, options)) as each_loaded:  # closed even on an error
        for loaded in each_loaded:
            if check is not None:
                check(loaded.view)
            tokenizer = fast_tokenizer_of(loaded)
            key = tokenizer_fingerprint(tokenizer)
            if key not in samples:
                samples[key] = (sampler or sample_corpus)(corpus, tokenizer, loaded.view.W_U.shape[0], stream)
            sample, fingerprint = samples[key]
            _check_vocabulary(sample, loaded.view.W_U.shape[0], corpus.dataset)
            _check_sample_length(sample, loaded.view, corpus.dataset)
            yield loaded, sample, fingerprint
            del loaded


@contextmanager
def sampled_models(
    models: ModelLike | Sequence[ModelLike],
    corpus: CorpusRequest,
    load: LoadArgs,
    *,
    tokenizer: PreTrainedTokenizerBase | None,
    progress: bool,
    batch_size: int,
    check: Callable[[ModelView], None] | None = None,
    reads_blocks: bool = False,
) -> Iterator[Iterator[tuple[LoadedModel, SequenceSample, str | None]]]:
    """The preamble of every corpus analysis, written once: `batch_size` checked, the `load`
    keywords with `tokenizer`, `progress` and `reads_blocks` made `LoadOptions`, and
    `each_model` opened for the block (closed however the block ends)."""
    check_batch_size(batch_size)
    shown = progress and launched_rank() == 0  # under torchrun, rank 0 shows the loading bars
    options = LoadOptions.of(load, tokenizer=tokenizer, progress=shown, reads_blocks=reads_blocks)
    joined(options.device)  # under torchrun: the group joined first, so "cuda" is this rank's GPU
    with closing(each_model(models, corpus, options, check=check)) as each:
        yield each


@contextmanager
def one_sampled_model(
    model: ModelLike, corpus: CorpusRequest, load: LoadArgs, **options: Any
) -> Iterator[tuple[LoadedModel, SequenceSample, str | None]]:
    """`sampled_models` for an analysis of one model (a list of models is refused as one):
    the model, its sample and the sample's fingerprint for the duration of the block
    (`options`: `sampled_models`' keywords)."""
    with sampled_models([model], corpus, load, **options) as each:
        yield next(each)


def corpus_stream(corpus: CorpusRequest) -> CorpusStream | None:
    """The corpus, found (a bad name or path refused) before any model is loaded; None for a
    pinned `.jsonl` file, which is read once a tokenizer is known."""
    if corpus.pinned and Path(corpus.dataset).is_file():
        return None
    return _open_corpus(corpus)


def _open_corpus(corpus: CorpusRequest) -> CorpusStream:
    """The requested corpus as a stream (a bad name or path refused)."""
    from resstream.data import default_split, stream_corpus

    return stream_corpus(corpus.dataset, split=default_split(corpus.dataset), data_dir=corpus.data_dir)


def sample_corpus(
    corpus: CorpusRequest,
    tokenizer: PreTrainedTokenizerBase,
    vocab_size: int,
    stream: CorpusStream | None = None,
) -> tuple[SequenceSample, str | None]:
    """The sample a `CorpusRequest` (with its `seq_len` settled) asks for from `tokenizer`'s
    token stream, and the dataset fingerprint (a pinned `.jsonl` of input_ids: its rows as
    given, fingerprinted by file, each id checked against the model's `vocab_size`).
    `stream` is the corpus when it was opened already. A `seq_len` left None (not settled by
    `each_model`) is `default_seq_len`."""
    from resstream.data import load_token_rows
    from resstream.data.sampling import sample_sequences, sample_token_rows

    dataset = corpus.dataset
    if corpus.pinned and Path(dataset).is_file():
        rows = load_token_rows(dataset)
        if rows is not None:
            digest = hashlib.sha256(Path(dataset).read_bytes()).hexdigest()[:16]
            return sample_token_rows(rows, source=dataset, vocab_size=vocab_size), digest
    if stream is None:
        stream = _open_corpus(corpus)
    sample = sample_sequences(
        stream,
        tokenizer,
        num_seqs=corpus.num_seqs,
        seq_len=corpus.default_seq_len if corpus.seq_len is None else corpus.seq_len,
        seed=corpus.seed,
        corpus_name=dataset,
    )
    return sample, stream.fingerprint


def _check_sample_length(sample: SequenceSample, view: ModelView, source: str) -> None:
    """The longest sampled sequence (or pinned row, named by number) must fit the context."""
    if isinstance(sample.sequences, TokenWindows):  # all of one length: none is read
        check_length(sample.sequences.window_length, view, "`seq_len` {n}")
        return
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
    if isinstance(sample.sequences, TokenWindows):  # read a block of the store at a time
        check_vocabulary(sample.sequences.largest_id(), vocab, repr(source))
        return
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


def prediction_batches(sequences: Sequence[torch.Tensor], batch_size: int) -> list[torch.Tensor]:
    """The sequences of an analysis of every next-token prediction, in batches (`each_batch`,
    without a bar); UsageError for a sequence with no next token (`check_next_tokens`)."""
    check_next_tokens(sequences)
    return list(each_batch(sequences, batch_size, "", progress=False))


def check_next_tokens(sequences: Sequence[Sequence[int] | torch.Tensor]) -> None:
    """UsageError unless every sequence has a position with a next token (2 tokens or more)."""
    if any(len(s) < 2 for s in sequences):
        raise UsageError("every sequence needs at least 2 tokens (a target after a position)")


def measure_batches(
    sequences: Sequence[torch.Tensor],
    batch_size: int,
    desc: str,
    progress: bool,
    *,
    measure: Callable[[torch.Tensor], P],
    add: Callable[[P], None],
    device: torch.device,
) -> None:
    """`add(measure(batch))` for each batch of `each_batch`, in batch order. Under torchrun
    the batches are shared out among the ranks, which measure their own and add everyone's in
    the order one process would (`resstream.distributed.run_sharded`: the same result as one
    process, bit for bit; a failure on one rank stops them all); only rank 0 shows progress.
    `device` is where the model runs (CUDA: NCCL, each rank on its own GPU; else gloo)."""
    info = joined(device)
    batches = each_batch(sequences, batch_size, desc, progress and info.is_main)
    run_sharded(batches, measure, add, info)
