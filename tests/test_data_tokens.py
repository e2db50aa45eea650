"""Token streams: tokenisation, the validation tail and the on-disk cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from resstream.data import (
    TokenSplits,
    build_token_cache,
    load_corpus,
    load_tokenizer,
    split_tokens,
    stream_corpus,
    tokenize_documents,
    train_bpe,
)
from resstream.data import tokens as tokens_module
from resstream.data.files import TOKENIZER_PIECE_CHARS
from resstream.data.sources import Corpus, corpus_fingerprint
from resstream.data.tokens import check_cache_dir, token_dtype
from resstream.errors import UsageError


@pytest.fixture(scope="module")
def ab_tokenizer():
    """Hand-checkable BPE: eos = 0, 'ab' = 257, 'Ġab' = 258."""
    return train_bpe(["ab ab ab"], 259)


def corpus_of(*documents: str, name: str = "tiny") -> Corpus:
    return Corpus(name=name, documents=documents, fingerprint=corpus_fingerprint(documents), origin="test")


# ten documents "ab ab ab ab" -> 4 tokens + eos each = 50 tokens
TEN = corpus_of(*["ab ab ab ab"] * 10)


# --------------------------------------------------------------------------- tokenize


def test_tokenize_documents_by_hand(ab_tokenizer) -> None:
    ids = tokenize_documents(["ab ab", "ab"], ab_tokenizer)
    assert ids.tolist() == [257, 258, 0, 257, 0]
    assert ids.dtype == np.uint16 and ids.ndim == 1


def test_tokenize_without_eos_concatenates(ab_tokenizer) -> None:
    plain = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(ab_tokenizer.backend_tokenizer.to_str())
    )
    assert plain.eos_token_id is None
    assert tokenize_documents(["ab ab", "ab"], plain).tolist() == [257, 258, 257]


def test_tokenize_ignores_truncation_settings(ab_tokenizer) -> None:
    backend = ab_tokenizer.backend_tokenizer
    backend.enable_truncation(max_length=1)
    try:
        assert tokenize_documents(["ab ab ab"], ab_tokenizer).tolist() == [257, 258, 258, 0]
        assert backend.truncation["max_length"] == 1  # restored afterwards
    finally:
        backend.no_truncation()


def test_tokenize_many_documents_in_batches(ab_tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens_module, "_BATCH_DOCS", 7)
    ids = tokenize_documents(["ab"] * 2000, ab_tokenizer, progress=False)
    assert ids.tolist() == [257, 0] * 2000


class _RecordingBackend:
    """A Rust backend that records the length of every text it is asked to encode."""

    def __init__(self, inner, lengths: list[int]) -> None:
        self._inner, self._lengths = inner, lengths

    def __getattr__(self, name: str):
        attribute = getattr(self._inner, name)
        if not name.startswith("encode"):
            return attribute

        def encode(texts, *args, **kwargs):
            self._lengths.extend(len(text) for text in texts)
            return attribute(texts, *args, **kwargs)

        return encode


class RecordingTokenizer:
    """`inner`, except that its backend records the texts it encodes (`lengths`)."""

    def __init__(self, inner) -> None:
        self._inner, self.lengths = inner, []

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)

    @property
    def backend_tokenizer(self):
        return _RecordingBackend(self._inner.backend_tokenizer, self.lengths)


def test_a_long_document_reaches_the_tokenizer_in_bounded_pieces(gpt2_tokenizer) -> None:
    document = " ".join(f"token{i}, and\n\nmore" if i % 97 == 0 else f"w{i}" for i in range(60_000))
    recording = RecordingTokenizer(gpt2_tokenizer)
    ids = tokenize_documents([document, "tail"], recording, progress=False)
    assert len(recording.lengths) > 1 and max(recording.lengths) <= TOKENIZER_PIECE_CHARS
    whole = gpt2_tokenizer(document, add_special_tokens=False)["input_ids"]
    tail = gpt2_tokenizer("tail", add_special_tokens=False)["input_ids"]
    assert ids.tolist() == [*whole, 50256, *tail, 50256]


def test_the_cache_is_built_from_a_stream_in_bounded_chunks(
    gpt2_tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.txt"
    path.write_text("".join(f"Line {i} of the corpus.\n\n" for i in range(3000)), encoding="utf-8")
    loaded = build_token_cache(load_corpus(str(path)), gpt2_tokenizer, tmp_path / "a")
    monkeypatch.setattr(tokens_module, "_BATCH_CHARS", 1000)  # many chunks, appended one by one
    stream = stream_corpus(str(path), block_bytes=4096)
    stream.scan()
    streamed = build_token_cache(stream, gpt2_tokenizer, tmp_path / "b")
    assert streamed.fingerprint == loaded.fingerprint
    assert streamed.path.read_bytes() == loaded.path.read_bytes()
    meta = json.loads(streamed.path.with_suffix(".json").read_text(encoding="utf-8"))
    assert meta["corpus"]["n_documents"] == 1


def test_token_dtype() -> None:
    assert token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32


# --------------------------------------------------------------------------- split


def test_split_is_the_tail() -> None:
    train, val = split_tokens(np.arange(100), 0.1)
    assert train.tolist() == list(range(90)) and val.tolist() == list(range(90, 100))
    train, val = split_tokens(np.arange(30), 0.1)  # 0.1 * 30 is 3.0000000000000004 in floats
    assert (len(train), len(val)) == (27, 3)
    train, val = split_tokens(np.arange(7), 0.5)  # floor(3.5) = 3
    assert (len(train), len(val)) == (4, 3)


@pytest.mark.parametrize("fraction", [0, -0.1, 0.51, 1.0])
def test_split_rejects_bad_fraction(fraction: float) -> None:
    with pytest.raises(
        UsageError, match=rf"val_fraction {fraction!r} is not allowed: it must be in \(0, 0\.5\]"
    ):
        split_tokens(np.arange(100), fraction)


def test_split_needs_two_validation_tokens() -> None:
    with pytest.raises(UsageError, match="19 tokens are too few to split"):
        split_tokens(np.arange(19), 0.1)
    assert len(split_tokens(np.arange(20), 0.1)[1]) == 2


# --------------------------------------------------------------------------- cache


def test_cache_contents(ab_tokenizer, tmp_path: Path) -> None:
    splits = build_token_cache(TEN, ab_tokenizer, tmp_path, val_fraction=0.1)
    assert isinstance(splits, TokenSplits)
    assert splits.path == tmp_path / f"tokens-{splits.fingerprint}.bin"
    assert (len(splits.train), len(splits.val)) == (45, 5)
    stream = [257, 258, 258, 258, 0] * 10
    assert splits.train.tolist() == stream[:45] and splits.val.tolist() == stream[45:]
    assert isinstance(splits.train, np.memmap) and isinstance(splits.val, np.memmap)
    assert splits.train.dtype == np.uint16 and splits.vocab_size == 259
    with pytest.raises(ValueError, match="read-only"):
        splits.train[0] = 1  # read-only
    meta = json.loads(splits.path.with_suffix(".json").read_text(encoding="utf-8"))
    assert meta["n_tokens"] == 50 and meta["n_train"] == 45 and meta["n_val"] == 5
    assert meta["dtype"] == "uint16" and meta["corpus"]["name"] == "tiny"
    assert splits.path.stat().st_size == 100


def test_cache_is_reused(ab_tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = build_token_cache(TEN, ab_tokenizer, tmp_path)
    mtime = first.path.stat().st_mtime_ns

    def refuse(*args, **kwargs):
        raise AssertionError("re-tokenised although the cache was valid")

    monkeypatch.setattr(tokens_module, "token_chunks", refuse)
    second = build_token_cache(TEN, ab_tokenizer, tmp_path)
    assert second.fingerprint == first.fingerprint and second.path == first.path
    assert first.path.stat().st_mtime_ns == mtime
    assert second.train.tolist() == first.train.tolist()


def test_changed_inputs_give_new_files(ab_tokenizer, tmp_path: Path) -> None:
    base = build_token_cache(TEN, ab_tokenizer, tmp_path)
    other_text = build_token_cache(corpus_of(*["ab ab ab"] * 10), ab_tokenizer, tmp_path)
    other_tok = build_token_cache(TEN, train_bpe(["ab ab ab"], 258), tmp_path)
    other_frac = build_token_cache(TEN, ab_tokenizer, tmp_path, val_fraction=0.2)
    fingerprints = {s.fingerprint for s in (base, other_text, other_tok, other_frac)}
    assert len(fingerprints) == 4
    assert len(list(tmp_path.glob("tokens-*.bin"))) == 4
    assert len(other_text.train) + len(other_text.val) == 40
    assert (len(other_frac.train), len(other_frac.val)) == (40, 10)


@pytest.mark.parametrize("damage", ["truncate", "sidecar"])
def test_damaged_cache_is_rebuilt(ab_tokenizer, tmp_path: Path, damage: str) -> None:
    first = build_token_cache(TEN, ab_tokenizer, tmp_path)
    expected = first.train.tolist() + first.val.tolist()
    del first
    path = next(tmp_path.glob("tokens-*.bin"))
    if damage == "truncate":
        with open(path, "r+b") as fh:
            fh.truncate(10)
    else:
        path.with_suffix(".json").write_text("{not json", encoding="utf-8")
    again = build_token_cache(TEN, ab_tokenizer, tmp_path)
    assert again.train.tolist() + again.val.tolist() == expected
    assert path.stat().st_size == 100


def test_cache_checks_fraction_before_tokenising(
    ab_tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokens_module, "token_chunks", lambda *a, **k: pytest.fail("tokenised"))
    with pytest.raises(UsageError, match=r"val_fraction 0\.6 is not allowed"):
        build_token_cache(TEN, ab_tokenizer, tmp_path, val_fraction=0.6)


def test_a_cache_dir_that_is_a_file_is_refused(ab_tokenizer, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "cache"
    not_a_dir.write_text("x", encoding="utf-8")
    for where in (not_a_dir, not_a_dir / "below"):
        with pytest.raises(UsageError, match=r"^`cache_dir` '.*cache' is a file, not a directory$"):
            check_cache_dir(where)
        with pytest.raises(UsageError, match=r"is a file, not a directory"):
            build_token_cache(TEN, ab_tokenizer, where)
    check_cache_dir(tmp_path / "new" / "dir")  # made when the cache is written
    assert not (tmp_path / "new").exists()


def test_a_cache_dir_without_write_permission_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root may write anywhere; simulate 0555
    with pytest.raises(
        UsageError, match=r"^`cache_dir` '.*new' cannot be written: permission denied on '.*'$"
    ):
        check_cache_dir(tmp_path / "new")


def test_too_small_corpus(ab_tokenizer, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"dataset 'wee' is too small: 4 tokens give 0 validation tokens"):
        build_token_cache(corpus_of("ab ab ab", name="wee"), ab_tokenizer, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written


def test_no_temporary_files_left(ab_tokenizer, tmp_path: Path) -> None:
    build_token_cache(TEN, ab_tokenizer, tmp_path)
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".bin", ".json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# --------------------------------------------------------------------------- real data


@pytest.mark.slow
def test_wikitext2_with_gpt2_matches_per_document_encoding(shared_data: Path, tmp_path: Path) -> None:
    tokenizer = load_tokenizer("gpt2", data_dir=shared_data)
    corpus = load_corpus("wikitext-2", split="test", data_dir=shared_data)
    splits = build_token_cache(corpus, tokenizer, tmp_path, val_fraction=0.1)
    expected: list[int] = []
    for doc in corpus.documents:
        expected += tokenizer(doc)["input_ids"] + [tokenizer.eos_token_id]
    stream = np.concatenate([splits.train, splits.val])
    assert stream.tolist() == expected
    assert len(splits.val) == len(expected) // 10
    assert stream.tolist().count(50256) == len(corpus.documents) == 62


def test_cache_name_depends_only_on_inputs(ab_tokenizer, tmp_path: Path) -> None:
    a = build_token_cache(TEN, ab_tokenizer, tmp_path / "x")
    b = build_token_cache(TEN, ab_tokenizer, tmp_path / "y")
    assert a.fingerprint == b.fingerprint
    assert os.path.basename(a.path) == os.path.basename(b.path)
