"""Preparing an evaluation: every benchmark's text, tokenised for the model, in an `EvalPlan`.

`prepare_model` loads the model and all benchmark texts before anything is scored, so bad
input is refused before any work. Which part of a text is scored is the held-out-tail rule of
the package docstring (`_tail_rule`): ``shakespeare`` always, and a resstream run's own training
corpus, are scored on their validation tail only. Token streams are kept per process
(`benchmark_tokens`), so the runs of a sweep, which share a tokenizer, tokenise each corpus once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from resstream.errors import UsageError
from resstream.training.evaluate.benchmarks import load_benchmark_corpus
from resstream.training.evaluate.model import EvalModel, TrainingText
from resstream.training.evaluate.settings import EvalSettings, resolve_stride
from resstream.training.scoring import LambadaExample, lambada_examples

if TYPE_CHECKING:
    from resstream.data import Corpus


@dataclass(frozen=True)
class PreparedBenchmark:
    """A benchmark's text, tokenised and ready to score: `tokens` for a text benchmark,
    `examples` for lambada."""

    name: str
    origin: str
    fingerprint: str
    tokens: np.ndarray | None = None  # text benchmarks
    examples: tuple[LambadaExample, ...] | None = None  # lambada
    note: str | None = None

    def stream(self) -> np.ndarray:
        """The token stream of a text benchmark (one prepared without `examples`)."""
        assert self.tokens is not None, f"{self.name} is scored by passages, not as a stream"
        return self.tokens


@dataclass(frozen=True)
class EvalPlan:
    """Everything `run_plan` needs; building it validates every input. `settings` are as they
    were asked for; the window length is the model's (`model.block_size`), `stride` and `device`
    are resolved for it."""

    model: EvalModel
    settings: EvalSettings
    benchmarks: tuple[PreparedBenchmark, ...]
    stride: int
    device: torch.device


# ------------------------------------------------------------------ which text is scored
def _shakespeare_note(training: TrainingText, corpus_fingerprint: str) -> str:
    trained_on, val_fraction = training.dataset, training.val_fraction
    base = f"validation tail (val_fraction={val_fraction}) of the built-in corpus"
    if trained_on != "shakespeare":
        return (
            f"{base}; NOT held out in a meaningful sense: the run trained on {trained_on!r}, not shakespeare"
        )
    if training.fingerprint is not None and training.fingerprint != corpus_fingerprint:
        return (
            f"{base}; the corpus text differs from the one the run trained on (fingerprint), "
            "so the tail may not be held out"
        )
    return f"{base}; held out: the run trained on shakespeare and never saw this tail"


def default_val_fraction() -> float:
    """The trainer's default held-out share (`DataConfig.val_fraction`)."""
    from resstream.training.config import DataConfig

    return DataConfig().val_fraction


def shakespeare_tail_note(val_fraction: float) -> str:
    """What `shakespeare` is for a model that is not a resstream run."""
    return (
        f"validation tail (val_fraction={val_fraction}, the trainer's default) of the built-in corpus, "
        "cut in this model's own tokens: about the text a resstream run holds out (exactly it for "
        "the same tokenizer); not a resstream run, so whether the model saw it in pretraining is "
        "unknown (Shakespeare is in most web corpora)"
    )


def _tail_rule(name: str, fingerprint: str, training: TrainingText | None) -> tuple[float, str] | None:
    """(val_fraction, note) when only the tail of the benchmark's tokens is scored, else None:
    `shakespeare` always, a resstream run's own training corpus too."""
    if training is None:
        fraction = default_val_fraction()
        return (fraction, shakespeare_tail_note(fraction)) if name == "shakespeare" else None
    if name == "shakespeare":
        return training.val_fraction, _shakespeare_note(training, fingerprint)
    if fingerprint == training.fingerprint:
        return training.val_fraction, (
            f"the run trained on this corpus: only its validation tail "
            f"(val_fraction={training.val_fraction}) is scored"
        )
    return None


# ------------------------------------------------------------------ tokenising
#: Token streams of whole benchmark corpora, by (tokenizer, corpus) fingerprint: the runs of a
#: sweep share one tokenizer, so each corpus is tokenised once per process, not once per run.
_STREAMS: dict[tuple[str, str], np.ndarray] = {}
#: The longest prefix of a stream tokenised so far (a capped evaluation's), by the same key: the
#: next run with the same tokenizer and a cap no larger takes it instead of tokenising again.
_PREFIXES: dict[tuple[str, str], np.ndarray] = {}
_MAX_STREAMS = 8


def _keep(kept: dict[tuple[str, str], np.ndarray], key: tuple[str, str], tokens: np.ndarray) -> np.ndarray:
    """`tokens`, made read-only and kept under `key` (the oldest entry goes beyond `_MAX_STREAMS`)."""
    kept.pop(key, None)
    if len(kept) >= _MAX_STREAMS:
        kept.pop(next(iter(kept)))
    tokens.setflags(write=False)  # shared by every model that asks next
    kept[key] = tokens
    return tokens


def benchmark_tokens(
    corpus: Corpus, tokenizer: Any, *, limit: int | None = None, progress: bool = False
) -> np.ndarray:
    """The corpus's token stream (`resstream.data.tokenize_documents`), or at least its first
    `limit` tokens: a prefix is tokenised only as far as it is needed (the ids of a prefix do not
    depend on what follows: the stream is cut where the tokens do not change). A whole stream,
    and the longest prefix asked for, are kept for the next model with the same tokenizer."""
    from resstream.data import tokenize_documents
    from resstream.data.tokenizer import tokenizer_fingerprint

    key = (tokenizer_fingerprint(tokenizer), corpus.fingerprint)
    if key in _STREAMS:
        return _STREAMS[key]
    if limit is not None:
        prefix = _PREFIXES.get(key)
        if prefix is not None and len(prefix) >= limit:
            return prefix
        return _keep(
            _PREFIXES, key, tokenize_documents(corpus.documents, tokenizer, progress=False, limit=limit)
        )
    tokens = tokenize_documents(corpus.documents, tokenizer, progress=None if progress else False)
    _PREFIXES.pop(key, None)
    return _keep(_STREAMS, key, tokens)


def prepare_benchmark(
    name: str, corpus: Corpus, model: EvalModel, *, max_tokens: int | None, progress: bool = False
) -> PreparedBenchmark:
    """Tokenise one benchmark's corpus; UsageError when too little of it is left to score."""
    from resstream.data import split_tokens

    if name == "lambada":
        examples = lambada_examples(
            model.tokenizer, corpus.documents, block_size=model.block_size, max_tokens=max_tokens
        )
        if not examples:
            raise UsageError(f"benchmark 'lambada' has no passage that fits in `max_tokens` {max_tokens}")
        return PreparedBenchmark(name, corpus.origin, corpus.fingerprint, examples=tuple(examples))
    note = None
    tail = _tail_rule(name, corpus.fingerprint, model.training)
    if tail is not None:  # score only the tail the trainer holds out
        val_fraction, note = tail
        tokens = split_tokens(benchmark_tokens(corpus, model.tokenizer, progress=progress), val_fraction)[1]
    else:
        tokens = benchmark_tokens(corpus, model.tokenizer, limit=max_tokens, progress=progress)
    if max_tokens is not None:
        tokens = tokens[:max_tokens]
    if len(tokens) < 2:
        raise UsageError(f"benchmark {name!r} has {len(tokens)} tokens; at least 2 are needed")
    return PreparedBenchmark(name, corpus.origin, corpus.fingerprint, tokens=np.asarray(tokens), note=note)


# ------------------------------------------------------------------ the plan
def prepare_model(
    load: Callable[[torch.device], EvalModel], settings: EvalSettings, *, progress: bool = False
) -> EvalPlan:
    """Load the model (`load(device)`, which applies `settings.block_size`) and every benchmark
    text, tokenised; nothing is scored yet (`run_plan` scores)."""
    from resstream.devices import resolve_device

    torch_device = resolve_device(settings.device)
    model = load(torch_device)
    stride = resolve_stride(settings.stride, model.block_size)
    # fail fast: every text is loaded before any is tokenised
    corpora = {name: load_benchmark_corpus(name, settings.data_dir) for name in settings.benchmarks}
    prepared = tuple(
        prepare_benchmark(name, corpus, model, max_tokens=settings.max_tokens, progress=progress)
        for name, corpus in corpora.items()
    )
    return EvalPlan(model, settings, prepared, stride, torch_device)
