"""Streamed corpora: same documents, tokens and fingerprint as loading whole, in bounded pieces."""

from __future__ import annotations

from pathlib import Path

import pytest

from resstream.data import Pieces, load_corpus, stream_corpus
from resstream.data.files import _last_cut
from resstream.data.sampling import sample_sequences, token_stream
from resstream.errors import UsageError


def _joined(stream) -> list[str]:
    return ["".join(doc) if isinstance(doc, Pieces) else doc for doc in stream]


@pytest.mark.parametrize(
    ("text", "cut"),
    [
        ("ab\ncd", 3),  # after the newline, before a non-blank character
        ("ab\n\ncd", 4),  # the last newline of the run
        ("ab\n cd", 0),  # followed by a space: no cut (a pre-tokeniser keeps "\n " whole)
        ("ab\ncd\n", 3),  # a trailing newline has nothing after it yet
        ("abc", 0),
    ],
)
def test_cut_points(text: str, cut: int) -> None:
    assert _last_cut(text) == cut


def test_text_file_streams_in_pieces_with_the_loaded_text_and_fingerprint(tmp_path: Path) -> None:
    text = "".join(f"line {i} été\n" + (" indented\n\n" if i % 3 == 0 else "") for i in range(500))
    path = tmp_path / "c.txt"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))  # a BOM, dropped as load_corpus does
    stream = stream_corpus(str(path), block_bytes=64)
    documents = iter(stream)
    document = next(documents)
    assert isinstance(document, Pieces)
    pieces = list(document)  # a document's pieces are consumed before the next document
    assert stream.fingerprint is None  # not before the pass is complete
    assert list(documents) == []
    assert len(pieces) > 50 and max(map(len, pieces)) < 200
    assert all(p.endswith("\n") and not p[0].isspace() for p in pieces[:-1])
    loaded = load_corpus(str(path))
    assert "".join(pieces) == loaded.documents[0] == text
    assert stream.fingerprint == loaded.fingerprint


def test_pieces_tokenise_like_the_whole_file_with_gpt2_bpe(tmp_path: Path, gpt2_tokenizer) -> None:
    text = "".join(f"Line {i}: the quick brown fox.\n\n  code\n\tx = {i}\n" for i in range(200))
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    streamed = list(token_stream(stream_corpus(str(path), block_bytes=100), gpt2_tokenizer))
    assert streamed == list(token_stream(load_corpus(str(path)).documents, gpt2_tokenizer))


def test_jsonl_rows_stream_one_document_each(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two\\u2028lines"}\r\n', encoding="utf-8")
    stream = stream_corpus(str(path))
    assert list(stream) == ["one", "two\u2028lines"]
    assert stream.fingerprint == load_corpus(str(path)).fingerprint


@pytest.mark.parametrize("block", [1, 2, 5, 4096])
def test_non_utf8_names_the_byte_offset_whatever_the_block(tmp_path: Path, block: int) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes("aé\nb".encode() + b"\xff" + b"tail\n")  # 0xff at byte offset 5
    with pytest.raises(UsageError, match=r"bad\.txt' is not UTF-8 text: byte 0xff at byte offset 5"):
        _joined(stream_corpus(str(path), block_bytes=block))


def test_truncated_utf8_at_the_end_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "cut.txt"
    path.write_bytes(b"ok\n" + "é".encode()[:1])
    with pytest.raises(UsageError, match=r"byte 0xc3 at byte offset 3"):
        _joined(stream_corpus(str(path), block_bytes=2))


def test_blank_file_is_an_empty_corpus(tmp_path: Path) -> None:
    path = tmp_path / "blank.txt"
    path.write_text(" \n\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"dataset '.*blank\.txt' is empty"):
        _joined(stream_corpus(str(path)))


def test_bad_names_fail_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"unknown dataset 'wikitxt-2' \(did you mean 'wikitext-2'\?\)"):
        stream_corpus("wikitxt-2")
    with pytest.raises(UsageError, match=r"file '.*missing\.txt' does not exist"):
        stream_corpus(str(tmp_path / "missing.txt"))


def test_sampling_a_streamed_file_equals_sampling_it_loaded(tmp_path: Path, gpt2_tokenizer) -> None:
    path = tmp_path / "c.txt"
    path.write_text("".join(f"Sentence number {i} is here.\n" for i in range(400)), encoding="utf-8")
    kwargs = dict(num_seqs=5, seq_len=16, seed=3)
    streamed = sample_sequences(stream_corpus(str(path), block_bytes=256), gpt2_tokenizer, **kwargs)
    loaded = sample_sequences(load_corpus(str(path)).documents, gpt2_tokenizer, **kwargs)
    assert [s.tolist() for s in streamed.sequences] == [s.tolist() for s in loaded.sequences]


def test_named_plain_files_stream_with_the_loaded_fingerprint(shared_data: Path) -> None:
    for name, split in [
        ("openwebtext", "train"),
        ("lambada", "test"),
        ("ptb", "test"),
        ("wikitext-2", "test"),
    ]:
        stream = stream_corpus(name, split=split, data_dir=shared_data)
        for document in stream:
            for _ in (document,) if isinstance(document, str) else document:
                pass
        assert stream.fingerprint == load_corpus(name, split=split, data_dir=shared_data).fingerprint, name
