"""Scoring a model's next-token predictions: sliding windows over a token stream, and LAMBADA.

Every score is a `BenchmarkResult`: the mean next-token cross-entropy in nats (``loss``), its
exponential (``perplexity``), next-token top-1 accuracy in percent (``accuracy``; ties go to the
lowest token id) and the number of tokens scored (``num_tokens``). Which texts are scored, and
how a finished run is loaded and evaluated, is `resstream.training.evaluate`.

Sliding window (text benchmarks)
--------------------------------
A benchmark's documents are tokenised and concatenated with an end-of-text token after each one
(`resstream.data.tokenize_documents`), giving a stream t_0 .. t_{N-1}; ``max_tokens = M`` keeps
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
passages. With ``max_tokens = M`` LAMBADA uses the longest run of first passages whose
sequences (end-of-text + context + target, after the cut) hold at most M tokens in all.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from resstream.distributed import Distributed, run_sharded

#: One process (no torchrun): `score_tokens` and `score_lambada` score every batch themselves.
ONE_PROCESS = Distributed()

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

    def to_dict(self) -> dict[str, Any]:
        """Plain, strict JSON data: a non-finite score is null and `null_reason` says why."""
        data = dataclasses.asdict(self)
        nulls = [k for k, v in data.items() if isinstance(v, float) and not math.isfinite(v)]
        if nulls:
            data.update(dict.fromkeys(nulls), null_reason=self._null_reason(nulls))
        return data

    def _null_reason(self, nulls: list[str]) -> str:
        if self.num_tokens == 0:
            return "nothing was scored"
        if nulls == ["perplexity"]:
            return f"perplexity = exp(loss {self.loss:.6g}) exceeds the float range"
        return "non-finite " + ", ".join(f"{k} ({getattr(self, k)})" for k in nulls)


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


def logits_of(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Logits of a resstream GPT (tuple), a plain tensor model or a Hugging Face model."""
    out = model(idx)
    if isinstance(out, tuple):
        return out[0]
    return getattr(out, "logits", out)


def _token_bar(total: int, desc: str | None, progress: bool) -> tqdm:
    """A progress bar that counts the tokens scored (`num_tokens` of the result)."""
    return tqdm(
        total=total,
        desc=desc,
        unit="tok",
        unit_scale=True,
        disable=not progress,
        dynamic_ncols=True,
        leave=False,
    )


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
    ranks: Distributed = ONE_PROCESS,
) -> ScoreSums:
    """Score every next token of a stream with sliding windows (see the module docstring).

    Returns the summed cross-entropy, top-1 hits and count over positions 1 .. N-1 (call
    `.result(name)` for means). `model` maps ids (batch, seq) to logits, or to a tuple / an
    output object holding them; put it in eval mode first (this function does not). `ranks`:
    the processes of a torchrun job that share the batches out and get the same sums as one
    process (`resstream.distributed.run_sharded`; every rank must call this function).
    """
    stream = _as_numpy(tokens)
    plan = window_plan(len(stream), block_size, stride)

    def measure(first: int) -> torch.Tensor:
        """(rows, 3) sums of the rows of the batch that starts at window `first`."""
        starts = plan.starts[first : first + batch_size]
        rows = np.stack([stream[s : s + plan.length + 1] for s in starts.tolist()]).astype(np.int64)
        batch = torch.from_numpy(rows).to(device)
        logits = logits_of(model, batch[:, :-1])
        skips = plan.skip[first : first + batch_size].tolist()
        found = torch.stack(
            [_row_sums(logits[row, skip:], batch[row, skip + 1 :]) for row, skip in enumerate(skips)]
        )
        bar.update(sum(plan.length - skip for skip in skips))
        return found if ranks.world == 1 else found.cpu()  # another rank's part arrives on the CPU

    def add(found: torch.Tensor) -> None:
        for row in found.to(device):  # row by row, as one process adds them
            sums.add_(row)

    shown = progress and ranks.is_main
    with torch.inference_mode(), _token_bar(len(stream) - 1, desc, shown) as bar:
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # nll, correct, count
        run_sharded(range(0, len(plan), batch_size), measure, add, ranks)
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
    examples: list[LambadaExample] = []
    used = 0
    for context, target in _encoded_pairs(tokenizer, passages):
        ids = (prefix + context + target)[-(block_size + 1) :]
        num_target = min(len(target), len(ids) - 1)
        if num_target < 1:
            continue
        if max_tokens is not None and used + len(ids) > max_tokens:
            break
        used += len(ids)
        examples.append(LambadaExample(tuple(ids), num_target))
    return examples


#: Passages encoded per call of the tokenizer by `_encoded_pairs` (a capped LAMBADA needs few).
_PASSAGE_BATCH = 256


def _encoded_pairs(tokenizer: Any, passages: Iterable[str]) -> Iterator[tuple[list[int], list[int]]]:
    """(context ids, target ids) of each passage that splits (`split_passage`), encoded in
    batches as they are consumed."""
    pairs = (parts for parts in map(split_passage, passages) if parts is not None)
    while batch := list(itertools.islice(pairs, _PASSAGE_BATCH)):
        contexts = _encode_all(tokenizer, [context for context, _ in batch])
        targets = _encode_all(tokenizer, [target for _, target in batch])
        yield from zip(contexts, targets, strict=True)


def score_lambada(
    model: torch.nn.Module,
    examples: Sequence[LambadaExample],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device = "cpu",
    progress: bool = False,
    desc: str | None = "lambada",
    ranks: Distributed = ONE_PROCESS,
) -> LambadaSums:
    """Teacher-forced scores of the target words; passages are right-padded per batch.

    Right padding cannot change a causal model's logits at the real positions, so the result
    does not depend on `batch_size`. `ranks` as for `score_tokens`.
    """
    sums = LambadaSums()

    def measure(first: int) -> list[tuple[float, int, int]]:
        """(nll, hits, target tokens) of each passage of the batch that starts at `first`."""
        chunk = examples[first : first + batch_size]
        width = max(len(ex.ids) for ex in chunk)
        rows = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, ex in enumerate(chunk):
            rows[i, : len(ex.ids)] = torch.tensor(ex.ids)
        rows = rows.to(device)
        logits = logits_of(model, rows[:, :-1])
        found = []
        for i, ex in enumerate(chunk):
            end = len(ex.ids) - 1  # input positions end - num_target .. end - 1 predict the target
            pred = logits[i, end - ex.num_target : end].float()
            target = rows[i, end - ex.num_target + 1 : end + 1]
            hits = int((pred.argmax(-1) == target).sum())
            found.append((float(F.cross_entropy(pred, target, reduction="sum")), hits, ex.num_target))
        bar.update(sum(ex.num_target for ex in chunk))
        return found

    def add(found: list[tuple[float, int, int]]) -> None:
        for nll, hits, num_target in found:  # passage by passage, as one process adds them
            sums.nll += nll
            sums.correct += hits
            sums.count += num_target
            sums.words_correct += int(hits == num_target)
            sums.examples += 1

    total = sum(ex.num_target for ex in examples)
    with torch.inference_mode(), _token_bar(total, desc, progress and ranks.is_main) as bar:
        run_sharded(range(0, len(examples), batch_size), measure, add, ranks)
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
