"""The sharded token store (issue 13, item 4): the same ids as the single-file cache, the same
batches for the trainer, resume after an interruption, and refusals of bad stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from resstream.data import Corpus, CorpusStream, build_token_cache, load_tokenizer, stream_corpus, tokens
from resstream.data.shards import MANIFEST, ShardedTokens, read_manifest, shard_name, write_shards
from resstream.data.sources import corpus_fingerprint
from resstream.data.tokens import split_tokens
from resstream.errors import UsageError
from resstream.training.data import eval_starts, micro_batch, windows

DATA = Path(os.environ.get("RESSTREAM_DATA", "/nonexistent"))
FINEWEB = DATA / "fineweb-edu" / "fineweb-edu_sample-10BT_first1Mchars.txt"
needs_fineweb = pytest.mark.skipif(not FINEWEB.is_file(), reason="no local FineWeb-Edu sample")
needs_gpt2 = pytest.mark.skipif(not (DATA / "gpt2-tokenizer").is_dir(), reason="no local GPT-2 tokenizer")


@pytest.fixture(scope="module")
def gpt2():
    if not (DATA / "gpt2-tokenizer").is_dir():
        pytest.skip("no local GPT-2 tokenizer")
    return load_tokenizer("gpt2", data_dir=DATA)


def corpus_of(documents: list[str], name: str = "docs") -> Corpus:
    return Corpus(name, tuple(documents), corpus_fingerprint(documents), "test")


def fineweb_documents(count: int = 300) -> list[str]:
    """The first `count` non-blank lines of the local FineWeb-Edu sample, one document each."""
    lines = [line for line in FINEWEB.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines[:count]


# --------------------------------------------------------------------------- hand-checked


@needs_gpt2
def test_shards_and_manifest_of_a_corpus_small_enough_to_count(gpt2, tmp_path):
    # gpt2: "hello world" -> 2 ids, "hello" -> 1, "world world world" -> 3; eos after each
    docs = ["hello world", "hello", "world world world"]
    assert [len(gpt2.encode(d)) for d in docs] == [2, 1, 3]
    eos = gpt2.eos_token_id
    ids = [*gpt2.encode(docs[0]), eos, *gpt2.encode(docs[1]), eos, *gpt2.encode(docs[2]), eos]  # 9 ids
    summary = write_shards(corpus_of(docs), gpt2, tmp_path / "s", shard_tokens=4, workers=1)
    assert (summary.shards, summary.tokens, summary.written_shards) == (3, 9, 3)
    manifest = read_manifest(tmp_path / "s")
    assert manifest["complete"] and manifest["total_tokens"] == 9 and manifest["dtype"] == "uint16"
    shards = manifest["shards"]
    assert [s["tokens"] for s in shards] == [4, 4, 1]
    for index in range(len(shards)):
        data = np.fromfile(tmp_path / "s" / shard_name(index), dtype="<u2")
        assert data.tolist() == ids[4 * index : 4 * index + 4]
    # items: piece(ends 2) eos(3) piece(4) eos(5) piece(8) eos(9); the last item end <= each shard end
    assert [(s["resume_items"], s["resume_tokens"], s["documents"]) for s in shards] == [
        (3, 4, 1),
        (5, 8, 2),
        (6, 9, 3),
    ]
    assert (
        manifest["corpus"]["documents"] == 3
        and manifest["corpus"]["fingerprint"] == corpus_of(docs).fingerprint
    )


@needs_gpt2
def test_sharded_tokens_slices_across_shard_boundaries(gpt2, tmp_path):
    docs = [f"document number {i} says hello" for i in range(20)]
    write_shards(corpus_of(docs), gpt2, tmp_path / "s", shard_tokens=7, workers=1)
    ids = np.concatenate([np.fromfile(p, dtype="<u2") for p in sorted((tmp_path / "s").glob("shard-*.bin"))])
    tokens = ShardedTokens.open(tmp_path / "s", verify=True)
    assert len(tokens) == len(ids) and tokens.shape == (len(ids),)
    for a, b in [(0, 7), (5, 9), (6, 22), (13, 14), (0, len(ids)), (len(ids) - 3, len(ids)), (4, 4)]:
        assert np.asarray(tokens[a:b]).tolist() == ids[a:b].tolist(), (a, b)
    assert int(tokens[7]) == ids[7] and int(tokens[-1]) == ids[-1]
    assert np.asarray(tokens[3:20][2:9]).tolist() == ids[5:12].tolist()  # a view of a view
    train, val = tokens.split(0.1)
    want_train, want_val = split_tokens(ids, 0.1)
    assert np.asarray(train).tolist() == want_train.tolist() and np.asarray(val).tolist() == want_val.tolist()


# --------------------------------------------------------------------------- the local FineWeb sample


@needs_fineweb
@pytest.mark.parametrize("workers", [1, 2])
def test_shards_equal_the_single_file_cache(gpt2, tmp_path, workers):
    cache = build_token_cache(stream_corpus("fineweb-edu", data_dir=DATA), gpt2, tmp_path / "cache")
    summary = write_shards(
        stream_corpus("fineweb-edu", data_dir=DATA),
        gpt2,
        tmp_path / "s",
        shard_tokens=30_000,
        workers=workers,
    )
    store = ShardedTokens.open(tmp_path / "s")
    expected = np.concatenate([np.asarray(cache.train), np.asarray(cache.val)])
    assert summary.shards == -(-len(expected) // 30_000) > 5
    assert np.array_equal(np.asarray(store), expected)
    train, val = store.split(0.1)
    assert np.array_equal(np.asarray(train), np.asarray(cache.train))
    assert np.array_equal(np.asarray(val), np.asarray(cache.val))


@needs_fineweb
def test_the_trainer_gets_the_same_batches_and_eval_windows_from_both(gpt2, tmp_path):
    cache = build_token_cache(stream_corpus("fineweb-edu", data_dir=DATA), gpt2, tmp_path / "cache")
    write_shards(
        stream_corpus("fineweb-edu", data_dir=DATA), gpt2, tmp_path / "s", shard_tokens=20_000, workers=1
    )
    train, val = ShardedTokens.open(tmp_path / "s").split(0.1)
    for step in range(4):
        for rank in (0, 1):
            for micro in (0, 1):
                kwargs = dict(seed=3, step=step, micro=micro, grad_accum=2, rank=rank, world=2)
                x, y = micro_batch(train, 64, 16, **kwargs)
                cx, cy = micro_batch(cache.train, 64, 16, **kwargs)
                assert torch.equal(x, cx) and torch.equal(y, cy)
    starts = eval_starts(len(val), 64, 24)
    assert len(val) == len(cache.val)
    for got, want in zip(windows(val, starts, 64), windows(cache.val, starts, 64), strict=True):
        assert torch.equal(got, want)


@needs_gpt2
def test_a_rank_reads_only_the_windows_of_its_slice(gpt2, tmp_path, monkeypatch):
    docs = [f"line {i} of a corpus long enough for a few windows" for i in range(300)]
    write_shards(corpus_of(docs), gpt2, tmp_path / "s", shard_tokens=500, workers=1)
    train = ShardedTokens.open(tmp_path / "s")
    reads: list[tuple[int, int]] = []
    real = ShardedTokens.__array__

    def counting(self, *args, **kwargs):
        reads.append((self._start, self._stop))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ShardedTokens, "__array__", counting)
    micro_batch(train, 16, 8, seed=0, step=5, micro=0, grad_accum=1, rank=1, world=2)
    from resstream.training.data import window_starts

    starts = window_starts(len(train), 16, 8, seed=0, step=5)[4:8].tolist()
    assert reads == [(s, s + 17) for s in starts]


# --------------------------------------------------------------------------- resume


class Interrupted(Exception):
    pass


def failing_stream(documents: list[str], fail_at: int | None) -> CorpusStream:
    def generate():
        for index, document in enumerate(documents):
            if index == fail_at:
                raise Interrupted(f"stopped at document {index}")
            yield document

    return CorpusStream("paragraphs", "test", generate)


@needs_fineweb
def test_an_interrupted_store_resumes_after_its_last_complete_shard(gpt2, tmp_path, monkeypatch):
    monkeypatch.setattr(tokens, "_BATCH_CHARS", 4096)  # many batches, so that shards are done before the stop
    docs = fineweb_documents(400)
    whole = write_shards(failing_stream(docs, None), gpt2, tmp_path / "whole", shard_tokens=1500, workers=2)
    with pytest.raises(Interrupted):
        write_shards(failing_stream(docs, 300), gpt2, tmp_path / "s", shard_tokens=1500, workers=2)
    partial = read_manifest(tmp_path / "s")
    k = len(partial["shards"])
    assert not partial["complete"] and 3 <= k < whole.shards
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted(
        [MANIFEST, *map(shard_name, range(k))]
    )
    with pytest.raises(UsageError, match="is incomplete"):
        ShardedTokens.open(tmp_path / "s")
    before = {i: os.stat(tmp_path / "s" / shard_name(i)) for i in range(k)}
    resumed = write_shards(failing_stream(docs, None), gpt2, tmp_path / "s", shard_tokens=1500, workers=1)
    assert resumed.written_shards == whole.shards - k and resumed.fingerprint == whole.fingerprint
    for i, stat in before.items():
        now = os.stat(tmp_path / "s" / shard_name(i))
        assert (now.st_ino, now.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns), shard_name(i)
    for i in range(whole.shards):
        name = shard_name(i)
        assert (tmp_path / "s" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert read_manifest(tmp_path / "s") == read_manifest(tmp_path / "whole")
    again = write_shards(failing_stream(docs, None), gpt2, tmp_path / "s", shard_tokens=1500, workers=1)
    assert again.written_shards == 0 and again.fingerprint == whole.fingerprint


# --------------------------------------------------------------------------- refusals


@pytest.fixture
def store(gpt2, tmp_path) -> Path:
    docs = [f"document {i} is here" for i in range(30)]
    write_shards(corpus_of(docs), gpt2, tmp_path / "s", shard_tokens=50, workers=1)
    return tmp_path / "s"


def test_a_missing_shard_is_named(store):
    (store / shard_name(1)).unlink()
    with pytest.raises(UsageError, match=r"shard-00001\.bin is missing \(the manifest lists 3 shards\)"):
        ShardedTokens.open(store)


def test_a_shard_of_the_wrong_size_is_named(store):
    with open(store / shard_name(2), "ab") as handle:
        handle.write(b"\0\0")
    with pytest.raises(
        UsageError, match=r"shard-00002\.bin has 102 bytes; the manifest says 50 ids \(100 bytes\)"
    ):
        ShardedTokens.open(store)


def test_a_changed_shard_fails_its_checksum(store):
    data = bytearray((store / shard_name(0)).read_bytes())
    data[0] ^= 1
    (store / shard_name(0)).write_bytes(bytes(data))
    ShardedTokens.open(store)  # sizes only
    with pytest.raises(UsageError, match=r"shard-00000\.bin does not match the sha256 in its manifest"):
        ShardedTokens.open(store, verify=True)


def test_a_store_of_another_tokenizer_is_not_resumed_or_reused(store, tmp_path):
    from resstream.data import train_bpe

    other = train_bpe([f"document {i} is here" for i in range(30)], 300)
    docs = [f"document {i} is here" for i in range(30)]
    with pytest.raises(UsageError, match="holds a shard store of another tokenizer"):
        write_shards(corpus_of(docs), other, store, shard_tokens=50, workers=1)


@pytest.mark.parametrize(("name", "value"), [("shard_tokens", 0), ("workers", 0), ("workers", -2)])
def test_bad_shard_tokens_or_workers(gpt2, tmp_path, name, value):
    kwargs = {"shard_tokens": 10, "workers": 1, name: value}
    with pytest.raises(UsageError, match=rf"`{name}` {value} must be a whole number >= 1"):
        write_shards(corpus_of(["a b"]), gpt2, tmp_path / "s", **kwargs)
    assert not (tmp_path / "s").exists()


def test_an_empty_corpus_writes_nothing(gpt2, tmp_path):
    stream = CorpusStream("blank", "test", lambda: iter(["  ", "\n"]))
    with pytest.raises(UsageError, match="is empty"):
        write_shards(stream, gpt2, tmp_path / "s", shard_tokens=1, workers=1)
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- memory


CHILD = textwrap.dedent(
    r"""
    import json, resource, sys, tempfile
    from resstream.data import Corpus, load_tokenizer, stream_corpus
    from resstream.data.shards import write_shards

    tokenizer = load_tokenizer("gpt2", data_dir=sys.argv[2])
    warm = Corpus("warm", ("warm up " * 100,), "0", "test")
    write_shards(warm, tokenizer, tempfile.mkdtemp(), shard_tokens=1000, workers=1)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    corpus = stream_corpus(sys.argv[1])
    summary = write_shards(corpus, tokenizer, tempfile.mkdtemp(), shard_tokens=2_000_000, workers=2)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    growth = (peak - base) / 1024
    print(json.dumps({"growth_mb": growth, "worker_mb": worker / 1024, "tokens": summary.tokens}))
    """
)

#: Peak RSS the writing process may add to its warmed-up state, and the peak of one worker,
#: whatever the corpus size (measured: see the report of the 50 MB test).
GROWTH_LIMIT_MB = 100
WORKER_LIMIT_MB = 400


def varied_fineweb(path: Path, megabytes: int) -> None:
    """`megabytes` of text: the FineWeb-Edu sample repeated, each copy's words shifted by one
    letter per copy so that the copies do not tokenise alike."""
    text = FINEWEB.read_text(encoding="utf-8")
    with path.open("w", encoding="utf-8") as handle:
        copy = 0
        while handle.tell() < megabytes * 2**20:
            table = str.maketrans("aeiou", "aeiou"[copy % 5 :] + "aeiou"[: copy % 5])
            handle.write(text.translate(table) + "\n\n")
            copy += 1


def tokenise_in_child(corpus: Path) -> dict:
    env = {**os.environ, "RAYON_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(corpus), str(DATA)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_fineweb
@needs_gpt2
@pytest.mark.slow
def test_memory_while_tokenising_a_50_mb_corpus(tmp_path):
    corpus = tmp_path / "corpus.txt"
    varied_fineweb(corpus, 50)
    report = tokenise_in_child(corpus)
    print(report)
    assert report["tokens"] > 10_000_000
    assert report["growth_mb"] < GROWTH_LIMIT_MB and report["worker_mb"] < WORKER_LIMIT_MB, report


@needs_fineweb
@needs_gpt2
def test_memory_while_tokenising_a_2_mb_corpus(tmp_path):
    corpus = tmp_path / "corpus.txt"
    varied_fineweb(corpus, 2)
    report = tokenise_in_child(corpus)
    assert report["tokens"] > 400_000
    assert report["growth_mb"] < GROWTH_LIMIT_MB and report["worker_mb"] < WORKER_LIMIT_MB, report
