"""tune-lens's windows: peak memory of drawing and using them in memory (the sampling rule's
`sample_sequences`) against reading them from the corpus's shard store (`store_sample`).

    python benchmarks/bench_lens_windows.py --megabytes 16        # both ways, one process each

Each way runs in a fresh process (`--way memory|store`) on the same corpus (the FineWeb-Edu
sample made `--megabytes`, as bench_shards.py makes it, GPT-2 tokenizer), draws every window
but 32 of 128 tokens, splits them as tune-lens does and reads each once (what the steps do);
it prints the windows, the seconds and the peak resident memory (VmHWM) of the process, and of
the store's tokenising workers (RUSAGE_CHILDREN). The store is written into a fresh cache.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import status_kib

SEQ_LEN = 128


def one_way(way: str, corpus: Path, cache: Path, data_dir: Path) -> None:
    import torch

    from resstream.data import load_tokenizer, stream_corpus
    from resstream.data.sampling import sample_sequences
    from resstream.data.shards import ShardedTokens
    from resstream.data.store_windows import corpus_store, store_sample

    tokenizer = load_tokenizer("gpt2", data_dir=data_dir)
    started = time.perf_counter()
    if way == "memory":
        windows = sample_sequences(
            stream_corpus(str(corpus)),
            tokenizer,
            num_seqs=int(os.environ["BENCH_WINDOWS"]),
            seq_len=SEQ_LEN,
            seed=0,
            bos="never",
        ).sequences
    else:
        store = corpus_store(stream_corpus(str(corpus)), tokenizer, cache)
        ids = ShardedTokens.open(store, cache_dir=cache)
        windows = store_sample(
            ids, num_seqs=int(os.environ["BENCH_WINDOWS"]), seq_len=SEQ_LEN, seed=0
        ).sequences
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(0)).tolist()
    chosen = windows.take(order) if hasattr(windows, "take") else [windows[i] for i in order]
    total = sum(int(w[-1]) for w in chosen)  # every window read once, as the steps read them
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    peak = status_kib("VmHWM") / 1024
    print(
        f"{way}: {len(chosen):,} windows of {SEQ_LEN} tokens, {time.perf_counter() - started:.1f} s, "
        f"peak RSS {peak:,.0f} MB (tokenising workers' peak {children:,.0f} MB) [{total % 7}]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=16)
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("RESSTREAM_DATA", "data")))
    parser.add_argument("--way", choices=("memory", "store"))
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--cache", type=Path)
    args = parser.parse_args()
    if args.way:
        one_way(args.way, args.corpus, args.cache, args.data_dir)
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_shards import corpus_file
    from resstream.data import load_tokenizer, stream_corpus
    from resstream.data.store_windows import corpus_store

    with tempfile.TemporaryDirectory() as tmp:
        corpus = corpus_file(Path(tmp), args.megabytes, args.data_dir)
        counting = Path(tmp) / "count"
        store = corpus_store(
            stream_corpus(str(corpus)), load_tokenizer("gpt2", data_dir=args.data_dir), counting
        )
        tokens = sum(entry.stat().st_size for entry in store.glob("shard-*.bin")) // 2
        windows = tokens // SEQ_LEN - 32
        print(f"corpus: {args.megabytes} MB of text, {tokens:,} GPT-2 tokens; {windows:,} windows drawn")
        env = {**os.environ, "BENCH_WINDOWS": str(windows)}
        for way in ("memory", "store"):
            cache = Path(tmp) / f"cache-{way}"
            cmd = [sys.executable, __file__, "--way", way, "--corpus", str(corpus), "--cache", str(cache)]
            subprocess.run([*cmd, "--data-dir", str(args.data_dir)], env=env, check=True)


if __name__ == "__main__":
    main()
