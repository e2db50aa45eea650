"""Reading corpus files: strict UTF-8 text, whole or in pieces, and `.jsonl` rows.

Text is cut into pieces only where a byte-level BPE pre-tokeniser (GPT-2, NeoX, Llama-3 and
resstream's own BPE) splits it anyway, so the pieces' tokens equal those of the whole text:
just after a newline that has a non-blank character on each side, else just before a single
space between two non-blank characters (`split_text`). A window with neither (a run of
letters without spaces, or only whitespace) is cut at its end: the one place where the tokens
may differ, and the price of bounded memory. Tokenizers that add a prefix space to every call
(SentencePiece "▁") may also differ at cuts after a newline.

Every failure is a one-line `UsageError` that names the file: missing or unreadable, not
UTF-8 (with the byte and its offset in the file), a `.jsonl` line that is not JSON or has no
string ``text`` field, or ``input_ids`` that are not non-negative integers. A leading UTF-8
byte-order mark is dropped.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resstream.errors import UsageError

#: Piece size of streamed text files: files up to this size are one piece, read whole.
STREAM_BLOCK_BYTES = 2**20

#: The longest text handed to a tokenizer in one call: its memory grows about 100-fold with the
#: text it holds, so a longer document is tokenised in pieces (`tokenizer_pieces`).
TOKENIZER_PIECE_CHARS = 1 << 16

#: Where a piece may end: (separator, cut offset from it): after a newline, before a space.
_CUTS = (("\n", 1), (" ", 0))

_UTF8_BOM = codecs.BOM_UTF8


@dataclass(frozen=True)
class Pieces:
    """One document handed out in consecutive pieces; `length` is its UTF-8 byte length."""

    length: int
    pieces: Iterator[str]

    def __iter__(self) -> Iterator[str]:
        return self.pieces


#: A document as a stream hands it out: whole, or in pieces.
Document = str | Pieces


def read_text(path: Path, what: str = "file", *, alternative: str = "") -> str:
    """A file's text, strictly UTF-8 (a leading BOM is dropped).

    `what` names the path in messages ("file", or a parameter name in backticks);
    `alternative` ends the advice given for a directory (e.g. " or `text`").
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _unreadable(path, exc, what, alternative) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, data, exc.start, 0, what) from None
    return text.removeprefix("\ufeff")


def check_readable(path: Path, what: str = "file") -> None:
    """UsageError when `path` cannot be opened for reading (missing, a directory, not allowed)."""
    _open(path, what).close()


def text_document(path: Path, block_bytes: int) -> Pieces:
    """The UTF-8 text of `path` as one document in pieces of about `block_bytes`.

    Pieces end where `split_text` cuts (at the end of a block where that finds no place);
    the file is read while the pieces are consumed.
    """
    with _open(path) as handle:
        skip = len(_UTF8_BOM) if handle.read(len(_UTF8_BOM)) == _UTF8_BOM else 0
        size = os.fstat(handle.fileno()).st_size
    return Pieces(size - skip, _text_pieces(path, skip, block_bytes))


def split_text(text: str, max_chars: int = TOKENIZER_PIECE_CHARS) -> Iterator[str]:
    """`text` in consecutive pieces of at most `max_chars` characters, each cut at the last
    safe place in its window (module docstring); the pieces join back to `text`."""
    start = 0
    while len(text) - start > max_chars:
        stop = start + max_chars
        cut = _last_cut(text, start, stop) or stop
        yield text[start:cut]
        start = cut
    if start < len(text):
        yield text[start:]


def tokenizer_pieces(document: str | Iterable[str], max_chars: int = TOKENIZER_PIECE_CHARS) -> Iterator[str]:
    """The text of a document (a string, or its consecutive pieces) in pieces small enough
    for one tokenizer call (`split_text`)."""
    for piece in (document,) if isinstance(document, str) else document:
        yield from split_text(piece, max_chars)


def jsonl_texts(path: Path) -> Iterator[str]:
    """The 'text' of each row of a `.jsonl` file, read row by row."""
    rows = enumerate(_jsonl_rows(path), start=1)
    first_text: str | None = None  # the name of the first row, once one has given a text
    for number, (lineno, row) in rows:
        text = row.get("text") if isinstance(row, dict) else None
        if not isinstance(text, str):
            raise _not_a_text_row(path, _row_name(number, lineno), lineno, row, first_text, rows)
        first_text = first_text or _row_name(number, lineno)
        yield text


def _not_a_text_row(
    path: Path, name: str, lineno: int, row: Any, first_text: str | None, rest: Iterator[tuple[int, Any]]
) -> UsageError:
    """The error for a `.jsonl` row without a string 'text': a file that mixes rows of token ids
    and rows of text is named as such (the `rest` of the rows is read to find out)."""
    if not (isinstance(row, dict) and "input_ids" in row):
        return UsageError(f"file {str(path)!r} line {lineno} has no string field 'text'")
    if first_text is None:  # the first row: a file of token ids, or a mixed one?
        first_text = next(
            (
                _row_name(n, line)
                for n, (line, r) in rest
                if isinstance(r, dict) and isinstance(r.get("text"), str)
            ),
            None,
        )
        if first_text is not None:
            return _mixed_rows(path, (name, "input_ids"), (first_text, "text"))
        return UsageError(
            f"file {str(path)!r} line {lineno} has no string field 'text' (its rows carry "
            f"'input_ids': pre-tokenised rows are read by load_token_rows)"
        )
    return _mixed_rows(path, (first_text, "text"), (name, "input_ids"))


def load_token_rows(path: str | os.PathLike[str]) -> list[list[int]] | None:
    """The `input_ids` of a pre-tokenised `.jsonl` file, one list per row.

    Returns None when `path` is not a `.jsonl` file, has no rows, or no row has `input_ids`
    (then it is a text file for `load_corpus`); a file that mixes rows with and without
    `input_ids` is a `UsageError` naming the first row of each kind. Such rows are used
    exactly as given: no re-tokenisation, no BOS added.
    """
    path = Path(path)
    if path.suffix.lower() != ".jsonl":
        return None
    rows = list(_jsonl_rows(path))
    kinds = [isinstance(row, dict) and "input_ids" in row for _, row in rows]
    if not any(kinds):
        return None
    if not all(kinds):
        _refuse_mixed(path, rows, kinds)
    return [_check_ids(path, lineno, row["input_ids"]) for lineno, row in rows]


# --------------------------------------------------------------------------- helpers


def _not_utf8(path: Path, data: bytes, index: int, offset: int, what: str = "file") -> UsageError:
    """The one-line error for invalid UTF-8 at `data[index]`, `data` starting at file `offset`."""
    return UsageError(
        f"{what} {str(path)!r} is not UTF-8 text: byte 0x{data[index]:02x} at byte offset {offset + index}"
    )


def _unreadable(path: Path, exc: OSError, what: str = "file", alternative: str = "") -> UsageError:
    """The one-line error for a path that cannot be opened: missing, a directory, not allowed."""
    if isinstance(exc, FileNotFoundError):
        return UsageError(f"{what} {str(path)!r} does not exist")
    if isinstance(exc, IsADirectoryError):
        return UsageError(f"{what} {str(path)!r} is a directory; give a UTF-8 text file{alternative}")
    reason = "permission denied" if isinstance(exc, PermissionError) else (exc.strerror or str(exc))
    return UsageError(f"{what} {str(path)!r} cannot be read: {reason}")


def _open(path: Path, what: str = "file") -> Any:
    try:
        return path.open("rb")
    except OSError as exc:
        raise _unreadable(path, exc, what) from None


def _text_pieces(path: Path, skip: int, block_bytes: int) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    pending = ""
    with _open(path) as handle:
        handle.seek(skip)
        offset = skip  # file offset just past the bytes fed to the decoder
        while True:
            chunk = handle.read(max(block_bytes, 1))
            buffered = decoder.getstate()[0]
            try:
                pending += decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                raise _not_utf8(path, buffered + chunk, exc.start, offset - len(buffered)) from None
            offset += len(chunk)
            if not chunk:
                break
            cut = _last_cut(pending) or (len(pending) if len(pending) >= block_bytes else 0)
            if cut:
                yield pending[:cut]
                pending = pending[cut:]
    if pending:
        yield pending


def _last_cut(text: str, start: int = 0, stop: int | None = None) -> int:
    """Index of the last safe cut in ``text[start:stop]`` (see `split_text`), or 0 when none.

    A cut needs the characters on both sides of its separator, so one at the very end of
    the window waits for the text after it.
    """
    stop = len(text) if stop is None else stop
    for separator, after in _CUTS:
        index = text.rfind(separator, start + 1, stop - 1)
        while index > start:
            if not text[index - 1].isspace() and not text[index + 1].isspace():
                return index + after
            index = text.rfind(separator, start + 1, index)
    return 0


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed row) for each non-blank line of a `.jsonl` file, read line by line."""
    offset = 0
    with _open(path) as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _not_utf8(path, raw, exc.start, offset) from None
            offset += len(raw)
            if lineno == 1:
                line = line.removeprefix("\ufeff")
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"file {str(path)!r} line {lineno} is not valid JSON: {exc.msg}") from None


def _row_name(number: int, lineno: int) -> str:
    """'row N' (the N-th non-blank line of a `.jsonl`), with its line number where that differs."""
    return f"row {number}" if number == lineno else f"row {number} (line {lineno})"


def _mixed_rows(path: Path, first: tuple[str, str], second: tuple[str, str]) -> UsageError:
    """The error for a `.jsonl` whose rows `first` and `second` (name, field) differ in kind."""
    return UsageError(
        f"file {str(path)!r} mixes 'input_ids' rows and 'text' rows: {first[0]} has '{first[1]}', "
        f"{second[0]} has '{second[1]}'; give every row 'input_ids' (token ids, used as given) "
        f"or every row 'text'"
    )


def _refuse_mixed(path: Path, rows: list[tuple[int, Any]], kinds: list[bool]) -> None:
    """Raise for a `.jsonl` where some rows carry 'input_ids' (`kinds`) and some do not."""
    other = kinds.index(not kinds[0])
    names = [_row_name(number + 1, rows[number][0]) for number in (0, other)]
    fields = ["input_ids" if kinds[number] else "text" for number in (0, other)]
    without_ids = rows[kinds.index(False)][1]
    if not (isinstance(without_ids, dict) and isinstance(without_ids.get("text"), str)):
        number = kinds.index(False)
        raise UsageError(
            f"file {str(path)!r} {_row_name(number + 1, rows[number][0])} has neither 'input_ids' "
            f"nor a string field 'text' (other rows carry 'input_ids')"
        )
    raise _mixed_rows(path, (names[0], fields[0]), (names[1], fields[1]))


def _check_ids(path: Path, lineno: int, ids: Any) -> list[int]:
    if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
        raise UsageError(
            f"file {str(path)!r} line {lineno}: 'input_ids' must be a list of non-negative integers"
        )
    return ids
