"""Reading a complete shard store: `ShardedTokens`, a 1-D, read-only, sliceable view over the
shards' memory maps, and `store_splits`, the store split for training.

`ShardedTokens.open` (and so `store_splits`, which training uses) checks every shard's size
and, by default, its sha256 (`verification.verify_shards`, cached in the cache directory), then
maps each shard from the very file that was checked. The store is split into training and
validation parts by `tokens.split_tokens`'s rule.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from resstream.data.shards.manifest import read_manifest, stored_corpus
from resstream.data.shards.verification import opened_shards, verify_shards
from resstream.data.tokens import TokenSplits, split_point


class ShardedTokens:
    """A 1-D, read-only run of a store's ids, read through one `np.memmap` per shard.

    `len()` is its number of ids. Slicing (step 1) gives another `ShardedTokens` without
    reading anything, as slicing a memory map does; an integer index gives one id;
    `np.asarray(view)` reads the ids of the view (crossing shard boundaries as needed). So
    the trainer's `windows` reads only the windows it stacks, and `split` splits a store
    without copying it.
    """

    def __init__(self, maps: Sequence[np.ndarray], start: int = 0, stop: int | None = None) -> None:
        self._maps = maps
        self._offsets = [0, *itertools.accumulate(len(m) for m in maps)]  # first id of each shard
        self._start = start
        self._stop = self._offsets[-1] if stop is None else stop
        self.dtype = maps[0].dtype if maps else np.dtype(np.uint16)

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        verify: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        rank: int = 0,
        world: int = 1,
    ) -> ShardedTokens:
        """The ids of the complete store in `directory`: UsageError for an incomplete store or
        one whose shards do not match its manifest (`check_shard_files`; with `verify`, the
        default, their sha256 too, `verify_shards`, cached in `cache_dir` when given). Each
        shard is mapped from the very file that was checked."""
        directory = Path(directory)
        stored_corpus(directory)  # complete
        manifest = read_manifest(directory)
        dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
        with opened_shards(directory, manifest) as shards:
            if verify:
                verify_shards(directory, manifest, shards, cache_dir=cache_dir, rank=rank, world=world)
            maps = [
                np.memmap(handle, dtype=dtype, mode="r", shape=(entry["tokens"],))
                for (handle, _), entry in zip(shards, manifest["shards"], strict=True)
                if entry["tokens"]
            ]
        return cls(maps)

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def ndim(self) -> int:
        return 1

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, index: slice) -> ShardedTokens: ...

    @overload
    def __getitem__(self, index: int) -> Any: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("a ShardedTokens slice must have step 1")
            return ShardedTokens(self._maps, self._start + start, self._start + max(start, stop))
        position = int(index) + (len(self) if int(index) < 0 else 0)
        if not 0 <= position < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} ids")
        shard = bisect.bisect_right(self._offsets, self._start + position) - 1
        return self._maps[shard][self._start + position - self._offsets[shard]]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        first = bisect.bisect_right(self._offsets, self._start) - 1
        parts = []
        for shard in range(max(first, 0), len(self._maps)):
            lo, hi = self._offsets[shard], self._offsets[shard + 1]
            if lo >= self._stop:
                break
            parts.append(self._maps[shard][max(self._start, lo) - lo : min(self._stop, hi) - lo])
        ids = np.concatenate(parts) if len(parts) != 1 else np.array(parts[0])
        ids = ids if parts else np.zeros(0, dtype=self.dtype)
        return ids.astype(dtype, copy=False) if dtype is not None else ids

    def split(self, val_fraction: float) -> tuple[ShardedTokens, ShardedTokens]:
        """(train, val) by `split_tokens`'s rule: val is the last floor(len * val_fraction) ids."""
        cut = split_point(len(self), val_fraction)
        return self[:cut], self[cut:]


def store_splits(
    directory: str | os.PathLike[str],
    val_fraction: float,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    rank: int = 0,
    world: int = 1,
) -> TokenSplits:
    """The complete store in `directory` split as the single-file cache is, its shards
    verified against the manifest (size and sha256; the verifications cached in `cache_dir`,
    shared out between the `world` ranks of a torchrun job: `verify_shards`); the fingerprint
    is the store's."""
    tokens = ShardedTokens.open(directory, cache_dir=cache_dir, rank=rank, world=world)
    train, val = tokens.split(val_fraction)
    manifest = read_manifest(directory)
    return TokenSplits(
        train=train,
        val=val,
        fingerprint=manifest["fingerprint"],
        path=Path(directory),
        vocab_size=int(manifest["tokenizer"]["vocab_size"]),
    )
