"""Benchmark evaluation of a model: loss, perplexity, top-1 accuracy, LAMBADA.

The model is an `EvalModel`: something that gives logits for token ids, with its tokenizer,
the window length it is scored with (`block_size`, at most its context), a display name and a
fingerprint of its weights. A finished resstream run becomes one with `run_eval_model`; any
other model (a Hugging Face causal LM) is made one by `resstream.models.evaluation`.

Benchmarks (`BENCHMARKS`): ``wikitext-2`` (test split), ``lambada`` (OpenAI test set),
``openwebtext`` (sample), ``fineweb-edu`` (sample) and ``shakespeare``: the held-out tail of the
built-in corpus, cut by the rule the trainer uses
(``split_tokens(tokenize_documents(corpus.documents, tokenizer), config.data.val_fraction)``).
It is held-out text only for a run that trained on ``shakespeare``; the result says so either way.
The same rule applies to any benchmark whose text is the run's own training corpus (same
fingerprint, e.g. ``fineweb-edu`` for the ``gpt2-124m`` preset): only its validation tail is scored.
A model that is not a resstream run has no training corpus known here: every benchmark is scored
whole, except ``shakespeare``, which is the same tail (the trainer's default `val_fraction`, cut
in the model's own tokens), so its score sits beside the runs' (`SHAKESPEARE_TAIL_NOTE`).

Every benchmark reports loss (nats), perplexity, top-1 accuracy and the number of tokens scored;
text benchmarks are scored with sliding windows, LAMBADA by its last word
(`resstream.training.scoring` defines both). `prepare` checks every input and loads the model
and all texts before anything is scored; `run_plan` scores them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from resstream.errors import UsageError, check_choice, short_reason
from resstream.training.scoring import (
    DEFAULT_BATCH_SIZE,
    LAMBADA_DOC,
    SLIDING_WINDOW_DOC,
    BenchmarkResult,
    LambadaExample,
    ScoreSums,
    lambada_examples,
    score_lambada,
    score_tokens,
)

if TYPE_CHECKING:
    from resstream.data import Corpus
    from resstream.training.checkpoint import TrainedModel

BENCHMARKS: tuple[str, ...] = ("wikitext-2", "lambada", "openwebtext", "fineweb-edu", "shakespeare")


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class EvalReport:
    """All benchmark results of one model, with the window settings they were scored under."""

    model: str
    results: tuple[BenchmarkResult, ...]
    stride: int
    block_size: int
    batch_size: int = DEFAULT_BATCH_SIZE
    max_tokens: int | None = None
    device: str = "cpu"
    model_fingerprint: str | None = None  # of the weights scored (`EvalModel.fingerprint`)
    model_source: str = "resstream"  # `EvalModel.source`
    context: int | None = None  # the model's own context in tokens (block_size <= context)
    end_of_text: str | None = None  # the token after each document (None: the tokenizer has none)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form written to eval.json. Every benchmark entry also carries what it was
        scored under (`max_tokens`, `stride`, `model_fingerprint`; its corpus `fingerprint` is its
        own), so an entry kept from an earlier call is reused only when they match
        (`resstream.training.sweep.stale_reason`)."""
        provenance = {
            "max_tokens": self.max_tokens,
            "stride": self.stride,
            "model_fingerprint": self.model_fingerprint,
        }
        return {
            "model": self.model,
            "stride": self.stride,
            "block_size": self.block_size,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "device": self.device,
            "method": {
                "sliding_window": SLIDING_WINDOW_DOC,
                "lambada": LAMBADA_DOC,
                "loss": "mean next-token cross-entropy in nats; perplexity = exp(loss); "
                "accuracy = next-token top-1 in percent",
            },
            "model_fingerprint": self.model_fingerprint,
            "model_source": self.model_source,
            "context": self.context,
            "end_of_text": self.end_of_text,
            "documents": documents_rule(self.end_of_text),
            "benchmarks": [{**r.to_dict(), **provenance} for r in self.results],
        }


def documents_rule(end_of_text: str | None) -> str:
    """How documents are joined and LAMBADA contexts begin, for a tokenizer whose end-of-text
    token is `end_of_text` (None: it has none)."""
    if end_of_text is None:
        return (
            "the tokenizer has no end-of-text token: documents are joined with nothing between "
            "them and LAMBADA contexts start without a start token"
        )
    return f"{end_of_text!r} after each document and before each LAMBADA context"


# --------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class TrainingText:
    """The corpus a resstream run trained on (`dataset`, and its text's `fingerprint` when the
    run saved it) and the share of its tokens the trainer held out (`val_fraction`)."""

    dataset: str
    val_fraction: float
    fingerprint: str | None = None


@dataclass(frozen=True)
class EvalModel:
    """What an evaluation needs of a model.

    `forward` maps token ids (batch, seq) to logits (or a tuple / output object holding them,
    see `scoring.logits_of`), in eval mode; `tokenizer` is the model's own (its eos token ends
    each document); windows are `block_size` tokens, at most the model's `context`; `name`
    labels the results, `fingerprint` identifies the weights; `source` is where the model came
    from (`resstream.models.LoadedModel.source`); `config` its configuration as plain data
    (recorded in run.json); `training` the run's own corpus (None: not a resstream run).
    """

    forward: torch.nn.Module
    tokenizer: Any
    block_size: int
    context: int
    name: str
    fingerprint: str | None
    source: str
    config: dict[str, Any]
    training: TrainingText | None = None

    @property
    def end_of_text(self) -> str | None:
        """The token put after each document, or None when the tokenizer has no eos."""
        return getattr(self.tokenizer, "eos_token", None) if self.tokenizer.eos_token_id is not None else None


def resolve_block_size(block_size: int | None, context: int) -> int:
    """The window length: `block_size`, or the model's `context` by default; UsageError
    when it is above the context."""
    if block_size is None:
        return context
    if block_size > context:
        raise UsageError(
            f"`block_size` {block_size} is above the model's context ({context} tokens); "
            f"allowed: 2 .. {context}"
        )
    return block_size


def run_eval_model(
    trained: TrainedModel,
    *,
    name: str | None = None,
    source: str = "resstream",
    block_size: int | None = None,
) -> EvalModel:
    """A finished resstream run as an `EvalModel` (its context is its config's block_size;
    its fingerprint is that of its weights file, `checkpoint.weights_fingerprint`)."""
    from resstream.training.checkpoint import weights_fingerprint

    data = trained.config.data
    context = trained.config.model.block_size
    return EvalModel(
        forward=trained.model,
        tokenizer=trained.tokenizer,
        block_size=resolve_block_size(block_size, context),
        context=context,
        name=name if name is not None else str(trained.path),
        fingerprint=weights_fingerprint(trained.path),
        source=source,
        config=trained.config.to_dict(),
        training=TrainingText(data.dataset, data.val_fraction, trained.meta.get("corpus_fingerprint")),
    )


# ------------------------------------------------------------------ preparation
@dataclass(frozen=True)
class PreparedBenchmark:
    """A benchmark's text, tokenised and ready to score."""

    name: str
    origin: str
    fingerprint: str
    tokens: np.ndarray | None = None  # text benchmarks
    examples: tuple[LambadaExample, ...] | None = None  # lambada
    note: str | None = None


@dataclass(frozen=True)
class EvalPlan:
    """Everything `run_plan` needs; building it validates every input."""

    model: EvalModel
    benchmarks: tuple[PreparedBenchmark, ...]
    stride: int
    batch_size: int
    max_tokens: int | None
    device: torch.device


def check_benchmarks(names: Iterable[str], *, allow_all: bool = False) -> tuple[str, ...]:
    """Benchmark names checked against `BENCHMARKS`: unique, in the given order.

    The one place a benchmark name is validated (eval, sweep and compare). With `allow_all`
    the name 'all' is accepted too and stands for every benchmark.
    """
    allowed = (*BENCHMARKS, "all") if allow_all else BENCHMARKS
    chosen: list[str] = []
    for name in names:
        check_choice("benchmark", name, allowed)
        chosen += BENCHMARKS if name == "all" else (name,)
    return tuple(dict.fromkeys(chosen))


def parse_benchmarks(benchmarks: str | Iterable[str]) -> tuple[str, ...]:
    """Benchmark names from a comma-separated string or a sequence; duplicates dropped."""
    names = benchmarks.split(",") if isinstance(benchmarks, str) else list(benchmarks)
    names = [name.strip() for name in names if name.strip()]
    if not names:
        raise UsageError(f"`benchmarks` is empty; allowed: {', '.join(BENCHMARKS)}")
    return check_benchmarks(names)


def check_settings(
    *,
    stride: int | None,
    batch_size: int,
    max_tokens: int | None,
    data_dir: str | os.PathLike[str] | None,
    block_size: int | None = None,
) -> None:
    """Refuse settings no evaluation can use (stride and block_size against the model's
    context are checked once it is loaded)."""
    if block_size is not None and block_size < 2:
        raise UsageError(
            f"`block_size` must be >= 2 (a window of 1 token scores every token without context), "
            f"got {block_size}"
        )
    if stride is not None and stride < 1:
        raise UsageError(f"`stride` must be >= 1, got {stride}")
    if batch_size < 1:
        raise UsageError(f"`batch_size` must be >= 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 2:
        raise UsageError(f"`max_tokens` must be >= 2 (one token of context, one scored), got {max_tokens}")
    check_data_dir(data_dir)


def check_data_dir(data_dir: str | os.PathLike[str] | None) -> None:
    """A local data directory, when one is given, must be a directory."""
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UsageError(f"`data_dir` {str(data_dir)!r} is not a directory")


def resolve_stride(stride: int | None, block_size: int) -> int:
    """`stride`, or block_size // 2 by default; must lie in [1, block_size]."""
    if stride is None:
        return max(1, block_size // 2)
    if not 1 <= stride <= block_size:
        raise UsageError(f"`stride` {stride} is outside [1, {block_size}] (the model's block_size)")
    return stride


def load_benchmark_corpus(name: str, data_dir: str | os.PathLike[str] | None) -> Corpus:
    """The benchmark's corpus; any failure to get it is a UsageError naming the benchmark."""
    from resstream.data import default_split, load_corpus

    try:
        return load_corpus(name, split=default_split(name), data_dir=data_dir)
    except UsageError as exc:
        message = str(exc).splitlines()[0] if str(exc) else "unavailable"
        raise UsageError(f"benchmark {name!r} is not available: {message}") from None
    except (OSError, ValueError, ConnectionError, RuntimeError) as exc:
        raise UsageError(
            f"benchmark {name!r} is not available (give `data_dir` or go online): "
            f"{type(exc).__name__}: {short_reason(exc)}"
        ) from None


def check_benchmark_data(names: Iterable[str], data_dir: str | os.PathLike[str] | None) -> None:
    """Refuse, before any work, benchmarks whose text cannot be loaded (UsageError naming it)."""
    check_data_dir(data_dir)
    for name in names:
        load_benchmark_corpus(name, data_dir)


@dataclass(frozen=True)
class BenchmarkData:
    """Which benchmarks' texts can be read here: the fingerprint of each readable one, and
    why each other one cannot be read (the one-line message of `load_benchmark_corpus`)."""

    fingerprints: dict[str, str]
    unavailable: dict[str, str]


def find_benchmark_data(names: Iterable[str], data_dir: str | os.PathLike[str] | None) -> BenchmarkData:
    """Try to read every benchmark of `names`; nothing is refused (see `check_benchmark_data`)."""
    check_data_dir(data_dir)
    fingerprints, unavailable = {}, {}
    for name in names:
        try:
            fingerprints[name] = load_benchmark_corpus(name, data_dir).fingerprint
        except UsageError as exc:
            unavailable[name] = str(exc)
    return BenchmarkData(fingerprints, unavailable)


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


#: Token streams of whole benchmark corpora, by (tokenizer, corpus) fingerprint: the runs of a
#: sweep share one tokenizer, so each corpus is tokenised once per process, not once per run.
_STREAMS: dict[tuple[str, str], np.ndarray] = {}
_MAX_STREAMS = 8


def benchmark_tokens(
    corpus: Corpus, tokenizer: Any, *, limit: int | None = None, progress: bool = False
) -> np.ndarray:
    """The corpus's token stream (`resstream.data.tokenize_documents`), or at least its first
    `limit` tokens: a prefix is tokenised only as far as it is needed (the ids of a prefix do not
    depend on what follows: the stream is cut where the tokens do not change), a whole stream is
    kept for the next model with the same tokenizer."""
    from resstream.data import tokenize_documents
    from resstream.data.tokenizer import tokenizer_fingerprint

    key = (tokenizer_fingerprint(tokenizer), corpus.fingerprint)
    if key in _STREAMS:
        return _STREAMS[key]
    if limit is not None:
        return tokenize_documents(corpus.documents, tokenizer, progress=False, limit=limit)
    tokens = tokenize_documents(corpus.documents, tokenizer, progress=None if progress else False)
    if len(_STREAMS) >= _MAX_STREAMS:
        _STREAMS.pop(next(iter(_STREAMS)))
    tokens.setflags(write=False)  # shared by every model that asks next
    _STREAMS[key] = tokens
    return tokens


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


def prepare(
    run_dir: str | os.PathLike[str],
    benchmarks: str | Iterable[str] = BENCHMARKS,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str = "cpu",
    max_tokens: int | None = None,
    progress: bool = False,
    block_size: int | None = None,
) -> EvalPlan:
    """Validate every input, load a run's model and all benchmark texts; nothing is scored yet.

    Any other model: `resstream.models.evaluation.prepare_eval`."""
    from resstream.training.checkpoint import load_run

    def load(torch_device: torch.device) -> EvalModel:
        return run_eval_model(load_run(run_dir, device=torch_device), block_size=block_size)

    return prepare_model(
        load,
        benchmarks,
        data_dir=data_dir,
        stride=stride,
        batch_size=batch_size,
        device=device,
        max_tokens=max_tokens,
        progress=progress,
        block_size=block_size,
    )


def prepare_model(
    load: Callable[[torch.device], EvalModel],
    benchmarks: str | Iterable[str] = BENCHMARKS,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str = "cpu",
    max_tokens: int | None = None,
    progress: bool = False,
    block_size: int | None = None,
) -> EvalPlan:
    """`prepare` for any model: the settings are checked, then `load(device)` gives the model
    (it applies `block_size`), then every benchmark text is loaded and tokenised."""
    from resstream.devices import resolve_device

    names = parse_benchmarks(benchmarks)
    check_settings(
        stride=stride, batch_size=batch_size, max_tokens=max_tokens, data_dir=data_dir, block_size=block_size
    )
    torch_device = resolve_device(device)
    model = load(torch_device)
    stride = resolve_stride(stride, model.block_size)
    corpora = {name: load_benchmark_corpus(name, data_dir) for name in names}  # fail fast: load all first
    prepared = tuple(
        prepare_benchmark(name, corpus, model, max_tokens=max_tokens, progress=progress)
        for name, corpus in corpora.items()
    )
    return EvalPlan(model, prepared, stride, batch_size, max_tokens, torch_device)


# ---------------------------------------------------------------------- how long it takes
#: An evaluation estimated to take longer than this many seconds suggests `max_tokens`.
LONG_EVAL_S = 60.0
#: The `max_tokens` values a suggestion picks from (the largest that fits `LONG_EVAL_S`).
SUGGESTED_CAPS = (100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000)


@dataclass(frozen=True)
class BenchmarkSize:
    """How many tokens a prepared benchmark scores, feeds through the model, and caps
    (`max_tokens` counts `capped`: the text's tokens, or LAMBADA's passage tokens)."""

    name: str
    scored: int
    fed: int
    capped: int


def benchmark_size(plan: EvalPlan, bench: PreparedBenchmark) -> BenchmarkSize:
    """The sizes of one prepared benchmark under the plan's window settings."""
    from resstream.training.scoring import window_plan

    if bench.examples is not None:
        fed = sum(len(ex.ids) - 1 for ex in bench.examples)
        scored = sum(ex.num_target for ex in bench.examples)
        return BenchmarkSize(bench.name, scored, fed, fed + len(bench.examples))
    windows = window_plan(len(bench.tokens), plan.model.block_size, plan.stride)
    return BenchmarkSize(bench.name, len(bench.tokens) - 1, len(windows) * windows.length, len(bench.tokens))


@dataclass(frozen=True)
class EvalEstimate:
    """How long scoring a plan should take, from a measured speed (tokens fed per second)."""

    sizes: tuple[BenchmarkSize, ...]
    tokens_per_s: float

    @property
    def scored(self) -> int:
        """Tokens scored over all benchmarks."""
        return sum(size.scored for size in self.sizes)

    def seconds(self, max_tokens: int | None = None) -> float:
        """Estimated seconds; with `max_tokens`, for the benchmarks cut to that many tokens."""
        fed = 0.0
        for size in self.sizes:
            share = 1.0 if max_tokens is None else min(1.0, max_tokens / size.capped)
            fed += size.fed * share
        return fed / self.tokens_per_s

    def suggested_cap(self) -> int | None:
        """For a long evaluation (over `LONG_EVAL_S`), the largest of `SUGGESTED_CAPS` that
        brings it within that time, else the smallest that shortens it; None when the
        evaluation is not long or no cap would shorten it."""
        if self.seconds() <= LONG_EVAL_S:
            return None
        shorter = [cap for cap in SUGGESTED_CAPS if self.seconds(cap) < self.seconds()]
        fitting = [cap for cap in shorter if self.seconds(cap) <= LONG_EVAL_S]
        if fitting:
            return max(fitting)
        return min(shorter) if shorter else None


def measure_speed(plan: EvalPlan, *, min_batches: int = 3, min_seconds: float = 0.5) -> float:
    """Tokens per second the model takes in full batches of `batch_size` windows on the plan's
    device, each scored as the evaluation scores it (forward, then the loss of every token):
    after one warm-up batch, the mean over at least `min_batches` batches and `min_seconds`
    (at most 10 batches). Token ids are zeros: the cost does not depend on them."""
    import time

    batch = torch.zeros(plan.batch_size, plan.model.block_size, dtype=torch.long, device=plan.device)
    timed, elapsed = 0, 0.0
    with torch.inference_mode():
        _score_once(plan, batch)  # warm-up
        while timed < 10 and (timed < min_batches or elapsed < min_seconds):
            started = time.perf_counter()
            _score_once(plan, batch)
            elapsed += time.perf_counter() - started
            timed += 1
    return timed * batch.numel() / max(elapsed, 1e-9)


def _score_once(plan: EvalPlan, batch: torch.Tensor) -> float:
    """The summed next-token loss of one batch (`.item()` waits for the device)."""
    from resstream.training.scoring import logits_of

    logits = logits_of(plan.model.forward, batch).float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.flatten(), reduction="sum").item()


def estimate(plan: EvalPlan) -> EvalEstimate:
    """The plan's sizes and a speed measured on its model (`measure_speed`)."""
    sizes = tuple(benchmark_size(plan, bench) for bench in plan.benchmarks)
    return EvalEstimate(sizes, measure_speed(plan))


def duration_text(seconds: float) -> str:
    """'45 s', '3 min 20 s', '2 h 5 min': an estimate, rounded as people say it."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if minutes < 10 and secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def score_benchmark(plan: EvalPlan, bench: PreparedBenchmark, *, progress: bool) -> BenchmarkResult:
    """Score one prepared benchmark."""
    model, block = plan.model.forward, plan.model.block_size
    extra = {"origin": bench.origin, "fingerprint": bench.fingerprint, "note": bench.note}
    if bench.examples is not None:
        sums: ScoreSums = score_lambada(
            model,
            bench.examples,
            batch_size=plan.batch_size,
            device=plan.device,
            progress=progress,
            desc=bench.name,
        )
    else:
        sums = score_tokens(
            model,
            bench.tokens,
            block_size=block,
            stride=plan.stride,
            batch_size=plan.batch_size,
            device=plan.device,
            progress=progress,
            desc=bench.name,
        )
    return sums.result(bench.name, **extra)


def run_plan(plan: EvalPlan, *, progress: bool = True) -> EvalReport:
    """Score every benchmark of a prepared plan."""
    results = tuple(score_benchmark(plan, bench, progress=progress) for bench in plan.benchmarks)
    return EvalReport(
        model=plan.model.name,
        results=results,
        stride=plan.stride,
        block_size=plan.model.block_size,
        batch_size=plan.batch_size,
        max_tokens=plan.max_tokens,
        device=str(plan.device),
        model_fingerprint=plan.model.fingerprint,
        model_source=plan.model.source,
        context=plan.model.context,
        end_of_text=plan.model.end_of_text,
    )


def evaluate_run(
    run_dir: str | os.PathLike[str],
    benchmarks: str | Iterable[str] = BENCHMARKS,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str = "cpu",
    max_tokens: int | None = None,
    progress: bool = True,
    block_size: int | None = None,
) -> EvalReport:
    """Evaluate a run directory's final model on `benchmarks` (see the module docstring); any
    other model: `resstream.evaluate_model`."""
    plan = prepare(
        run_dir,
        benchmarks,
        data_dir=data_dir,
        stride=stride,
        batch_size=batch_size,
        device=device,
        max_tokens=max_tokens,
        progress=progress,
        block_size=block_size,
    )
    return run_plan(plan, progress=progress)


def datasets_fingerprint(results: Iterable[BenchmarkResult]) -> str:
    """One fingerprint over the corpora of all benchmarks (sha256 of name:fingerprint lines)."""
    text = "\n".join(f"{r.name}:{r.fingerprint}" for r in results)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
