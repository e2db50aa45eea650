"""The windows `sampling.sample_sequences` chooses, read on demand from a corpus already
tokenised (a shard store's memory maps) instead of held in memory.

`sample_sequences` tokenises the corpus as it goes and keeps the chosen windows' ids; for a
sample of millions of windows (tune-lens trains on every window it draws) that is the whole
sample in memory: 8 bytes a token as tensors, several times more while the reservoir holds
Python lists. The reservoir's choice depends only on the seed, the number of windows asked for
and the number in the stream (`sampling.chosen_windows`), so the same windows can be named by
their index alone: `store_sample` keeps the chosen indices (8 bytes a window) and a
`TokenWindows` reads each window from the ids when it is used. Same corpus, tokenizer, seed,
`seq_len` and BOS policy: the same windows, in the same order, with the same rule text.

`corpus_store` tokenises a corpus into a shard store in the cache once (`shards.write_shards`,
keyed by the corpus's and the tokenizer's fingerprints) and reuses it after; the store holds
the same ids as the sampling rule's token stream (every document without special tokens, eos
after each).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, overload

import numpy as np
import torch

from resstream.data.sampling import (
    SequenceSample,
    check_available,
    check_sample_request,
    chosen_windows,
    sample_rule,
    window_content,
)
from resstream.data.tokens import TokenIds

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from resstream.data.sources import CorpusStream

#: The cache folder (under the cache root) that holds the stores `corpus_store` writes.
STORES_DIR = "corpus-stores"
#: Ids read at once by `TokenWindows.largest_id` (bounds its temporary arrays).
_SCAN_IDS = 1 << 24


class TokenWindows(Sequence[torch.Tensor]):
    """Windows of `content` consecutive ids of `ids` (window i: ids[i·content, (i+1)·content)),
    those named by `indices`, in that order, each a 1-D int64 tensor with `prefix` (a BOS id,
    or nothing) before it. Slicing and `take` give other views without reading anything."""

    def __init__(
        self, ids: TokenIds, indices: np.ndarray, content: int, prefix: tuple[int, ...] = ()
    ) -> None:
        self.ids = ids
        self.indices = np.asarray(indices, dtype=np.int64)
        self.content = content
        self.prefix = prefix

    @property
    def window_length(self) -> int:
        """Tokens in each window (the prefix included)."""
        return self.content + len(self.prefix)

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, index: int) -> torch.Tensor: ...

    @overload
    def __getitem__(self, index: slice) -> TokenWindows: ...

    def __getitem__(self, index: int | slice) -> torch.Tensor | TokenWindows:
        if isinstance(index, slice):
            return TokenWindows(self.ids, self.indices[index], self.content, self.prefix)
        start = int(self.indices[index]) * self.content
        window = np.asarray(self.ids[start : start + self.content]).astype(np.int64)
        if self.prefix:
            window = np.concatenate([np.asarray(self.prefix, dtype=np.int64), window])
        return torch.from_numpy(window)

    def take(self, order: Sequence[int]) -> TokenWindows:
        """The windows at positions `order` of this sequence, in that order."""
        return TokenWindows(
            self.ids, self.indices[np.asarray(order, dtype=np.int64)], self.content, self.prefix
        )

    def largest_id(self) -> int:
        """The largest id in any of the windows (the prefix included), read a block of the ids
        at a time."""
        largest = max(self.prefix, default=-1)
        wanted = np.unique(self.indices)
        per_block = max(1, _SCAN_IDS // self.content)
        for first in range(0, int(wanted[-1]) + 1 if len(wanted) else 0, per_block):
            rows = wanted[(wanted >= first) & (wanted < first + per_block)] - first
            if len(rows):
                block = np.asarray(self.ids[first * self.content : (first + per_block) * self.content])
                windows = block[: (len(block) // self.content) * self.content].reshape(-1, self.content)
                largest = max(largest, int(windows[rows].max()))
        return largest


def store_sample(
    ids: TokenIds,
    *,
    num_seqs: int,
    seq_len: int,
    seed: int = 0,
    bos_id: int | None = None,
    corpus_name: str = "corpus",
) -> SequenceSample:
    """The sample `sample_sequences` draws from the corpus whose token stream is `ids` (with
    `bos_id` prepended to each window when the BOS policy prepends one; None: no BOS), as
    `TokenWindows` read on demand."""
    check_sample_request(num_seqs, seq_len)
    add_bos = bos_id is not None
    content = window_content(seq_len, add_bos)
    available = len(ids) // content
    check_available(available, num_seqs, seq_len, corpus_name)
    indices = np.asarray(chosen_windows(available, num_seqs, seed), dtype=np.int64)
    prefix = (bos_id,) if bos_id is not None else ()
    windows = TokenWindows(ids, indices, content, prefix)
    return SequenceSample(
        windows, sample_rule(num_seqs, available, content, corpus_name, seed, add_bos), add_bos, available
    )


def store_key(corpus: dict[str, str | None], tokenizer: dict[str, str | None]) -> str:
    """The name (16 hex) of the cached store of a corpus tokenised by a tokenizer, from what a
    store records of each (`write_shards` reuses a store only for the same name, origin and
    fingerprint of the corpus and the same tokenizer)."""
    key = json.dumps({"corpus": corpus, "tokenizer": tokenizer}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def corpus_store(
    corpus: CorpusStream,
    tokenizer: PreTrainedTokenizerFast,
    cache_dir: str | os.PathLike[str],
    *,
    workers: int | None = None,
    progress: bool = False,
) -> Path:
    """The shard store of `corpus` tokenised by `tokenizer` in `cache_dir` (written on first
    use by `workers` processes, reused after; an interrupted one is resumed)."""
    from resstream.data.shards import write_shards
    from resstream.data.tokenizer import tokenizer_fingerprint

    fingerprint = corpus.fingerprint or corpus.scan()
    described: dict[str, str | None] = {
        "name": corpus.name,
        "origin": corpus.origin,
        "fingerprint": fingerprint,
    }
    name = str(getattr(tokenizer, "name_or_path", "") or "") or None
    key = store_key(described, {"name": name, "fingerprint": tokenizer_fingerprint(tokenizer)})
    directory = Path(cache_dir) / STORES_DIR / key
    directory.parent.mkdir(parents=True, exist_ok=True)
    write_shards(corpus, tokenizer, directory, workers=workers, progress=progress)
    return directory


__all__ = ["STORES_DIR", "TokenWindows", "corpus_store", "store_key", "store_sample"]
