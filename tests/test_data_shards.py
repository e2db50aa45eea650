"""The sharded token store (issue 13, item 4): the same ids as the single-file cache, the same
batches for the trainer, resume after an interruption, and refusals of bad stores."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from resstream.data import (
    Corpus,
    CorpusStream,
    build_token_cache,
    load_tokenizer,
    shards,
    stream_corpus,
    tokens,
)
from resstream.data.shards import (
    MANIFEST,
    ShardedTokens,
    check_shard_files,
    read_manifest,
    reading,
    shard_name,
    store_splits,
    verification,
    verification_order,
    write_shards,
)
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
@pytest.mark.parametrize("workers", [pytest.param(1, marks=pytest.mark.slow), 2])
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
@pytest.mark.slow
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
@pytest.mark.slow
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
def store(small_bpe, tmp_path) -> Path:
    """A complete store of 3 shards (a BPE trained here: these tests need no corpus on disk)."""
    docs = [f"document {i} is here" for i in range(30)]
    ids = sum(len(small_bpe.encode(doc)) + 1 for doc in docs)  # eos after each
    write_shards(corpus_of(docs), small_bpe, tmp_path / "s", shard_tokens=ids // 3 + 1, workers=1)
    assert len(read_manifest(tmp_path / "s")["shards"]) == 3
    return tmp_path / "s"


@pytest.fixture(scope="module")
def small_bpe():
    from resstream.data import train_bpe

    return train_bpe([f"document {i} is here" for i in range(30)], 270)


def test_a_missing_shard_is_named(store):
    (store / shard_name(1)).unlink()
    with pytest.raises(UsageError, match=r"shard-00001\.bin is missing \(the manifest lists 3 shards\)"):
        ShardedTokens.open(store)


def test_a_shard_of_the_wrong_size_is_named(store):
    with open(store / shard_name(2), "ab") as handle:
        handle.write(b"\0\0")
    ids = read_manifest(store)["shards"][2]["tokens"]
    with pytest.raises(
        UsageError,
        match=rf"shard-00002\.bin has {2 * ids + 2} bytes; the manifest says {ids} ids \({2 * ids} bytes\)",
    ):
        ShardedTokens.open(store)


def test_a_changed_shard_fails_its_checksum(store):
    data = bytearray((store / shard_name(0)).read_bytes())
    data[0] ^= 1
    (store / shard_name(0)).write_bytes(bytes(data))
    ShardedTokens.open(store, verify=False)  # sizes only
    with pytest.raises(
        UsageError,
        match=r"shard-00000\.bin does not match the sha256 in its manifest: the file changed since it was "
        r"tokenised",
    ):
        ShardedTokens.open(store)


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


# --------------------------------------------------------------------------- a store stays in its folder


def edit_manifest(store: Path, change) -> None:
    """Rewrite the store's manifest with `change(manifest)` applied, as a tampering archive would."""
    manifest = json.loads((store / MANIFEST).read_text(encoding="utf-8"))
    change(manifest)
    (store / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def set_shard(index: int, key: str, value):
    return lambda manifest: manifest["shards"][index].__setitem__(key, value)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("file", "../SECRET.bin", "shard 0 has file '../SECRET.bin' (a path, not a plain name)"),
        ("file", "/etc/passwd", "shard 0 has file '/etc/passwd' (an absolute path)"),
        ("file", "sub/shard.bin", "shard 0 has file 'sub/shard.bin' (a path, not a plain name)"),
        ("file", "..\\up.bin", "shard 0 has file '..\\\\up.bin' (a path, not a plain name)"),
        ("file", "..", "shard 0 has file '..' (a directory)"),
        ("file", "", "shard 0 has file '' (not a file name)"),
        ("file", None, "shard 0 has file None (not a file name)"),
        ("file", "a\0b", "shard 0 has file 'a\\x00b' (it holds a NUL character)"),
        ("tokens", -1, "shard 0 (shard-00000.bin) has tokens -1; allowed: a whole number >= 0"),
        ("tokens", 1.5, "shard 0 (shard-00000.bin) has tokens 1.5; allowed"),
        ("tokens", True, "shard 0 (shard-00000.bin) has tokens True; allowed"),
        ("tokens", None, "shard 0 (shard-00000.bin) has tokens None; allowed"),
        ("tokens", "50", "shard 0 (shard-00000.bin) has tokens '50'; allowed"),
        ("sha256", None, "shard 0 (shard-00000.bin) has sha256 None; allowed: 16 hex digits (0-9, a-f)"),
        ("sha256", 12, "shard 0 (shard-00000.bin) has sha256 12; allowed"),
        ("sha256", "XYZ", "shard 0 (shard-00000.bin) has sha256 'XYZ'; allowed"),
    ],
)
def test_a_bad_shard_entry_is_refused_before_anything_is_read(store, key, value, message):
    edit_manifest(store, set_shard(0, key, value))
    with pytest.raises(UsageError) as refused:
        read_manifest(store)
    assert str(refused.value).startswith(f"shard store {str(store)!r}: manifest.json {message}"), (
        refused.value
    )


@pytest.mark.parametrize("value", ["float64", "int8", None, 16])
def test_a_bad_dtype_is_refused(store, value):
    edit_manifest(store, lambda manifest: manifest.__setitem__("dtype", value))
    with pytest.raises(UsageError, match=rf"has dtype {value!r}; allowed: uint16, uint32"):
        ShardedTokens.open(store)


def test_an_entry_that_is_not_an_object_is_refused(store):
    edit_manifest(store, lambda manifest: manifest["shards"].__setitem__(1, "shard-00001.bin"))
    with pytest.raises(
        UsageError, match=r"shard 1 is 'shard-00001\.bin', not an object with file, tokens and sha256"
    ):
        read_manifest(store)


@pytest.mark.parametrize("target", ["inside", "outside"])
def test_a_shard_that_is_a_symbolic_link_is_refused(store, tmp_path, target):
    """Every link is refused, also one to a file of the store itself (the rule is simplest so)."""
    shard = store / shard_name(1)
    place = store / "copy.bin" if target == "inside" else tmp_path / "outside.bin"
    shard.rename(place)
    shard.symlink_to(place)
    with pytest.raises(
        UsageError, match=r"shard-00001\.bin is a symbolic link; a shard must be a file inside"
    ):
        ShardedTokens.open(store)


def test_a_shard_that_is_a_fifo_is_refused_without_blocking(store):
    (store / shard_name(2)).unlink()
    os.mkfifo(store / shard_name(2))
    with pytest.raises(UsageError, match=r"shard-00002\.bin is a named pipe, not a regular file"):
        ShardedTokens.open(store)


def test_an_edited_fingerprint_or_a_missing_field_is_refused(store):
    edit_manifest(store, lambda manifest: manifest.__setitem__("fingerprint", "0" * 16))
    with pytest.raises(UsageError, match="records fingerprint 0000000000000000, but its fields give"):
        ShardedTokens.open(store)
    edit_manifest(store, lambda manifest: manifest["tokenizer"].pop("fingerprint"))
    with pytest.raises(
        UsageError, match=r"manifest\.json has tokenizer\.fingerprint None; allowed: a string"
    ):
        ShardedTokens.open(store)


def test_a_shard_and_its_sha256_changed_together_change_the_fingerprint(store):
    """run.json records the store's fingerprint: a manifest whose shard checksum was updated to
    match an edited shard, but whose fingerprint was not, is refused."""
    shard = store / shard_name(0)
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))
    digest = hashlib.sha256(bytes(data)).hexdigest()[:16]
    edit_manifest(store, set_shard(0, "sha256", digest))
    with pytest.raises(UsageError, match="edited after tokenising"):
        ShardedTokens.open(store)


# --------------------------------------------------------------------------- sha256 once per file


@pytest.fixture
def hashes(monkeypatch) -> list[str]:
    """The files `verify_shards` hashes (by name), in order; verifications are cached at once
    (`SETTLED_NS` 0: no waiting for the file system's clock to move)."""
    calls: list[str] = []
    real = verification.shard_digest

    def counting(handle):
        calls.append(Path(os.readlink(f"/proc/self/fd/{handle.fileno()}")).name)
        return real(handle)

    monkeypatch.setattr(verification, "shard_digest", counting)
    monkeypatch.setattr(verification, "SETTLED_NS", 0)
    return calls


def test_a_verified_store_is_not_hashed_again(store, tmp_path, hashes):
    cache = tmp_path / "cache"
    before = {p.name: p.stat().st_mtime_ns for p in store.iterdir()}
    ShardedTokens.open(store, cache_dir=cache)
    assert hashes == [shard_name(i) for i in range(3)]
    assert len(list((cache / shards.VERIFIED_DIR).iterdir())) == 3
    ShardedTokens.open(store, cache_dir=cache)
    assert len(hashes) == 3  # every shard found in the cache
    ShardedTokens.open(store, cache_dir=tmp_path / "another-cache")
    assert len(hashes) == 6  # a cache is the only thing trusted
    ShardedTokens.open(store)
    assert len(hashes) == 9  # no cache: hashed every time
    assert {p.name: p.stat().st_mtime_ns for p in store.iterdir()} == before  # nothing written into the store


def test_a_shard_changed_at_the_same_size_and_mtime_is_caught(store, tmp_path, hashes):
    cache = tmp_path / "cache"
    ShardedTokens.open(store, cache_dir=cache)
    shard = store / shard_name(1)
    old = shard.stat()
    time.sleep(0.05)  # beyond the tick of a coarse file-system clock, so that ctime moves
    with open(shard, "r+b") as handle:
        first = handle.read(1)
        handle.seek(0)
        handle.write(bytes([first[0] ^ 1]))
    os.utime(shard, ns=(old.st_atime_ns, old.st_mtime_ns))  # the mtime put back, as `touch -r` would
    new = shard.stat()
    assert (new.st_size, new.st_mtime_ns, new.st_ino) == (old.st_size, old.st_mtime_ns, old.st_ino)
    with pytest.raises(UsageError, match=r"shard-00001\.bin does not match the sha256 in its manifest"):
        ShardedTokens.open(store, cache_dir=cache)
    assert hashes[3:] == [shard_name(1)]  # only the changed file was read again


def test_a_changed_manifest_checksum_is_not_found_in_the_cache(store, tmp_path, hashes):
    cache = tmp_path / "cache"
    ShardedTokens.open(store, cache_dir=cache)
    edit_manifest(store, set_shard(2, "sha256", "0" * 16))
    with pytest.raises(UsageError, match=r"shard-00002\.bin does not match the sha256"):
        check_shard_files(store, read_manifest(store), verify=True, cache_dir=cache)


@pytest.mark.parametrize("cache_kind", ["a file", "read-only"])
def test_an_unwritable_cache_still_verifies(store, tmp_path, hashes, cache_kind):
    cache = tmp_path / "cache"
    if cache_kind == "a file":
        cache.write_text("not a directory")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        cache.mkdir(mode=0o555)
    ShardedTokens.open(store, cache_dir=cache)
    ShardedTokens.open(store, cache_dir=cache)
    assert len(hashes) == 6  # verified both times, cached neither
    data = bytearray((store / shard_name(0)).read_bytes())
    data[-1] ^= 1
    (store / shard_name(0)).write_bytes(bytes(data))
    with pytest.raises(UsageError, match=r"shard-00000\.bin does not match the sha256"):
        ShardedTokens.open(store, cache_dir=cache)


def test_a_file_that_just_changed_is_verified_but_not_cached(store, tmp_path, monkeypatch):
    """A change within the tick of a coarse file-system clock would leave ctime as it was, so a
    file changed less than `SETTLED_NS` ago is not recorded (as git treats 'racily clean' files)."""
    monkeypatch.setattr(verification, "SETTLED_NS", 3600 * 10**9)
    ShardedTokens.open(store, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / shards.VERIFIED_DIR).exists() or not any(
        (tmp_path / "cache" / shards.VERIFIED_DIR).iterdir()
    )


def test_each_rank_starts_at_its_own_share_of_the_shards():
    assert verification_order(4, 0, 1) == [0, 1, 2, 3]
    assert verification_order(4, 0, 2) == [0, 1, 2, 3]
    assert verification_order(4, 1, 2) == [2, 3, 0, 1]
    assert verification_order(3, 2, 4) == [1, 2, 0]
    assert verification_order(0, 1, 2) == []


def test_a_rank_hashes_only_what_the_others_have_not_recorded(store, tmp_path, hashes):
    """Rank 1 of 2 ran first and recorded every shard; rank 0 then reads nothing. (Run at the
    same time, each hashes about its own share first: `verification_order`.)"""
    cache = tmp_path / "cache"
    store_splits(store, 0.1, cache_dir=cache, rank=1, world=2)
    assert hashes == [shard_name(1), shard_name(2), shard_name(0)]
    store_splits(store, 0.1, cache_dir=cache, rank=0, world=2)
    assert len(hashes) == 3


def test_the_store_is_mapped_from_the_files_that_were_verified(store, tmp_path, monkeypatch):
    """A shard swapped after it was checked is not the one read: the maps come from the very
    files that were opened and hashed."""
    original = [np.fromfile(store / shard_name(i), dtype="<u2") for i in range(3)]
    real = reading.verify_shards

    def swap_after_verifying(*args, **kwargs):
        real(*args, **kwargs)
        for i in range(3):
            (store / shard_name(i)).unlink()
            (store / shard_name(i)).write_bytes(np.zeros(50, dtype="<u2").tobytes())

    monkeypatch.setattr(reading, "verify_shards", swap_after_verifying)
    tokens = ShardedTokens.open(store)
    assert np.asarray(tokens).tolist() == np.concatenate(original).tolist()


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
@pytest.mark.slow
def test_memory_while_tokenising_a_2_mb_corpus(tmp_path):
    corpus = tmp_path / "corpus.txt"
    varied_fineweb(corpus, 2)
    report = tokenise_in_child(corpus)
    assert report["tokens"] > 400_000
    assert report["growth_mb"] < GROWTH_LIMIT_MB and report["worker_mb"] < WORKER_LIMIT_MB, report
