"""Token ids for training: tokenisation, the train/validation split and an on-disk cache.

Rules
-----
* Documents are encoded without the tokenizer's own special tokens (no BOS) and
  concatenated, with the tokenizer's eos id after every document when it has one.
* Validation is the contiguous tail of that stream: the last
  ``floor(n_tokens * val_fraction)`` tokens (0 < val_fraction <= 0.5); training is the
  rest. The split ignores document boundaries, so a document may straddle it.
* The cache file ``<cache_dir>/tokens-<fingerprint>.bin`` holds the ids as raw
  little-endian ``uint16`` (vocabulary <= 65536) or ``uint32``; a sidecar
  ``tokens-<fingerprint>.json`` records counts, dtype and where the ids came from. The
  fingerprint covers the corpus text, the tokenizer, `val_fraction` and the format
  version, so changed inputs never reuse an old file. The sidecar is written last: a
  `.bin` without a matching sidecar (or of the wrong size) is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from resstream.data.files import Document, tokenizer_pieces
from resstream.data.sources import Corpus, CorpusStream
from resstream.data.tokenizer import tokenizer_fingerprint
from resstream.errors import RunError, UsageError, short_reason
from resstream.io import atomic_path, write_json
from resstream.resources import format_bytes
from resstream.rundir import free_bytes

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

FORMAT_VERSION = 1
MIN_VAL_TOKENS = 2
_BATCH_CHARS = 1 << 18  # encode about 256 kB of text per batch (the tokenizer needs ~100x that)
_BATCH_DOCS = 1024
_PROGRESS_DOCS = 1000  # show a progress bar from this many documents on


class TokenIds(Protocol):
    """A 1-D run of token ids that slices without reading: a (memory-mapped) `np.ndarray`, or
    a view over a shard store (`resstream.data.shards.ShardedTokens`). `np.asarray` reads it."""

    @property
    def dtype(self) -> np.dtype[Any]: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: slice, /) -> TokenIds: ...

    def __array__(self) -> np.ndarray: ...


@dataclass(frozen=True)
class TokenSplits:
    """The cached token stream, split into training and validation parts."""

    train: TokenIds  # 1-D read-only ids: an np.memmap, or a view over a shard store
    val: TokenIds  # 1-D read-only ids, the tail of the stream
    fingerprint: str  # of (corpus, tokenizer, val_fraction, format version)
    path: Path  # the cache file (.bin)
    vocab_size: int  # len(tokenizer), added tokens included


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocabulary <= 65536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def tokenize_documents(
    documents: Iterable[Document],
    tokenizer: PreTrainedTokenizerFast,
    *,
    progress: bool | None = None,
    limit: int | None = None,
) -> np.ndarray:
    """All documents' ids concatenated, eos after each one (when the tokenizer has an eos).

    The ids of `token_chunks`, in one array: uint16 when the vocabulary has at most 65536
    tokens, else uint32. `progress`: show a tqdm bar; None shows one from 1000 documents on.
    `limit`: stop after the chunk that reaches `limit` ids (at least that many, when the corpus
    has them): a prefix of the whole stream, since chunks are cut where the ids do not change.
    """
    dtype = token_dtype(id_bound(tokenizer))
    parts, count = [], 0
    for chunk in token_chunks(documents, tokenizer, progress=progress):
        parts.append(chunk.astype(dtype))
        count += len(chunk)
        if limit is not None and count >= limit:
            break
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def token_chunks(
    documents: Iterable[Document], tokenizer: PreTrainedTokenizerFast, *, progress: bool | None = None
) -> Iterator[np.ndarray]:
    """The token stream of `tokenize_documents` in consecutive uint32 chunks, computed as they
    are consumed: memory holds one batch of about `_BATCH_CHARS` characters, whatever the size
    of the corpus or of one document.

    A document is a string or its consecutive pieces (a streamed file); it reaches the Rust
    tokenizer in pieces of at most `TOKENIZER_PIECE_CHARS` characters, cut where the
    tokens do not change (`resstream.data.files.split_text`), in batches (no truncation, no
    special tokens added). `progress`: a tqdm bar counting documents (None: from 1000 on,
    when the number of documents is known).
    """
    total = len(documents) if isinstance(documents, Sized) else None
    show = (total or 0) >= _PROGRESS_DOCS if progress is None else progress
    with plain_backend(tokenizer) as backend, _progress(total, show) as bar:
        for batch in item_batches(document_items(documents, on_document=lambda: bar.update(1))):
            yield encode_items(backend, batch, tokenizer.eos_token_id)[0]


def document_items(documents: Iterable[Document], on_document: Any = None) -> Iterator[str | None]:
    """The documents as the tokenizer's items: their text in pieces of at most
    `TOKENIZER_PIECE_CHARS` characters (`tokenizer_pieces`), None where a document ends.
    `on_document`: called (no arguments) after each document."""
    for document in documents:
        yield from tokenizer_pieces(document)
        yield None
        if on_document is not None:
            on_document()


def item_batches(items: Iterable[str | None]) -> Iterator[list[str | None]]:
    """`items` in consecutive batches of about `_BATCH_CHARS` characters (at most `_BATCH_DOCS`
    pieces each)."""
    batch: list[str | None] = []
    size = 0
    for item in items:
        batch.append(item)
        if item is None:
            continue
        size += len(item)
        if size >= _BATCH_CHARS or len(batch) >= _BATCH_DOCS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_items(
    backend: Any, batch: list[str | None], eos_token_id: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, lengths): the uint32 ids of a batch of `document_items` in one array, and how many
    of them each item gave. A piece is encoded by `backend` (a `tokenizers.Tokenizer` with
    truncation and padding off) without special tokens; None gives the eos id (nothing when
    `eos_token_id` is None)."""
    end = [] if eos_token_id is None else [eos_token_id]  # after each document
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    encodings = iter(encode([item for item in batch if item is not None], add_special_tokens=False))
    ids = [next(encodings).ids if item is not None else end for item in batch]
    lengths = np.fromiter((len(part) for part in ids), dtype=np.int64, count=len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=np.uint32, count=int(lengths.sum())), lengths


def id_bound(tokenizer: PreTrainedTokenizerFast) -> int:
    """One more than the largest token id the tokenizer can give (at least its length)."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)


def split_tokens(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, val): validation is the last ``floor(len * val_fraction)`` tokens.

    Raises UsageError when `val_fraction` is outside (0, 0.5] or the tail would hold
    fewer than 2 tokens.
    """
    cut = split_point(len(tokens), val_fraction)
    return tokens[:cut], tokens[cut:]


def split_point(n_tokens: int, val_fraction: float) -> int:
    """Where validation starts in a stream of `n_tokens` ids (`split_tokens`'s rule, and its
    UsageErrors)."""
    check_val_fraction(val_fraction)
    n_val = validation_size(n_tokens, val_fraction)
    if n_val < MIN_VAL_TOKENS:
        raise UsageError(
            f"{n_tokens} tokens are too few to split: val_fraction "
            f"{val_fraction} leaves {n_val} validation tokens "
            f"(at least {MIN_VAL_TOKENS} needed)"
        )
    return n_tokens - n_val


def validation_size(n_tokens: int, val_fraction: float) -> int:
    """floor(n_tokens * val_fraction), robust to float rounding (0.1 * 30 gives 3)."""
    return math.floor(n_tokens * val_fraction + 1e-9)


def check_val_fraction(val_fraction: float) -> float:
    """`val_fraction` if it lies in (0, 0.5], else a UsageError."""
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction <= 0.5:
        raise UsageError(f"val_fraction {val_fraction!r} is not allowed: it must be in (0, 0.5]")
    return float(val_fraction)


def check_cache_dir(cache_dir: str | os.PathLike[str]) -> Path:
    """`cache_dir` as a Path if the cache can be written there (it is made when missing);
    UsageError when it, or a folder above it, is a file, or it is not writable."""
    path = Path(cache_dir).expanduser()
    existing = next(p for p in (path, *path.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise UsageError(f"`cache_dir` {str(existing)!r} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            f"`cache_dir` {str(path)!r} cannot be written: permission denied on {str(existing)!r}"
        )
    return path


def cache_fingerprint(
    corpus: Corpus | CorpusStream,
    tokenizer: PreTrainedTokenizerFast,
    val_fraction: float,
) -> str:
    """sha256 (16 hex) of corpus, tokenizer, val_fraction and the cache format version."""
    key = {
        "format": FORMAT_VERSION,
        "corpus": corpus.fingerprint,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "val_fraction": repr(float(val_fraction)),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def build_token_cache(
    corpus: Corpus | CorpusStream,
    tokenizer: PreTrainedTokenizerFast,
    cache_dir: str | os.PathLike[str],
    *,
    val_fraction: float = 0.1,
) -> TokenSplits:
    """Tokenise `corpus` into `cache_dir` once, or reuse the cached file for the same inputs.

    `corpus` may be a stream (`stream_corpus`): it is read once to learn its fingerprint (if
    no pass has yet), and once more to tokenise it when the cache has no file for it. The
    ids are appended to the file chunk by chunk (`token_chunks`), so memory does not grow
    with the corpus. Returns read-only memory maps of the training and validation ids.
    """
    val_fraction = check_val_fraction(val_fraction)
    cache_dir = check_cache_dir(cache_dir)
    if isinstance(corpus, CorpusStream) and corpus.fingerprint is None:
        corpus.scan()
    fingerprint = cache_fingerprint(corpus, tokenizer, val_fraction)
    path = Path(cache_dir) / f"tokens-{fingerprint}.bin"
    meta = _read_sidecar(path, fingerprint)
    if meta is None:
        try:
            meta = _build(corpus, tokenizer, path, fingerprint, val_fraction)
        except OSError as exc:  # numpy's tofile reports a full disk with no errno
            raise RunError(
                f"cannot write the token cache into `cache_dir` {str(cache_dir)!r}: {short_reason(exc)} "
                f"({format_bytes(free_bytes(Path(cache_dir)))} free)"
            ) from None
    return _open(path, meta)


# --------------------------------------------------------------------------- helpers


def _build(
    corpus: Corpus | CorpusStream,
    tokenizer: PreTrainedTokenizerFast,
    path: Path,
    fingerprint: str,
    val_fraction: float,
) -> dict[str, Any]:
    """Tokenise `corpus` into `path`, chunk by chunk, then write the sidecar; the file appears
    only when it is complete and large enough to split."""
    dtype = token_dtype(id_bound(tokenizer)).newbyteorder("<")
    documents = corpus.documents if isinstance(corpus, Corpus) else corpus
    n_tokens = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        for chunk in token_chunks(documents, tokenizer):
            chunk.astype(dtype).tofile(handle)
            n_tokens += len(chunk)
        handle.flush()
        n_val = validation_size(n_tokens, val_fraction)
        if n_val < MIN_VAL_TOKENS:
            raise UsageError(
                f"dataset {corpus.name!r} is too small: {n_tokens} tokens give "
                f"{n_val} validation tokens at val_fraction {val_fraction} "
                f"(at least {MIN_VAL_TOKENS} needed)"
            )
    meta = {
        "format": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "dtype": dtype.name,
        "n_tokens": n_tokens,
        "n_train": int(n_tokens - n_val),
        "n_val": int(n_val),
        "val_fraction": val_fraction,
        "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "corpus": {
            "name": corpus.name,
            "origin": corpus.origin,
            "fingerprint": corpus.fingerprint,
            "n_documents": len(corpus.documents) if isinstance(corpus, Corpus) else corpus.n_documents,
        },
    }
    write_json(path.with_suffix(".json"), meta)
    return meta


def _read_sidecar(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The sidecar of a complete, consistent cache file, or None (then rebuild)."""
    try:
        meta = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        dtype = np.dtype(meta["dtype"])
        ok = (
            meta["format"] == FORMAT_VERSION
            and meta["fingerprint"] == fingerprint
            and dtype in (np.uint16, np.uint32)
            and meta["n_train"] + meta["n_val"] == meta["n_tokens"]
            and meta["n_val"] >= MIN_VAL_TOKENS
            and path.stat().st_size == meta["n_tokens"] * dtype.itemsize
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta if ok else None


def _open(path: Path, meta: dict[str, Any]) -> TokenSplits:
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    data = np.memmap(path, dtype=dtype, mode="r", shape=(meta["n_tokens"],))
    cut = meta["n_train"]
    return TokenSplits(
        train=data[:cut],
        val=data[cut:],
        fingerprint=meta["fingerprint"],
        path=path,
        vocab_size=int(meta["vocab_size"]),
    )


@contextlib.contextmanager
def plain_backend(tokenizer: PreTrainedTokenizerFast) -> Iterator[Any]:
    """The tokenizer's Rust backend with truncation and padding off (restored afterwards)."""
    backend = tokenizer.backend_tokenizer
    truncation, padding = backend.truncation, backend.padding
    backend.no_truncation()
    backend.no_padding()
    try:
        yield backend
    finally:
        if truncation:
            backend.enable_truncation(**truncation)
        if padding:
            backend.enable_padding(**padding)


def _progress(total: int | None, show: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, disable=not show, unit="doc", desc="tokenising", leave=False)


__all__ = [
    "FORMAT_VERSION",
    "TokenIds",
    "TokenSplits",
    "build_token_cache",
    "cache_fingerprint",
    "check_cache_dir",
    "check_val_fraction",
    "split_point",
    "split_tokens",
    "token_dtype",
    "tokenize_documents",
    "validation_size",
]
