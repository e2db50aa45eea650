"""Bounded memory for any corpus size (issue 9, item 4).

BPE training, the token cache and corpus sampling read a streamed corpus and hand the Rust
tokenizer pieces of at most `TOKENIZER_PIECE_CHARS` characters, so their peak memory does not
grow with the corpus or with its longest line (before: 10 MB of text needed 1.4 GB, 50 MB
died at ~10 GB; a 50 MB single line in `shift` reached 7.5 GB). Each case runs in a child
process under an address-space limit, so that a regression fails the test instead of taking
the machine down, and reports its peak RSS above what its imports take.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import resource
import string
import subprocess
import sys
from pathlib import Path

import pytest

#: Peak RSS a child may add to its imports, whatever the corpus size (measured: 45, 51, 53 and
#: 58 MB for 2, 5, 10 and 50 MB of text; before the fix 2 MB took 290 MB, 50 MB about 9 GB).
GROWTH_LIMIT_MB = 150
#: The child's address-space limit: the safety net (measured peak: about 420 MB).
ADDRESS_SPACE_BYTES = 3 * 2**30

CHILD = r"""
import json, resource, sys, tempfile

from resstream.data import build_token_cache, stream_corpus, train_bpe
from resstream.data.sampling import sample_sequences

train_bpe(["warm up the tokenizer libraries " * 50], 300)  # imports and thread pools
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
stream = stream_corpus(sys.argv[1])
stream.scan()  # what `resstream train --tokenizer bpe` does with a corpus
bpe = train_bpe(stream, 1000)
splits = build_token_cache(stream, bpe, tempfile.mkdtemp())
sample = sample_sequences(stream, bpe, num_seqs=8, seq_len=64, seed=0)  # what `shift` does
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tokens = len(splits.train) + len(splits.val)
print(json.dumps({"growth_mb": (peak - base) / 1024, "tokens": tokens, "windows": sample.windows_available}))
"""


def write_corpus(path: Path, megabytes: float) -> None:
    """Made-up words with Zipf-like frequencies: half in lines of 12 words, half on one line."""
    rng = random.Random(0)
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(5000)]
    weights = list(itertools.accumulate(1 / rank for rank in range(1, len(vocabulary) + 1)))
    with path.open("w", encoding="utf-8") as handle:
        written = 0
        while written < megabytes * 2**20:
            end = ".\n" if written < megabytes * 2**19 else ". "
            block = "".join(
                " ".join(rng.choices(vocabulary, cum_weights=weights, k=12)) + end for _ in range(2000)
            )
            handle.write(block)
            written += len(block)


LENS_CHILD = r"""
import json, resource, sys

import resstream
from resstream.errors import UsageError

resstream.lens("warm up the model loading")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    resstream.lens(text_file=sys.argv[1])
except UsageError as exc:
    message = str(exc)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_mb": (peak - base) / 1024, "message": message}))
"""


def run_child(corpus: Path, script: str = CHILD) -> dict:
    """Run `script` on `corpus` in a child process under the address-space limit (by default:
    train a BPE on it, build its token cache and sample it); the child's report."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))

    # a fixed number of threads and malloc arenas, so the address space does not grow with the cores
    env = {**os.environ, "RAYON_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(corpus)],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=limit,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_memory_does_not_grow_with_the_corpus_or_its_longest_line(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    write_corpus(corpus, 2)
    report = run_child(corpus)
    assert report["tokens"] > 500_000 and report["windows"] > 5_000
    assert report["growth_mb"] < GROWTH_LIMIT_MB, report


@pytest.mark.slow
def test_memory_for_a_50_mb_corpus(tmp_path: Path) -> None:
    """About 2 minutes: 50 MB of text (25 MB of it one line) trained on, tokenised, sampled."""
    corpus = tmp_path / "corpus.txt"
    write_corpus(corpus, 50)
    report = run_child(corpus)
    assert report["tokens"] > 10_000_000
    assert report["growth_mb"] < GROWTH_LIMIT_MB, report


@pytest.mark.slow
def test_lens_refuses_a_text_far_beyond_the_context_without_tokenising_all_of_it(tmp_path: Path) -> None:
    text = tmp_path / "long.txt"
    write_corpus(text, 4)  # about 3 million tokens of the reference model (before: 0.9 GB to count)
    report = run_child(text, LENS_CHILD)
    assert report["message"].startswith("the text (at least ")
    assert "tokens) is longer than the model's context of 128 tokens" in report["message"]
    assert report["growth_mb"] < GROWTH_LIMIT_MB, report
