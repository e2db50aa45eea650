"""Seeded samples of N token sequences of length T for corpus-level analysis.

Rule (documented for users in docs/metrics.md):

1. Documents are tokenised one at a time, in corpus order, without special tokens, and
   concatenated with the tokenizer's eos id after each document (when it has one) — the same
   stream the trainer builds. Files are streamed (`stream_corpus`): a large text file is read
   and tokenised in pieces, so the corpus is never held in memory whole.
2. The stream is cut into consecutive, non-overlapping windows of `T − b` tokens, where b = 1
   when a BOS token is prepended and 0 otherwise; a final partial window is dropped.
3. N windows are chosen uniformly at random without replacement by reservoir sampling
   (Algorithm R, `random.Random(seed)`), in one pass over the stream with memory for N windows
   only; the chosen windows are returned in stream order.
4. BOS policy (`bos`): `auto` prepends the tokenizer's BOS id when the tokenizer itself adds one to
   encoded text (Llama, Gemma, Mistral do; GPT-2 and resstream's BPE do not); `always` prepends it
   whenever the tokenizer has one; `never` does not.

A `.jsonl` file whose rows all carry `input_ids` is used exactly as given: one sequence per
row, no re-tokenisation, no BOS, no sampling (`sample_token_rows`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from resstream.checks import check_sample_request
from resstream.data.files import tokenizer_pieces
from resstream.errors import UsageError

BosPolicy = Literal["auto", "always", "never"]
T = TypeVar("T")


class CorpusTooSmall(UsageError):
    """A corpus holding fewer windows than asked for; `available` says how many it has."""

    def __init__(self, message: str, available: int) -> None:
        super().__init__(message)
        self.available = available

    def __reduce__(self) -> tuple[type[CorpusTooSmall], tuple[str, int]]:
        """Pickled whole (the ranks of a torchrun job send each other their failures)."""
        return type(self), (str(self), self.available)


@dataclass(frozen=True)
class SequenceSample:
    """Token sequences for analysis, with how they were obtained."""

    sequences: Sequence[torch.Tensor]  # 1-D int64 tensors (a tuple, or windows read on demand)
    rule: str  # a one-line description of how they were chosen
    bos_prepended: bool
    windows_available: int | None  # windows in the stream (None for pinned rows)

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.sequences)


def prepends_bos(tokenizer: Any, policy: BosPolicy) -> bool:
    """Whether sequences start with the tokenizer's BOS id under `policy`."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if policy == "never" or bos is None:
        return False
    if policy == "always":
        return True
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == bos


def token_stream(documents: Iterable[str | Iterable[str]], tokenizer: Any) -> Iterator[int]:
    """Token ids of the documents, one document at a time, eos after each (if any).

    A document is a string, or an iterable of consecutive pieces of one (a streamed file,
    see `resstream.data.sources.CorpusStream`), tokenised in pieces of at most
    `TOKENIZER_PIECE_CHARS` characters cut between pre-tokens (`split_text`), so that a long
    line costs the memory of one piece.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    for document in documents:
        for piece in tokenizer_pieces(document):
            yield from tokenizer(piece, add_special_tokens=False)["input_ids"]
        if eos is not None:
            yield eos


def windows(stream: Iterable[int], length: int) -> Iterator[list[int]]:
    """Consecutive non-overlapping windows of `length` ids; a final partial one is dropped."""
    window: list[int] = []
    for token in stream:
        window.append(token)
        if len(window) == length:
            yield window
            window = []


def reservoir(items: Iterable[T], count: int, seed: int) -> tuple[list[tuple[int, T]], int]:
    """`count` items chosen uniformly without replacement (Algorithm R), with their indices,
    and the number of items seen. Which indices are chosen depends on `seed`, `count` and the
    number of items alone, never on the items (`chosen_windows`)."""
    rng = random.Random(seed)
    chosen: list[tuple[int, T]] = []
    seen = 0
    for index, item in enumerate(items):
        seen = index + 1
        if index < count:
            chosen.append((index, item))
        else:
            slot = rng.randrange(seen)
            if slot < count:
                chosen[slot] = (index, item)
    return sorted(chosen), seen


def sample_sequences(
    documents: Iterable[str | Iterable[str]],
    tokenizer: Any,
    *,
    num_seqs: int,
    seq_len: int,
    seed: int = 0,
    bos: BosPolicy = "auto",
    corpus_name: str = "corpus",
) -> SequenceSample:
    """Choose `num_seqs` windows of `seq_len` tokens from the documents' token stream."""
    check_sample_request(num_seqs, seq_len)
    add_bos = prepends_bos(tokenizer, bos)
    content = window_content(seq_len, add_bos)
    chosen, available = reservoir(windows(token_stream(documents, tokenizer), content), num_seqs, seed)
    check_available(available, num_seqs, seq_len, corpus_name)
    prefix = [tokenizer.bos_token_id] if add_bos else []
    sequences = tuple(torch.tensor(prefix + window, dtype=torch.long) for _, window in chosen)
    return SequenceSample(
        sequences, sample_rule(num_seqs, available, content, corpus_name, seed, add_bos), add_bos, available
    )


def window_content(seq_len: int, add_bos: bool) -> int:
    """The corpus tokens in each window of `seq_len` (one fewer when a BOS is prepended);
    UsageError when fewer than two are left."""
    content = seq_len - int(add_bos)
    if content < 2:
        raise UsageError(f"`seq_len` {seq_len} is too short: at least {2 + int(add_bos)} tokens are needed")
    return content


def chosen_windows(available: int, num_seqs: int, seed: int) -> list[int]:
    """The indices (ascending) of the `num_seqs` windows of `available` that `sample_sequences`
    chooses with `seed`: the reservoir's choice needs the number of windows only, so a corpus
    already tokenised (a shard store) gives the same windows without holding any of them."""
    chosen, _ = reservoir(range(available), num_seqs, seed)
    return [index for index, _ in chosen]


def check_available(available: int, num_seqs: int, seq_len: int, corpus_name: str) -> None:
    """`CorpusTooSmall` when the corpus has fewer than `num_seqs` windows."""
    if available < num_seqs:
        raise CorpusTooSmall(
            f"`num_seqs` {num_seqs} is more than {corpus_name!r} holds: it has {available} "
            f"non-overlapping sequences of {seq_len} tokens",
            available,
        )


def sample_rule(
    num_seqs: int, available: int, content: int, corpus_name: str, seed: int, add_bos: bool
) -> str:
    """The one-line account of a sample (`SequenceSample.rule`)."""
    return (
        f"{num_seqs} of {available} non-overlapping {content}-token windows of {corpus_name!r}, "
        f"reservoir-sampled with seed {seed}" + ("; BOS prepended" if add_bos else "; no BOS")
    )


def sample_token_rows(rows: list[list[int]], *, source: str, vocab_size: int) -> SequenceSample:
    """Pinned sequences from a `.jsonl` with `input_ids`: exactly as given, one per row.

    Every row needs at least 2 ids, each inside the model's vocabulary of `vocab_size`
    (checked on the integers as read, before they become tensors).
    """
    for number, row in enumerate(rows, start=1):
        if len(row) < 2:
            raise UsageError(f"{source!r}: row {number} has fewer than 2 input_ids (nothing to score)")
        check_vocabulary(max(row), vocab_size, f"row {number} of {source!r}")
    sequences = tuple(torch.tensor(row, dtype=torch.long) for row in rows)
    return SequenceSample(
        sequences,
        f"{len(rows)} row{'s' if len(rows) != 1 else ''} of {source!r} used exactly as given",
        False,
        None,
    )


def check_vocabulary(token: int, vocab_size: int, where: str) -> None:
    """UsageError when `token` (the largest id of a sequence) is not an id of a vocabulary of
    `vocab_size` tokens; `where` names the sequence ("row 2 of 'rows.jsonl'")."""
    if token >= vocab_size:
        raise UsageError(
            f"{where} holds token id {token}, outside the model's vocabulary of {vocab_size} "
            f"(allowed: 0..{vocab_size - 1})"
        )
