"""Streamed corpora: same documents, tokens and fingerprint as loading whole, in bounded pieces."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from resstream.data import Pieces, load_corpus, stream_corpus
from resstream.data.files import _last_cut, split_text
from resstream.data.sampling import sample_sequences, token_stream
from resstream.errors import UsageError


def _joined(stream) -> list[str]:
    return ["".join(doc) if isinstance(doc, Pieces) else doc for doc in stream]


@pytest.mark.parametrize(
    ("text", "cut"),
    [
        ("ab\ncd", 3),  # after a newline between two non-blank characters
        ("ab\n\ncd", 0),  # a blank line: GPT-2 splits "\n\nc" into "\n", "\n", "c" but a piece
        # ending in "\n\n" into "\n\n" (one token), so no cut there
        ("ab\n cd", 0),  # followed by a space: no cut (a pre-tokeniser keeps "\n " whole)
        ("ab\ncd\n", 3),  # a trailing newline has nothing after it yet
        ("ab\ncd ef", 3),  # a newline is preferred to a later space
        ("ab cd ef", 5),  # no newline: just before the last single space between words
        ("ab  cd", 0),  # two spaces: "  c" is " ", " c" whole but "  " at the end of a piece
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
    for piece, following in itertools.pairwise(pieces):  # each cut is a safe one
        after_newline = piece.endswith("\n") and not piece[-2].isspace() and not following[0].isspace()
        before_space = not piece[-1].isspace() and following[0] == " " and not following[1].isspace()
        assert after_newline or before_space, (piece, following)
    loaded = load_corpus(str(path))
    assert "".join(pieces) == loaded.documents[0] == text
    assert stream.fingerprint == loaded.fingerprint


def test_pieces_tokenise_like_the_whole_file_with_gpt2_bpe(tmp_path: Path, gpt2_tokenizer) -> None:
    text = "".join(f"Line {i}: the quick brown fox.\n\n  code\n\tx = {i}\n" for i in range(200))
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    streamed = list(token_stream(stream_corpus(str(path), block_bytes=100), gpt2_tokenizer))
    assert streamed == list(token_stream(load_corpus(str(path)).documents, gpt2_tokenizer))


def test_pieces_tokenise_like_the_whole_file_across_blank_lines(tmp_path: Path, gpt2_tokenizer) -> None:
    text = "".join(f"Paragraph {i} ends here.\n\n" + ("Crlf line.\r\n" if i % 2 else "") for i in range(100))
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8", newline="")
    streamed = list(token_stream(stream_corpus(str(path), block_bytes=50), gpt2_tokenizer))
    assert streamed == list(token_stream(load_corpus(str(path)).documents, gpt2_tokenizer))


def test_a_single_line_file_streams_in_bounded_pieces(tmp_path: Path, gpt2_tokenizer) -> None:
    text = " ".join(f"word{i}, and more" for i in range(2000))  # about 34 kB, no newline
    path = tmp_path / "line.txt"
    path.write_text(text, encoding="utf-8")
    stream = stream_corpus(str(path), block_bytes=1000)
    pieces = [piece for document in stream for piece in document]
    assert len(pieces) > 30 and max(map(len, pieces)) <= 2000 and "".join(pieces) == text
    assert stream.fingerprint == load_corpus(str(path)).fingerprint
    whole = gpt2_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert list(token_stream(stream_corpus(str(path), block_bytes=1000), gpt2_tokenizer)) == [
        *whole,
        gpt2_tokenizer.eos_token_id,
    ]


@pytest.mark.parametrize(
    "text",
    [
        "".join(f"Line {i}: x = {i}.\n\n  indented\r\n" for i in range(300)),
        " ".join(f"w{i}" for i in range(3000)),  # one line
        "é" * 5000,  # no whitespace at all: hard cuts
        " \n" * 3000,  # whitespace only
    ],
)
def test_split_text_gives_bounded_pieces_that_join_to_the_text(text: str) -> None:
    pieces = list(split_text(text, 500))
    assert "".join(pieces) == text
    assert all(0 < len(piece) <= 500 for piece in pieces)
    assert list(split_text("", 500)) == [] and list(split_text("short", 500)) == ["short"]


def test_split_text_cuts_where_gpt2_tokenises_the_same(gpt2_tokenizer) -> None:
    text = "".join(f"Line {i}: the fox, x = {i}.\n\n  code\r\n\tend {i} words here" for i in range(200))
    encode = lambda piece: gpt2_tokenizer(piece, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert [t for piece in split_text(text, 300) for t in encode(piece)] == encode(text)


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
