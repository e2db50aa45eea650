"""Where tune-lens's windows come from, and how the ranks of a torchrun job share its work.

Windows: the corpus is tokenised once into a shard store in the cache (`RESSTREAM_CACHE`,
`data.store_windows.corpus_store`) and the sample is the windows the sampling rule chooses,
named by index and read from the store's memory maps when a step or the evaluation uses them
(`data.store_windows.store_sample`): the same windows as the in-memory sample for the same
seed, without holding them. Under torchrun rank 0 writes the store while the others wait, and
every rank maps it.

Ranks (`Ranks`): every rank takes its contiguous share of each step's windows (`share`); the
gradients and the step's KL sums are all-reduced (summed) before the optimiser steps, so
every rank makes the update one process makes (to float rounding: the sums are reordered).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.distributed as dist

from resstream.data.sampling import SequenceSample, prepends_bos
from resstream.distributed import Distributed, joined, on_main_first
from resstream.io import cache_root

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from resstream.api.inputs import CorpusRequest, Sampler
    from resstream.data import CorpusStream

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place in a tune-lens run: rank `rank` of `world` (0 of 1 run directly)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def of(cls, info: Distributed) -> Ranks:
        return cls(info.rank, info.world)

    @property
    def place(self) -> Distributed:
        """The same place as `resstream.distributed` names it."""
        return Distributed(self.rank, self.world)

    @property
    def is_main(self) -> bool:
        """Whether this rank writes (checkpoints, the lens) and speaks (progress, notices)."""
        return self.rank == 0

    def share(self, windows: Sequence[T]) -> Sequence[T]:
        """This rank's contiguous share of `windows` (the first ranks take one more when they
        do not divide evenly)."""
        count = len(windows)
        return windows[self.rank * count // self.world : (self.rank + 1) * count // self.world]

    def sum(self, tensors: Sequence[torch.Tensor]) -> None:
        """Sum each tensor over the ranks, in place (nothing run directly)."""
        if self.world == 1:
            return
        for tensor in tensors:
            dist.all_reduce(tensor)


def ranks(device: str | torch.device) -> Ranks:
    """This process's `Ranks`, the process group joined under torchrun (NCCL for CUDA, else gloo)."""
    return Ranks.of(joined(device))


def store_sampler(info: Ranks, data_dir: str | os.PathLike[str] | None, progress: bool) -> Sampler:
    """The `each_model` sampler of tune-lens: the sample's windows read from the corpus's shard
    store (module docstring), the store written by rank 0 on first use."""
    from resstream.data import default_split, stream_corpus
    from resstream.data.shards import ShardedTokens
    from resstream.data.store_windows import corpus_store, store_sample

    cache = cache_root()

    def sample(
        corpus: CorpusRequest,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        stream: CorpusStream | None,
    ) -> tuple[SequenceSample, str | None]:
        opened = stream or stream_corpus(
            corpus.dataset, split=default_split(corpus.dataset), data_dir=corpus.data_dir
        )

        def write() -> tuple[Path, str | None]:
            directory = corpus_store(opened, tokenizer, cache, progress=progress)  # type: ignore[arg-type]
            return directory, opened.fingerprint

        directory, fingerprint = on_main_first(write, info.place)
        ids = ShardedTokens.open(directory, cache_dir=cache, rank=info.rank, world=info.world)
        bos = tokenizer.bos_token_id if prepends_bos(tokenizer, "auto") else None
        seq_len = corpus.default_seq_len if corpus.seq_len is None else corpus.seq_len
        windows = store_sample(
            ids,
            num_seqs=corpus.num_seqs,
            seq_len=seq_len,
            seed=corpus.seed,
            bos_id=bos,
            corpus_name=corpus.dataset,
        )
        return windows, fingerprint

    return sample


__all__ = ["Ranks", "ranks", "store_sampler"]
