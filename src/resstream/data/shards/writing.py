"""Writing a shard store: tokenising a corpus too large for one cache file (paper-scale training)
into shards, in parallel, resumably.

`write_shards(corpus, tokenizer, out_dir)` tokenises a corpus (a `Corpus`, or a `CorpusStream`
such as a Hugging Face dataset streamed row by row) into ``shard-00000.bin``,
``shard-00001.bin``, ... of `shard_tokens` ids each (the last one shorter), raw little-endian
``uint16`` (vocabulary <= 65536) or ``uint32``. The ids are exactly those of
`resstream.data.tokens.build_token_cache` for the same corpus and tokenizer: every document
encoded without special tokens, eos after each one.

Rules
-----
* **Parallel, deterministic.** The corpus is read in this process and cut into batches of
  tokenizer items (pieces of text, and document ends: `tokens.document_items`); `workers`
  processes encode the batches, and their results are written in the order the batches were
  made, so the shards do not depend on `workers`. At most a few batches per worker are in
  flight: memory does not grow with the corpus (a batch holds about 256 kB of text).
* **Manifest.** ``manifest.json`` (`resstream.data.shards.manifest`) is rewritten (atomically)
  after each shard, with per shard its file, token count, sha256 and where the corpus stood
  when it was full: `documents` (documents whose every id, eos included, lies in this shard or
  an earlier one), `resume_items` and `resume_tokens` (the last item boundary at or before the
  shard's end, and the number of ids before it).
* **Resume.** A run interrupted after k shards restarts by reading (not encoding) the corpus up
  to the k-th shard's `resume_items`, encodes from there and drops the ids that shard already
  holds; the first k shards are not rewritten. A complete store for the same corpus and
  tokenizer is reused as it is.
* **Checksums.** Each shard's sha256 is computed from the bytes as they are written (no second
  read). `write_shards` re-hashes every shard when it reuses or resumes a store
  (`verification.check_shard_files`).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import multiprocessing
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from resstream.data.files import Document
from resstream.data.shards.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    read_manifest,
    shard_name,
    store_fingerprint,
)
from resstream.data.shards.verification import check_shard_files
from resstream.data.sources import Corpus, CorpusStream
from resstream.data.tokenizer import tokenizer_fingerprint
from resstream.data.tokens import (
    document_items,
    encode_items,
    id_bound,
    item_batches,
    plain_backend,
    token_dtype,
)
from resstream.errors import UsageError
from resstream.io import atomic_path, write_json
from resstream.resources import usable_cpus
from resstream.rundir import locked_directory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

#: Default ids per shard: 100 million (200 MB as uint16), as FineWeb-Edu's own shards.
SHARD_TOKENS = 100_000_000
#: Batches in flight per worker: enough to keep every worker busy, few enough to bound memory.
_IN_FLIGHT_PER_WORKER = 3


def default_workers() -> int:
    """min(8, the CPUs this process may use)."""
    return min(8, usable_cpus())


@dataclass(frozen=True)
class StoreSummary:
    """What `write_shards` did."""

    directory: Path
    shards: int  # in the store
    tokens: int  # in the store
    written_shards: int  # by this call (0: a complete store was reused)
    written_tokens: int  # by this call
    seconds: float
    fingerprint: str

    @property
    def tokens_per_s(self) -> float:
        """Ids this call wrote per second (0 when it wrote none)."""
        return self.written_tokens / self.seconds if self.written_tokens and self.seconds > 0 else 0.0


def check_shard_settings(shard_tokens: int, workers: int | None) -> tuple[int, int]:
    """`shard_tokens` and `workers` checked (UsageError naming the bad one), `workers` None
    resolved to `default_workers()`: cheap, so a command can refuse them before it loads anything."""
    shard_tokens = _positive_int(shard_tokens, "shard_tokens")
    return shard_tokens, default_workers() if workers is None else _positive_int(workers, "workers")


def write_shards(
    corpus: Corpus | CorpusStream,
    tokenizer: PreTrainedTokenizerFast,
    out_dir: str | os.PathLike[str],
    *,
    shard_tokens: int = SHARD_TOKENS,
    workers: int | None = None,
    tokenizer_name: str | None = None,
    progress: bool = False,
) -> StoreSummary:
    """Tokenise `corpus` into a shard store in `out_dir`, resume an interrupted one, or reuse a
    complete one (module docstring). `tokenizer_name` is recorded in the manifest (how to load
    the tokenizer again; default: its `name_or_path`). Raises UsageError for bad `shard_tokens`
    or `workers`, and for an `out_dir` that holds another store (another tokenizer, corpus or
    `shard_tokens`), files of something else, or a store whose files do not match its manifest.
    """
    shard_tokens, workers = check_shard_settings(shard_tokens, workers)
    started = time.perf_counter()
    directory = Path(out_dir)
    with locked_directory(directory, "tokenize", param="out_dir"):
        header = _header(corpus, tokenizer, shard_tokens, tokenizer_name)
        manifest = _existing_manifest(directory, header)
        if manifest is not None and manifest["complete"]:
            return _summary(directory, manifest, 0, 0, time.perf_counter() - started)
        manifest = manifest or {**header, "complete": False, "shards": []}
        before = len(manifest["shards"])
        writer = _StoreWriter(directory, manifest)
        with plain_backend(tokenizer) as backend:
            state = backend.to_str()
        documents = corpus.documents if isinstance(corpus, Corpus) else corpus
        with _progress(progress) as bar:
            writer.write(
                _encoded(documents, state, tokenizer.eos_token_id, workers, writer.resume_items), bar
            )
        manifest["corpus"]["fingerprint"] = corpus.fingerprint
        manifest["fingerprint"] = store_fingerprint(manifest)
        write_json(directory / MANIFEST, manifest)
        tokens = sum(s["tokens"] for s in manifest["shards"][before:])
        return _summary(
            directory, manifest, len(manifest["shards"]) - before, tokens, time.perf_counter() - started
        )


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"`{name}` {value!r} must be a whole number >= 1")
    return value


def _header(
    corpus: Corpus | CorpusStream, tokenizer: PreTrainedTokenizerFast, shard_tokens: int, name: str | None
) -> dict[str, Any]:
    """The manifest's fields that a resumed or reused store must share with this call."""
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "dtype": token_dtype(id_bound(tokenizer)).name,
        "shard_tokens": shard_tokens,
        "tokenizer": {
            "name": name or str(getattr(tokenizer, "name_or_path", "") or "") or None,
            "fingerprint": tokenizer_fingerprint(tokenizer),
            "vocab_size": len(tokenizer),
            "eos_token_id": tokenizer.eos_token_id,
        },
        "corpus": {"name": corpus.name, "origin": corpus.origin, "fingerprint": None, "documents": None},
    }


def _existing_manifest(directory: Path, header: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of the store in `directory` when it was made from the same inputs (its
    shards checked against it), None for an empty directory; UsageError otherwise."""
    where = f"`out_dir` {str(directory)!r}"
    if not (directory / MANIFEST).is_file():
        others = sorted(p.name for p in directory.iterdir() if not _store_file(p.name))
        if others:
            raise UsageError(
                f"{where} holds files that are not a shard store ({others[0]!r}); choose another `out_dir`"
            )
        return None
    manifest = read_manifest(directory)
    for key, what in (("tokenizer", "tokenizer"), ("corpus", "corpus"), ("shard_tokens", "`shard_tokens`")):
        if not _same(manifest[key], header[key]):
            raise UsageError(
                f"{where} holds a shard store of another {what} ({_describe(key, manifest[key])}, not "
                f"{_describe(key, header[key])}); choose another `out_dir`"
            )
    check_shard_files(directory, manifest, verify=True)
    return manifest


def _same(stored: Any, given: Any) -> bool:
    """Whether a manifest field matches this call's (a corpus's fingerprint and size are only
    known at the end, so they are not compared)."""
    if isinstance(stored, dict) and "fingerprint" in stored and "origin" in stored:
        return (stored["name"], stored["origin"]) == (given["name"], given["origin"])
    if isinstance(stored, dict):
        return stored["fingerprint"] == given["fingerprint"]
    return stored == given


def _describe(key: str, value: Any) -> str:
    if key == "tokenizer":
        return f"tokenizer {value.get('name')!r}, fingerprint {value['fingerprint']}"
    if key == "corpus":
        return f"corpus {value['name']!r} from {value['origin']}"
    return f"{value} ids per shard"


def _store_file(name: str) -> bool:
    """Files a store may hold: its shards, its manifest, the lock and temporary files."""
    return (name.startswith("shard-") and name.endswith(".bin")) or name == MANIFEST or name.startswith(".")


class _StoreWriter:
    """Appends encoded batches to the store's shards, one shard file at a time, rewriting the
    manifest after each shard (module docstring)."""

    def __init__(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.directory = directory
        self.manifest = manifest
        self.dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
        self.shard_tokens = int(manifest["shard_tokens"])
        last = manifest["shards"][-1] if manifest["shards"] else None
        self.resume_items = last["resume_items"] if last else 0
        self.items = self.resume_items  # items consumed
        self.documents = last["documents"] if last else 0  # documents complete among them
        self.position = last["resume_tokens"] if last else 0  # ids of those items
        self.stored = sum(s["tokens"] for s in manifest["shards"])  # ids in the stored shards
        self._shard: _ShardFile | None = None

    def write(self, encoded: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], bar: Any) -> None:
        """Write the batches' ids (less those the stored shards hold already), then the last
        shorter shard, and mark the store complete. On failure the shard being filled is
        removed: the store keeps its complete shards."""
        try:
            for ends_document, ids, lengths in encoded:
                self._append(ends_document, ids, lengths)
                bar.update(len(ids))
                bar.set_postfix(documents=self.documents, refresh=False)
            if self._shard is not None:
                self._finish_shard((self.items, self.documents, self.position))
        except BaseException as exc:
            if self._shard is not None:
                self._shard.abandon(exc)
            raise
        self.manifest.update(complete=True, total_tokens=self.stored)
        self.manifest["corpus"]["documents"] = self.documents

    def _append(self, ends_document: np.ndarray, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Add one batch: `ends_document[i]` says whether item i ends a document, `lengths[i]`
        how many of `ids` it gave."""
        ends = self.position + np.cumsum(lengths)  # ids up to the end of each item
        documents = self.documents + np.cumsum(ends_document)  # documents complete after each item
        start = max(0, min(len(ids), self.stored - self.position))  # the stored shards hold these
        while start < len(ids):
            if self._shard is None:
                self._shard = _ShardFile(self.directory / shard_name(len(self.manifest["shards"])))
            take = min(len(ids) - start, self.shard_tokens - self._shard.tokens)
            self._shard.add(ids[start : start + take].astype(self.dtype))
            start += take
            if self._shard.tokens == self.shard_tokens:
                k = int(np.searchsorted(ends, self.stored + self.shard_tokens, side="right"))
                before = (self.items + k, int(documents[k - 1]), int(ends[k - 1])) if k else None
                self._finish_shard(before or (self.items, self.documents, self.position))
        if len(lengths):
            self.items += len(lengths)
            self.documents = int(documents[-1])
            self.position = int(ends[-1])

    def _finish_shard(self, boundary: tuple[int, int, int]) -> None:
        """Move the shard into place and record it, with the last item boundary at or before
        its end (items, documents, ids), in the manifest."""
        assert self._shard is not None
        items, documents, tokens = boundary
        entry = self._shard.close()
        entry.update(documents=documents, resume_items=items, resume_tokens=tokens)
        self.manifest["shards"].append(entry)
        self.stored += entry["tokens"]
        self._shard = None
        write_json(self.directory / MANIFEST, self.manifest)


class _ShardFile:
    """One shard being written: a temporary file beside its final name, and its sha256."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tokens = 0
        self.digest = hashlib.sha256()
        self._stack = contextlib.ExitStack()
        temporary = self._stack.enter_context(atomic_path(path))
        self._handle = self._stack.enter_context(open(temporary, "wb"))  # noqa: SIM115

    def add(self, ids: np.ndarray) -> None:
        data = ids.tobytes()
        self._handle.write(data)
        self.digest.update(data)
        self.tokens += len(ids)

    def close(self) -> dict[str, Any]:
        """Move the file into place; its manifest entry (file, tokens, sha256)."""
        self._stack.close()
        return {"file": self.path.name, "tokens": self.tokens, "sha256": self.digest.hexdigest()[:16]}

    def abandon(self, exc: BaseException) -> None:
        """Remove the temporary file (the final name never appears)."""
        self._stack.__exit__(type(exc), exc, exc.__traceback__)


def _encoded(
    documents: Iterable[Document], backend_state: str, eos_token_id: int | None, workers: int, skip_items: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(ends_document, ids, lengths) of each batch of the corpus's items after the first
    `skip_items` (read, not encoded), in order; `workers` processes encode them."""
    items = document_items(documents)
    collections.deque(itertools.islice(items, skip_items), maxlen=0)
    # fork, not spawn: spawn re-imports the caller's main module (a script without a main guard
    # would run again); the workers' tokenizers never use the Rayon pool a fork may inherit
    context = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    )
    pool = ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=(backend_state, eos_token_id)
    )
    pending: collections.deque[tuple[np.ndarray, Future]] = collections.deque()
    try:
        for batch in item_batches(items):
            ends_document = np.fromiter((item is None for item in batch), dtype=bool, count=len(batch))
            pending.append((ends_document, pool.submit(_encode_in_worker, batch)))
            if len(pending) >= workers * _IN_FLIGHT_PER_WORKER:
                ends_document, future = pending.popleft()
                yield ends_document, *future.result()
        while pending:
            ends_document, future = pending.popleft()
            yield ends_document, *future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_worker_backend: Any = None
_worker_eos: int | None = None


def _start_worker(backend_state: str, eos_token_id: int | None) -> None:
    """A worker's tokenizer, single-threaded (the workers are the parallelism)."""
    global _worker_backend, _worker_eos
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    from tokenizers import Tokenizer

    _worker_backend = Tokenizer.from_str(backend_state)
    _worker_eos = eos_token_id


def _encode_in_worker(batch: list[str | None]) -> tuple[np.ndarray, np.ndarray]:
    return encode_items(_worker_backend, batch, _worker_eos)


def _progress(show: bool) -> Any:
    from tqdm import tqdm

    return tqdm(disable=not show, unit="tok", unit_scale=True, desc="tokenising", leave=False)


def _summary(
    directory: Path, manifest: dict[str, Any], written: int, tokens: int, seconds: float
) -> StoreSummary:
    return StoreSummary(
        directory=directory,
        shards=len(manifest["shards"]),
        tokens=int(manifest["total_tokens"]),
        written_shards=written,
        written_tokens=tokens,
        seconds=seconds,
        fingerprint=manifest["fingerprint"],
    )
