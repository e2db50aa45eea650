"""What a sweep's evaluation and training spend before any model runs (issue 13).

    python benchmarks/bench_reproduce.py          # needs RESSTREAM_DATA; about a minute

A laptop reproduction trains 18 runs that share one corpus-trained BPE tokenizer and scores each
on five benchmarks capped at 20,000 tokens. Printed, from interleaved rounds in one run (absolute
times on a shared machine are noise; the ratios are the result):

1. preparing the five benchmarks for one run: tokenising every corpus whole, as `eval` did
   before (`tokenize_documents`, then the first 20,000 tokens kept), against
   `resstream.training.evaluate.plan.benchmark_tokens` as a sweep's second and later runs meet it (a
   prefix tokenised only as far as the cap needs; the shakespeare tail, which needs the whole
   stream, served from the stream kept by the first run);
2. a run's tokenizer: training the 2048-token BPE on the built-in corpus (`train_bpe`) against
   loading the one kept by the first run (`cached_bpe`).
"""

from __future__ import annotations

import statistics
import tempfile
from functools import partial

from harness import rounds_of, seconds
from resstream.data import split_tokens, stream_corpus, tokenize_documents
from resstream.data.tokenizer import cached_bpe, train_bpe
from resstream.training.evaluate import plan as ev
from resstream.training.evaluate.benchmarks import load_benchmark_corpus

BENCHMARKS = ("wikitext-2", "lambada", "openwebtext", "fineweb-edu", "shakespeare")
MAX_TOKENS = 20_000
ROUNDS = 3


def main() -> None:
    corpora = {name: load_benchmark_corpus(name, None) for name in BENCHMARKS}
    tokenizer = train_bpe(stream_corpus("shakespeare"), 2048)

    def whole_streams() -> None:
        for name, corpus in corpora.items():
            tokens = tokenize_documents(corpus.documents, tokenizer, progress=False)
            tokens = split_tokens(tokens, 0.1)[1] if name == "shakespeare" else tokens
            assert len(tokens[:MAX_TOKENS]) > 0

    def shared_streams() -> None:
        for name, corpus in corpora.items():
            if name == "shakespeare":
                tokens = split_tokens(ev.benchmark_tokens(corpus, tokenizer), 0.1)[1]
            else:
                tokens = ev.benchmark_tokens(corpus, tokenizer, limit=MAX_TOKENS)
            assert len(tokens[:MAX_TOKENS]) > 0

    ev._STREAMS.clear()
    shared_streams()  # the sweep's first run keeps the shakespeare stream
    with tempfile.TemporaryDirectory() as cache:
        cached_bpe(stream_corpus("shakespeare"), 2048, cache)  # the first run trains and keeps it
        measures = {
            "before": partial(seconds, whole_streams),
            "after": partial(seconds, shared_streams),
            "trained": partial(seconds, lambda: train_bpe(stream_corpus("shakespeare"), 2048)),
            "loaded": partial(seconds, lambda: cached_bpe(stream_corpus("shakespeare"), 2048, cache)),
        }
        times = rounds_of(measures, ROUNDS)
    before, after, trained, loaded = (times[name] for name in measures)
    med = statistics.median
    print(
        f"benchmarks prepared per run: whole corpora {med(before):.2f} s, prefix + kept stream "
        f"{med(after):.3f} s -> {med(before) / med(after):.0f}x"
    )
    print(
        f"run tokenizer: train_bpe {med(trained):.2f} s, kept BPE {med(loaded):.3f} s "
        f"-> {med(trained) / med(loaded):.0f}x"
    )
    print(f"(medians of {ROUNDS} interleaved rounds; {', '.join(BENCHMARKS)}; cap {MAX_TOKENS:,} tokens)")


if __name__ == "__main__":
    main()
