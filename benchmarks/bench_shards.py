"""The sharded token store: tokenising speed by worker count, and batch-reading speed against
the single-file cache, side by side in one run.

    python benchmarks/bench_shards.py                 # the local FineWeb-Edu sample, made 8 MB
    python benchmarks/bench_shards.py --megabytes 32 --workers 1 2 4

Tokenising: `write_shards` of the same text with each worker count (GPT-2 tokenizer), tokens/s
and the ratio to 1 worker. Reading: `micro_batch` of the same steps (batch 16 x 1024 tokens)
from the store's memory maps and from the single-file cache's, in interleaved rounds; the
median time per batch and the ratio store / cache. Absolute times are noise on shared
machines: read the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from functools import partial
from pathlib import Path

from harness import rounds_of, seconds
from resstream.data import build_token_cache, load_tokenizer, stream_corpus
from resstream.data.shards import ShardedTokens, write_shards
from resstream.training.data import micro_batch

SAMPLE = "fineweb-edu/fineweb-edu_sample-10BT_first1Mchars.txt"


def corpus_file(directory: Path, megabytes: int, data_dir: Path) -> Path:
    """The FineWeb-Edu sample repeated to `megabytes`, each copy's vowels rotated so that the
    copies tokenise differently; one document per line."""
    text = (data_dir / SAMPLE).read_text(encoding="utf-8")
    path = directory / "corpus.jsonl"
    import json

    with path.open("w", encoding="utf-8") as handle:
        copy = 0
        while handle.tell() < megabytes * 2**20:
            table = str.maketrans("aeiou", "aeiou"[copy % 5 :] + "aeiou"[: copy % 5])
            for line in text.translate(table).splitlines():
                if line.strip():
                    handle.write(json.dumps({"text": line}) + "\n")
            copy += 1
    return path


def bench_tokenising(corpus: Path, tokenizer, workers: list[int], work: Path) -> dict[int, float]:
    rates = {}
    for count in workers:
        summary = write_shards(
            stream_corpus(str(corpus)), tokenizer, work / f"w{count}", shard_tokens=1_000_000, workers=count
        )
        rates[count] = summary.tokens_per_s
        print(
            f"tokenise, {count} worker(s): {summary.tokens:,} tokens in {summary.seconds:.1f} s, "
            f"{summary.tokens_per_s:,.0f} tokens/s, x{summary.tokens_per_s / rates[workers[0]]:.2f}"
        )
    return rates


def bench_reading(store: Path, cache_train, rounds: int, steps: int) -> None:
    train, _ = ShardedTokens.open(store).split(0.1)
    assert len(train) == len(cache_train)
    sources = {"store": train, "cache": cache_train}
    first_step = dict.fromkeys(sources, 0)  # each source reads the same steps, round by round

    def read(name: str) -> float:
        first, first_step[name] = first_step[name], first_step[name] + steps
        batch = partial(micro_batch, sources[name], 1024, 16, seed=0, micro=0, grad_accum=1)
        return seconds(lambda: [batch(step=s) for s in range(first, first + steps)]) / steps

    times = rounds_of({name: partial(read, name) for name in sources}, rounds)
    store_s, cache_s = statistics.median(times["store"]), statistics.median(times["cache"])
    print(
        f"read a 16 x 1024 batch: store {store_s * 1e3:.2f} ms, cache {cache_s * 1e3:.2f} ms, "
        f"store / cache x{store_s / cache_s:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    data_dir = Path(os.environ.get("RESSTREAM_DATA", "data"))
    tokenizer = load_tokenizer("gpt2", data_dir=data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = corpus_file(work, args.megabytes, data_dir)
        print(f"corpus: {corpus.stat().st_size / 2**20:.1f} MB of FineWeb-Edu text, {os.cpu_count()} CPUs")
        bench_tokenising(corpus, tokenizer, args.workers, work)
        cache = build_token_cache(stream_corpus(str(corpus)), tokenizer, work / "cache")
        bench_reading(work / f"w{args.workers[0]}", cache.train, args.rounds, args.steps)


if __name__ == "__main__":
    main()
