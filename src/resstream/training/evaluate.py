"""Benchmark evaluation of a finished resstream run: loss, perplexity, top-1 accuracy, LAMBADA.

Benchmarks (`BENCHMARKS`): ``wikitext-2`` (test split), ``lambada`` (OpenAI test set),
``openwebtext`` (sample), ``fineweb-edu`` (sample) and ``shakespeare``: the held-out tail of the
built-in corpus, cut by the rule the trainer uses
(``split_tokens(tokenize_documents(corpus.documents, tokenizer), config.data.val_fraction)``).
It is held-out text only for a run that trained on ``shakespeare``; the result says so either way.
The same rule applies to any benchmark whose text is the run's own training corpus (same
fingerprint, e.g. ``fineweb-edu`` for the ``gpt2-124m`` preset): only its validation tail is scored.

Every benchmark reports the mean next-token cross-entropy in nats (``loss``), its exponential
(``perplexity``), next-token top-1 accuracy in percent (``accuracy``; ties go to the lowest
token id) and the number of tokens scored (``num_tokens``).

Sliding window (text benchmarks)
--------------------------------
A benchmark's documents are tokenised and concatenated with an end-of-text token after each one
(`resstream.data.tokenize_documents`), giving a stream t_0 .. t_{N-1}; ``--max-tokens M`` keeps
its first M tokens. Token t_p (p = 1 .. N-1) is predicted from the tokens before it. Windows of
L = min(block_size, N - 1) input tokens start at 0, stride, 2·stride, ... (default stride =
block_size // 2); the last start is pulled back to N - 1 - L so every window is full. A window
scores only the targets the previous window did not reach, so every position 1 .. N-1 is
scored exactly once and every scored token outside the first window sees at least
block_size - stride tokens of context. stride = block_size gives disjoint windows (fastest,
least context); stride = 1 gives every token the longest context the model allows (slowest).
Windows are run in batches (``batch_size``) under `torch.inference_mode`; the logits of one
batch (batch × block_size × vocab) are the most that exist at any time.

LAMBADA
-------
Each passage (trailing whitespace removed) is split at its last space: context = the text before
it, target = " " + last word; both are tokenised separately, the context is preceded by the
end-of-text token (the document start the model saw in training) and the whole sequence is
cut from the left to at most block_size + 1 tokens. With the true prefix given (teacher
forcing), the passage counts as correct iff every target token is the argmax. ``loss``,
``perplexity``, ``accuracy`` and ``num_tokens`` cover the target-word tokens only;
``last_word_accuracy`` is the percentage of passages correct, ``num_examples`` the number of
passages. With ``--max-tokens M`` LAMBADA uses the longest run of first passages whose
sequences (end-of-text + context + target, after the cut) hold at most M tokens in all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from resstream.errors import UsageError, check_choice

BENCHMARKS: tuple[str, ...] = ("wikitext-2", "lambada", "openwebtext", "fineweb-edu", "shakespeare")
#: The split of each benchmark's corpus that is evaluated.
SPLITS: dict[str, str] = {
    "wikitext-2": "test",
    "lambada": "test",
    "openwebtext": "train",
    "fineweb-edu": "train",
    "shakespeare": "train",
}
DEFAULT_BATCH_SIZE = 16

SLIDING_WINDOW_DOC = (
    "Documents are tokenised and concatenated with an end-of-text token after each; windows of "
    "block_size input tokens advance by stride (the last one is pulled back to end at the final "
    "token); each window scores only the targets the previous window did not reach, so every "
    "token after the first is scored exactly once and every scored token outside the first "
    "window has at least block_size - stride tokens of context."
)
LAMBADA_DOC = (
    "Context = passage up to its last space, preceded by end-of-text; target = ' ' + last word. "
    "A passage is correct iff every target token is the argmax given the true prefix (greedy, "
    "teacher-forced). loss, perplexity, accuracy and num_tokens cover the target tokens only."
)


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class BenchmarkResult:
    """The scores of one benchmark."""

    name: str
    loss: float  # mean next-token cross-entropy, nats
    perplexity: float
    accuracy: float  # next-token top-1, percent
    num_tokens: int  # tokens scored
    last_word_accuracy: float | None = None  # LAMBADA only, percent of passages
    num_examples: int | None = None  # LAMBADA: passages scored
    origin: str | None = None  # where the text came from
    fingerprint: str | None = None  # of the corpus text
    note: str | None = None


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

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form written to eval.json."""
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
            "benchmarks": [dataclasses.asdict(r) for r in self.results],
        }


@dataclass
class ScoreSums:
    """Running sums of next-token scores; `result` turns them into a BenchmarkResult."""

    nll: float = 0.0  # summed cross-entropy, nats
    correct: int = 0  # top-1 hits
    count: int = 0  # tokens scored

    def result(self, name: str, **extra: Any) -> BenchmarkResult:
        """Mean loss, perplexity and accuracy (NaN when nothing was scored)."""
        if self.count == 0:
            return BenchmarkResult(name, math.nan, math.nan, math.nan, 0, **extra)
        loss = self.nll / self.count
        return BenchmarkResult(
            name, loss, _perplexity(loss), 100.0 * self.correct / self.count, self.count, **extra
        )


def _perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


# ----------------------------------------------------------------- sliding windows
@dataclass(frozen=True)
class WindowPlan:
    """Windows over a stream of `num_tokens` tokens.

    Window w feeds tokens[starts[w] : starts[w] + length] and scores its targets j = skip[w] ..
    length - 1, i.e. stream positions starts[w] + j + 1.
    """

    starts: np.ndarray
    skip: np.ndarray
    length: int

    def __len__(self) -> int:
        return len(self.starts)

    def scored_positions(self) -> np.ndarray:
        """Every stream position scored, in scoring order."""
        return np.concatenate(
            [
                np.arange(s + k + 1, s + self.length + 1)
                for s, k in zip(self.starts.tolist(), self.skip.tolist(), strict=True)
            ]
        )


def window_plan(num_tokens: int, block_size: int, stride: int) -> WindowPlan:
    """The sliding windows that score positions 1 .. num_tokens - 1 exactly once."""
    if num_tokens < 2:
        raise ValueError(f"need at least 2 tokens to score one, got {num_tokens}")
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride {stride} is outside [1, block_size={block_size}]")
    length = min(block_size, num_tokens - 1)
    last_start = num_tokens - 1 - length
    count = 1 + -(-last_start // stride)
    starts = np.minimum(np.arange(count, dtype=np.int64) * stride, last_start)
    reached = np.concatenate([[0], starts[:-1] + length])  # last position of the previous window
    return WindowPlan(starts=starts, skip=reached - starts, length=length)


def _logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Logits of a resstream GPT (tuple), a plain tensor model or a Hugging Face model."""
    out = model(idx)
    if isinstance(out, tuple):
        return out[0]
    return getattr(out, "logits", out)


def _as_numpy(tokens: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(tokens, torch.Tensor):
        return tokens.detach().cpu().numpy()
    return np.asarray(tokens)


def score_tokens(
    model: torch.nn.Module,
    tokens: np.ndarray | torch.Tensor,
    *,
    block_size: int,
    stride: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device = "cpu",
    progress: bool = False,
    desc: str | None = None,
) -> ScoreSums:
    """Score every next token of a stream with sliding windows (see the module docstring).

    Returns the summed cross-entropy, top-1 hits and count over positions 1 .. N-1 (call
    `.result(name)` for means). `model` maps ids (batch, seq) to logits, or to a tuple / an
    output object holding them; put it in eval mode first (this function does not).
    """
    stream = _as_numpy(tokens)
    plan = window_plan(len(stream), block_size, stride)
    with (
        torch.inference_mode(),
        tqdm(
            total=len(plan), desc=desc, unit="win", disable=not progress, dynamic_ncols=True, leave=False
        ) as bar,
    ):
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # nll, correct, count
        for first in range(0, len(plan), batch_size):
            starts = plan.starts[first : first + batch_size]
            rows = np.stack([stream[s : s + plan.length + 1] for s in starts.tolist()]).astype(np.int64)
            batch = torch.from_numpy(rows).to(device)
            logits = _logits(model, batch[:, :-1])
            for row, skip in enumerate(plan.skip[first : first + batch_size].tolist()):
                sums += _row_sums(logits[row, skip:], batch[row, skip + 1 :])
            bar.update(len(starts))
    nll, correct, count = sums.tolist()
    return ScoreSums(nll=nll, correct=int(correct), count=int(count))


def _row_sums(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(summed nll, top-1 hits, count) of one row's scored positions, as float64."""
    logits = logits.float()
    nll = F.cross_entropy(logits, targets, reduction="sum")
    hits = (logits.argmax(-1) == targets).sum()
    return torch.stack(
        [nll.double(), hits.double(), torch.tensor(len(targets), dtype=torch.float64, device=logits.device)]
    )


# --------------------------------------------------------------------------- LAMBADA
@dataclass(frozen=True)
class LambadaExample:
    """One passage as token ids: `ids` = eos + context + target, the last `num_target` the target."""

    ids: tuple[int, ...]
    num_target: int


@dataclass
class LambadaSums(ScoreSums):
    """Token sums over target words, plus whole-word hits."""

    words_correct: int = 0
    examples: int = 0

    def result(self, name: str, **extra: Any) -> BenchmarkResult:
        """As ScoreSums, with last-word accuracy (percent) and the number of passages."""
        word_acc = 100.0 * self.words_correct / self.examples if self.examples else math.nan
        return super().result(name, last_word_accuracy=word_acc, num_examples=self.examples, **extra)


def split_passage(text: str) -> tuple[str, str] | None:
    """(context, " " + last word) of a LAMBADA passage, or None when it has no space."""
    text = text.rstrip()
    cut = text.rfind(" ")
    if cut <= 0:
        return None
    return text[:cut], text[cut:]


def _encode_all(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens (the Rust backend when there is one)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        return [enc.ids for enc in backend.encode_batch(texts, add_special_tokens=False)]
    return [list(tokenizer.encode(text, add_special_tokens=False)) for text in texts]


def lambada_examples(
    tokenizer: Any, passages: Iterable[str], *, block_size: int, max_tokens: int | None = None
) -> list[LambadaExample]:
    """Tokenised passages (see the module docstring); stops before `max_tokens` would be passed."""
    eos = getattr(tokenizer, "eos_token_id", None)
    prefix = [eos] if eos is not None else []
    pairs = [parts for parts in map(split_passage, passages) if parts is not None]
    contexts = _encode_all(tokenizer, [context for context, _ in pairs])
    targets = _encode_all(tokenizer, [target for _, target in pairs])
    examples: list[LambadaExample] = []
    used = 0
    for context, target in zip(contexts, targets, strict=True):
        ids = (prefix + context + target)[-(block_size + 1) :]
        num_target = min(len(target), len(ids) - 1)
        if num_target < 1:
            continue
        if max_tokens is not None and used + len(ids) > max_tokens:
            break
        used += len(ids)
        examples.append(LambadaExample(tuple(ids), num_target))
    return examples


def score_lambada(
    model: torch.nn.Module,
    examples: Sequence[LambadaExample],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device = "cpu",
    progress: bool = False,
    desc: str | None = "lambada",
) -> LambadaSums:
    """Teacher-forced scores of the target words; passages are right-padded per batch.

    Right padding cannot change a causal model's logits at the real positions, so the result
    does not depend on `batch_size`.
    """
    sums = LambadaSums()
    with (
        torch.inference_mode(),
        tqdm(
            total=len(examples),
            desc=desc,
            unit="passage",
            disable=not progress,
            dynamic_ncols=True,
            leave=False,
        ) as bar,
    ):
        for first in range(0, len(examples), batch_size):
            chunk = examples[first : first + batch_size]
            width = max(len(ex.ids) for ex in chunk)
            rows = torch.zeros(len(chunk), width, dtype=torch.long)
            for i, ex in enumerate(chunk):
                rows[i, : len(ex.ids)] = torch.tensor(ex.ids)
            rows = rows.to(device)
            logits = _logits(model, rows[:, :-1])
            for i, ex in enumerate(chunk):
                end = len(ex.ids) - 1  # input positions end - num_target .. end - 1 predict the target
                pred = logits[i, end - ex.num_target : end].float()
                target = rows[i, end - ex.num_target + 1 : end + 1]
                hits = int((pred.argmax(-1) == target).sum())
                sums.nll += float(F.cross_entropy(pred, target, reduction="sum"))
                sums.correct += hits
                sums.count += ex.num_target
                sums.words_correct += int(hits == ex.num_target)
                sums.examples += 1
            bar.update(len(chunk))
    return sums


def lambada_scores(
    model: torch.nn.Module,
    tokenizer: Any,
    passages: Iterable[str],
    *,
    block_size: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device = "cpu",
    max_tokens: int | None = None,
    progress: bool = False,
) -> BenchmarkResult:
    """LAMBADA last-word accuracy and target-word loss of `model` on raw passages."""
    examples = lambada_examples(tokenizer, passages, block_size=block_size, max_tokens=max_tokens)
    return score_lambada(model, examples, batch_size=batch_size, device=device, progress=progress).result(
        "lambada"
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

    trained: Any  # resstream.training.checkpoint.TrainedModel
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
        raise UsageError(f"--benchmarks is empty; allowed: {', '.join(BENCHMARKS)}")
    return check_benchmarks(names)


def check_settings(
    *, stride: int | None, batch_size: int, max_tokens: int | None, data_dir: str | os.PathLike[str] | None
) -> None:
    """Refuse settings no evaluation can use (stride vs. block_size is checked later)."""
    if stride is not None and stride < 1:
        raise UsageError(f"--stride must be >= 1, got {stride}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 2:
        raise UsageError(f"--max-tokens must be >= 2 (one token of context, one scored), got {max_tokens}")
    check_data_dir(data_dir)


def check_data_dir(data_dir: str | os.PathLike[str] | None) -> None:
    """A local data directory, when one is given, must be a directory."""
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UsageError(f"--data-dir {str(data_dir)!r} is not a directory")


def resolve_stride(stride: int | None, block_size: int) -> int:
    """`stride`, or block_size // 2 by default; must lie in [1, block_size]."""
    if stride is None:
        return max(1, block_size // 2)
    if not 1 <= stride <= block_size:
        raise UsageError(f"--stride {stride} is outside [1, {block_size}] (the model's block_size)")
    return stride


def load_benchmark_corpus(name: str, data_dir: str | os.PathLike[str] | None) -> Any:
    """The benchmark's corpus; any failure to get it is a UsageError naming the benchmark."""
    from resstream.data import load_corpus

    try:
        return load_corpus(name, split=SPLITS[name], data_dir=data_dir)
    except UsageError as exc:
        message = str(exc).splitlines()[0] if str(exc) else "unavailable"
        raise UsageError(f"benchmark {name!r} is not available: {message}") from None
    except (OSError, ValueError, ConnectionError, RuntimeError) as exc:
        raise UsageError(
            f"benchmark {name!r} is not available (give --data-dir or go online): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None


def check_benchmark_data(names: Iterable[str], data_dir: str | os.PathLike[str] | None) -> None:
    """Refuse, before any work, benchmarks whose text cannot be loaded (UsageError naming it)."""
    check_data_dir(data_dir)
    for name in names:
        load_benchmark_corpus(name, data_dir)


def _shakespeare_note(trained: Any, corpus_fingerprint: str, val_fraction: float) -> str:
    trained_on = trained.config.data.dataset
    base = f"validation tail (val_fraction={val_fraction}) of the built-in corpus"
    if trained_on != "shakespeare":
        return (
            f"{base}; NOT held out in a meaningful sense: the run trained on {trained_on!r}, not shakespeare"
        )
    saved = trained.meta.get("corpus_fingerprint")
    if saved is not None and saved != corpus_fingerprint:
        return (
            f"{base}; the corpus text differs from the one the run trained on (fingerprint), "
            "so the tail may not be held out"
        )
    return f"{base}; held out: the run trained on shakespeare and never saw this tail"


def prepare_benchmark(
    name: str, corpus: Any, trained: Any, *, max_tokens: int | None, progress: bool = False
) -> PreparedBenchmark:
    """Tokenise one benchmark's corpus; UsageError when too little of it is left to score."""
    from resstream.data import split_tokens, tokenize_documents

    block = trained.config.model.block_size
    if name == "lambada":
        examples = lambada_examples(
            trained.tokenizer, corpus.documents, block_size=block, max_tokens=max_tokens
        )
        if not examples:
            raise UsageError(f"benchmark 'lambada' has no passage that fits in --max-tokens {max_tokens}")
        return PreparedBenchmark(name, corpus.origin, corpus.fingerprint, examples=tuple(examples))
    tokens = tokenize_documents(corpus.documents, trained.tokenizer, progress=None if progress else False)
    note = None
    val_fraction = trained.config.data.val_fraction
    trained_on_it = corpus.fingerprint == trained.meta.get("corpus_fingerprint")
    if name == "shakespeare" or trained_on_it:  # score only the tail the trainer held out
        tokens = split_tokens(tokens, val_fraction)[1]
        note = (
            _shakespeare_note(trained, corpus.fingerprint, val_fraction)
            if name == "shakespeare"
            else f"the run trained on this corpus: only its validation tail "
            f"(val_fraction={val_fraction}) is scored"
        )
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
) -> EvalPlan:
    """Validate every input, load the model and all benchmark texts; nothing is scored yet."""
    from resstream.devices import resolve_device
    from resstream.training.checkpoint import load_run

    names = parse_benchmarks(benchmarks)
    check_settings(stride=stride, batch_size=batch_size, max_tokens=max_tokens, data_dir=data_dir)
    torch_device = resolve_device(device)
    trained = load_run(run_dir, device=torch_device)
    stride = resolve_stride(stride, trained.config.model.block_size)
    corpora = {name: load_benchmark_corpus(name, data_dir) for name in names}  # fail fast: load all first
    prepared = tuple(
        prepare_benchmark(name, corpus, trained, max_tokens=max_tokens, progress=progress)
        for name, corpus in corpora.items()
    )
    return EvalPlan(trained, prepared, stride, batch_size, max_tokens, torch_device)


def score_benchmark(plan: EvalPlan, bench: PreparedBenchmark, *, progress: bool) -> BenchmarkResult:
    """Score one prepared benchmark."""
    model, block = plan.trained.model, plan.trained.config.model.block_size
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
        model=str(plan.trained.path),
        results=results,
        stride=plan.stride,
        block_size=plan.trained.config.model.block_size,
        batch_size=plan.batch_size,
        max_tokens=plan.max_tokens,
        device=str(plan.device),
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
) -> EvalReport:
    """Evaluate a run directory's final model on `benchmarks` (see the module docstring)."""
    plan = prepare(
        run_dir,
        benchmarks,
        data_dir=data_dir,
        stride=stride,
        batch_size=batch_size,
        device=device,
        max_tokens=max_tokens,
        progress=progress,
    )
    return run_plan(plan, progress=progress)


def datasets_fingerprint(results: Iterable[BenchmarkResult]) -> str:
    """One fingerprint over the corpora of all benchmarks (sha256 of name:fingerprint lines)."""
    text = "\n".join(f"{r.name}:{r.fingerprint}" for r in results)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
