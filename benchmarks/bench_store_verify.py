"""What verifying a shard store costs: sha256 bytes/s, and opening a store for training the
first time (every shard hashed) against opening it again (every verification found in the
cache) and against not verifying at all, side by side in interleaved rounds.

    python benchmarks/bench_store_verify.py                  # a 1 GB store of 10 shards
    python benchmarks/bench_store_verify.py --megabytes 4096 --shards 40 --ranks 2

The store is synthetic (random uint16 ids written straight to its shards, with the manifest
`write_shards` would write for them): verifying never looks at what the ids mean, and
tokenising a gigabyte would take an hour. Its files are in the page cache (they were just
written), so "first open" measures hashing, not the disk; a store read cold from disk is
bounded by the disk as well (its first epoch reads every byte anyway). "ranks" opens the store
from that many processes at once with one shared cache, as the ranks of a torchrun job do:
the wall time and how many shards were hashed in all (ideally each once).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

from harness import seconds, timed
from resstream.data.shards import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    ShardedTokens,
    shard_name,
    store_fingerprint,
    verification,
)
from resstream.io import write_json


def synthetic_store(directory: Path, megabytes: int, count: int) -> int:
    """A complete store of `count` shards of random uint16 ids, `megabytes` in all; its bytes."""
    rng = np.random.default_rng(0)
    per_shard = megabytes * 2**20 // 2 // count
    entries = []
    for index in range(count):
        ids = rng.integers(0, 50257, per_shard, dtype=np.uint16)
        (directory / shard_name(index)).write_bytes(ids.tobytes())
        digest = hashlib.sha256(ids.tobytes()).hexdigest()[:16]
        entries.append({"file": shard_name(index), "tokens": per_shard, "sha256": digest})
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "dtype": "uint16",
        "shard_tokens": per_shard,
        "tokenizer": {"name": "gpt2", "fingerprint": "0" * 16, "vocab_size": 50257, "eos_token_id": 50256},
        "corpus": {"name": "random", "origin": "bench", "fingerprint": "1" * 16, "documents": 1},
        "shards": entries,
        "complete": True,
        "total_tokens": per_shard * count,
    }
    manifest["fingerprint"] = store_fingerprint(manifest)
    write_json(directory / MANIFEST, manifest)
    return per_shard * 2 * count


def sha256_rate(megabytes: int = 256) -> float:
    """sha256 of bytes in memory, bytes/s (the best of 3)."""
    data = np.random.default_rng(1).integers(0, 256, megabytes * 2**20, dtype=np.uint8).tobytes()
    return len(data) / min(seconds(partial(hashlib.sha256, data)) for _ in range(3))


def _open_as_rank(store: Path, cache: Path, rank: int, ranks: int) -> int:
    """Open `store` as rank `rank` of `ranks` (in a process of its own): the shards it hashed."""
    hashed: list[int] = []
    real = verification.shard_digest

    def counting(handle):
        hashed.append(1)
        return real(handle)

    verification.shard_digest = counting
    ShardedTokens.open(store, cache_dir=cache, rank=rank, world=ranks)
    return len(hashed)


def open_by_ranks(store: Path, cache: Path, ranks: int) -> tuple[float, int]:
    """Open `store` from `ranks` processes at once, sharing `cache`, as the ranks of a torchrun
    job do: (wall seconds, shards hashed in all)."""
    context = multiprocessing.get_context("fork")
    with context.Pool(ranks) as pool:
        pool.map(abs, range(ranks))  # the processes started before the clock does
        wall, hashed = timed(
            partial(pool.starmap, _open_as_rank, [(store, cache, rank, ranks) for rank in range(ranks)])
        )
        return wall, sum(hashed)


def bench(store: Path, size: int, rounds: int, ranks: int, work: Path) -> None:
    times: dict[str, list[float]] = {"first": [], "cached": [], "sizes only": [], "ranks": []}
    hashed_by_ranks = []
    for r in range(rounds):
        cache = work / f"cache-{r}"
        times["first"].append(seconds(partial(ShardedTokens.open, store, cache_dir=cache)))
        times["cached"].append(seconds(partial(ShardedTokens.open, store, cache_dir=cache)))
        times["sizes only"].append(seconds(partial(ShardedTokens.open, store, verify=False)))
        wall, hashed = open_by_ranks(store, work / f"ranks-{r}", ranks)
        times["ranks"].append(wall)
        hashed_by_ranks.append(hashed)
    first, cached, plain = (statistics.median(times[k]) for k in ("first", "cached", "sizes only"))
    print(f"first open (every shard hashed): {first:.3f} s, {size / first / 1e9:.2f} GB/s")
    print(f"cached open:                     {cached * 1e3:.2f} ms ({first / cached:,.0f}x faster)")
    print(f"open without verifying:          {plain * 1e3:.2f} ms")
    wall = statistics.median(times["ranks"])
    print(
        f"first open by {ranks} ranks at once, one cache: {wall:.3f} s wall ({first / wall:.2f}x the "
        f"one-rank speed), {statistics.median(hashed_by_ranks):.0f} shard hashes in all"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "store").mkdir()
        size = synthetic_store(work / "store", args.megabytes, args.shards)
        time.sleep(verification.SETTLED_NS / 1e9)  # a file changed within this is verified but not cached
        rate = sha256_rate()
        print(f"store: {size / 1e9:.2f} GB in {args.shards} shards; sha256 in memory {rate / 1e9:.2f} GB/s")
        bench(work / "store", size, args.rounds, args.ranks, work)


if __name__ == "__main__":
    main()
