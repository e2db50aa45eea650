"""A sharded token store for corpora too large for one cache file (paper-scale training).

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
* **Manifest.** ``manifest.json`` is rewritten (atomically) after each shard: format version,
  tokenizer (spec and fingerprint), corpus (name, origin; its fingerprint once the whole corpus
  has been read), dtype, `shard_tokens`, and per shard its file, token count, sha256 and where
  the corpus stood when it was full: `documents` (documents whose every id, eos included, lies
  in this shard or an earlier one), `resume_items` and `resume_tokens` (the last item boundary
  at or before the shard's end, and the number of ids before it). When the corpus is done:
  `complete`, `total_tokens` and the store's `fingerprint`.
* **Resume.** A run interrupted after k shards restarts by reading (not encoding) the corpus up
  to the k-th shard's `resume_items`, encodes from there and drops the ids that shard already
  holds; the first k shards are not rewritten. A complete store for the same corpus and
  tokenizer is reused as it is.
* **Checksums.** sha256 of each shard (16 hex digits, as every resstream fingerprint),
  computed from the bytes as they are written (no second read). Hashing runs at about 1 GB/s,
  hundreds of times faster than tokenising, so a cheaper checksum would save nothing
  measurable. `ShardedTokens.open` (and so `store_splits`, which training uses) checks every
  shard's size and, by default, its sha256 (`verify_shards`): once per file, the verification
  recorded in the cache directory under the file's identity (device, inode, size, mtime,
  ctime) and expected sha256, so a later open of the unchanged store reads nothing. A store
  may be read-only and shared, so nothing is written into it. `write_shards` re-hashes every
  shard when it reuses or resumes a store.
* **Confined to its folder.** A store is often unpacked from an archive made by someone else:
  a shard's `file` must be a plain name (no path separator, no ``..``, not absolute), and a
  shard that is a symbolic link (wherever it points) or not a regular file is refused, so
  reading a store never reads outside its folder. Every manifest field that sizes or locates a
  read (`dtype`, each shard's `file`, `tokens`, `sha256`) is checked before anything is read,
  and a complete store's recorded fingerprint must be the one its fields give.

`ShardedTokens` reads a store: a 1-D, read-only, sliceable view over the shards' memory maps,
split into training and validation parts by `tokens.split_tokens`'s rule.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import hashlib
import itertools
import json
import multiprocessing
import os
import re
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from resstream.data.files import Document
from resstream.data.sources import Corpus, CorpusStream
from resstream.data.tokenizer import tokenizer_fingerprint
from resstream.data.tokens import (
    TokenSplits,
    document_items,
    encode_items,
    id_bound,
    item_batches,
    plain_backend,
    split_tokens,
    token_dtype,
)
from resstream.errors import ResstreamError, UsageError, short_reason
from resstream.io import UntrustedEntry, atomic_path, kind_of, not_a_plain_name, open_in_folder, write_json
from resstream.rundir import locked_directory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

MANIFEST = "manifest.json"
FORMAT = "resstream-shards"
FORMAT_VERSION = 1
#: Default ids per shard: 100 million (200 MB as uint16), as FineWeb-Edu's own shards.
SHARD_TOKENS = 100_000_000
#: Batches in flight per worker: enough to keep every worker busy, few enough to bound memory.
_IN_FLIGHT_PER_WORKER = 3


def shard_name(index: int) -> str:
    """The file name of shard `index`: ``shard-00000.bin``."""
    return f"shard-{index:05d}.bin"


def default_workers() -> int:
    """min(8, the CPUs this process may use)."""
    return min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def is_shard_store(value: str | os.PathLike[str]) -> bool:
    """Whether `value` names a directory that holds a ``manifest.json`` (a shard store)."""
    path = Path(value).expanduser()
    return path.is_dir() and (path / MANIFEST).is_file()


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


# --------------------------------------------------------------------------- writing


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


# --------------------------------------------------------------------------- reading


#: The dtypes a store's ids may have.
DTYPES = ("uint16", "uint32")
#: Folder of the cache directory that records verified shards (one small file per shard).
VERIFIED_DIR = "verified-shards"
#: A verification is cached only for a file whose last change is at least this old (ns): a
#: change within the same tick of a coarse file-system clock would not move its ctime.
SETTLED_NS = 2_000_000_000
_SHA256 = re.compile(r"[0-9a-f]{16}")
#: A shard opened for reading, and its status as it was opened.
OpenShard = tuple[BinaryIO, os.stat_result]
#: Fields of a complete store's manifest that training reads, with the type each must have.
_COMPLETE_FIELDS: tuple[tuple[tuple[str, ...], type], ...] = (
    (("fingerprint",), str),
    (("tokenizer", "fingerprint"), str),
    (("tokenizer", "vocab_size"), int),
    (("corpus", "name"), str),
    (("corpus", "origin"), str),
    (("corpus", "fingerprint"), str),
)


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the store in `directory`; UsageError when it is missing or not one, or
    when a field that sizes or locates a read is bad (`check_manifest`)."""
    path = Path(directory) / MANIFEST
    found = kind_of(path)
    if found not in (None, "a regular file"):
        raise UsageError(
            f"shard store {str(directory)!r}: {MANIFEST} is {found}, not a regular file of the store"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        ok = manifest["format"] == FORMAT and isinstance(manifest["shards"], list)
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise UsageError(
            f"shard store {str(directory)!r}: {MANIFEST} is missing or is not a resstream shard manifest"
        )
    if manifest.get("version") != FORMAT_VERSION:
        raise UsageError(
            f"shard store {str(directory)!r} has format version {manifest.get('version')!r}; this "
            f"resstream reads version {FORMAT_VERSION}: tokenise the corpus again"
        )
    check_manifest(directory, manifest)
    return manifest


def check_manifest(directory: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
    """UsageError naming the first bad field of `manifest` that reading uses: `dtype` one of
    `DTYPES`; per shard a `file` that is a plain name inside the store (`io.not_a_plain_name`),
    `tokens` a whole number >= 0 and `sha256` 16 hex digits."""
    where = f"shard store {str(directory)!r}: {MANIFEST}"
    if manifest.get("dtype") not in DTYPES:
        raise UsageError(f"{where} has dtype {manifest.get('dtype')!r}; allowed: {', '.join(DTYPES)}")
    for index, entry in enumerate(manifest["shards"]):
        _check_entry(f"{where} shard {index}", entry)


def _check_entry(where: str, entry: Any) -> None:
    if not isinstance(entry, dict):
        raise UsageError(f"{where} is {entry!r}, not an object with file, tokens and sha256")
    problem = not_a_plain_name(entry.get("file"))
    if problem:
        raise UsageError(
            f"{where} has file {entry.get('file')!r} ({problem}); a shard's file must be a plain "
            "file name inside the store"
        )
    where = f"{where} ({entry['file']})"
    tokens = entry.get("tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise UsageError(f"{where} has tokens {tokens!r}; allowed: a whole number >= 0")
    digest = entry.get("sha256")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise UsageError(f"{where} has sha256 {digest!r}; allowed: 16 hex digits (0-9, a-f)")


def _check_complete_fields(directory: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
    """UsageError naming the first field of `_COMPLETE_FIELDS` that is missing or mistyped."""
    for keys, kind in _COMPLETE_FIELDS:
        value: Any = manifest
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, bool) or not isinstance(value, kind):
            raise UsageError(
                f"shard store {str(directory)!r}: {MANIFEST} has {'.'.join(keys)} {value!r}; "
                f"allowed: a {'string' if kind is str else 'whole number'}"
            )


def _shard_where(directory: Path, entry: dict[str, Any]) -> str:
    return f"shard store {str(directory)!r}: {entry['file']}"


def _open_shard(directory: Path, manifest: dict[str, Any], index: int) -> OpenShard:
    """Shard `index` opened for reading and its status; UsageError when it is missing, a
    symbolic link or not a regular file (never followed, never opened), or not of the size its
    count gives."""
    entry = manifest["shards"][index]
    path, where = directory / entry["file"], _shard_where(directory, entry)
    try:
        fd = open_in_folder(path, os.O_RDONLY)  # never a link, nor a FIFO that would block
    except UntrustedEntry as exc:
        if exc.found == "a symbolic link":
            raise UsageError(
                f"{where} is a symbolic link; a shard must be a file inside the store (links are "
                "refused wherever they point, so that a store never reads outside its folder)"
            ) from None
        raise UsageError(f"{where} is {exc.found}, not a regular file") from None
    except FileNotFoundError:
        count = len(manifest["shards"])
        raise UsageError(f"{where} is missing (the manifest lists {count} shards)") from None
    except OSError as exc:
        raise UsageError(f"{where} cannot be read: {short_reason(exc)}") from None
    handle = os.fdopen(fd, "rb")
    try:
        info = os.fstat(fd)
        size, expected = info.st_size, entry["tokens"] * np.dtype(manifest["dtype"]).itemsize
        if size != expected:
            raise UsageError(
                f"{where} has {size} bytes; the manifest says {entry['tokens']} ids ({expected} bytes)"
            )
    except BaseException:
        handle.close()
        raise
    return handle, info


@contextlib.contextmanager
def _opened_shards(directory: Path, manifest: dict[str, Any]) -> Iterator[list[OpenShard]]:
    """Every shard opened and checked (`_open_shard`), in manifest order; closed on exit."""
    with contextlib.ExitStack() as stack:
        shards = []
        for index in range(len(manifest["shards"])):
            handle, info = _open_shard(directory, manifest, index)
            stack.callback(handle.close)
            shards.append((handle, info))
        yield shards


def check_shard_files(
    directory: Path,
    manifest: dict[str, Any],
    *,
    verify: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    rank: int = 0,
    world: int = 1,
) -> None:
    """UsageError naming the first shard that is missing, a symbolic link, not a regular file
    or of another size than its manifest entry says (with `verify`: or of another sha256,
    `verify_shards`, which `cache_dir`, `rank` and `world` are passed to)."""
    with _opened_shards(directory, manifest) as shards:
        if verify:
            verify_shards(directory, manifest, shards, cache_dir=cache_dir, rank=rank, world=world)


def verify_shards(
    directory: Path,
    manifest: dict[str, Any],
    shards: list[OpenShard],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    rank: int = 0,
    world: int = 1,
) -> None:
    """UsageError naming the first of the opened `shards` whose bytes do not give the sha256
    of its manifest entry.

    A shard whose file identity (device, inode, size, mtime, ctime) and expected sha256 are
    recorded in `cache_dir` as verified is not read again; one that verifies is recorded there
    (when the cache can be written: else it is verified and not recorded). The ranks of a
    torchrun job each start at their own 1/`world` of the shards and go round, so with a shared
    cache each hashes about its own share and finds the others' recorded; without one, each
    hashes every shard. No rank trusts anything but the cache.
    """
    for index in verification_order(len(shards), rank, world):
        handle, info = shards[index]
        entry = manifest["shards"][index]
        record = _verified_record(cache_dir, info, entry["sha256"])
        if record is not None and _recorded(record):
            continue
        if shard_digest(handle) != entry["sha256"]:
            raise UsageError(
                f"{_shard_where(directory, entry)} does not match the sha256 in its manifest: the file "
                "changed since it was tokenised; tokenise the corpus again or restore the file"
            )
        if record is not None and _settled(info, os.fstat(handle.fileno())):
            _remember(record, info, entry["sha256"])


def verification_order(count: int, rank: int, world: int) -> list[int]:
    """Shard indices `0..count-1` starting at rank `rank`'s share (of `world`) and going round."""
    start = count * rank // max(world, 1)
    return [*range(start, count), *range(start)]


def shard_digest(handle: BinaryIO) -> str:
    """sha256 (16 hex digits) of the whole file `handle` (read from its start)."""
    handle.seek(0)
    return hashlib.file_digest(handle, "sha256").hexdigest()[:16]


def _verified_record(
    cache_dir: str | os.PathLike[str] | None, info: os.stat_result, sha256: str
) -> Path | None:
    """The cache file that says a file of identity `info` has sha256 `sha256` (None: no cache)."""
    if cache_dir is None:
        return None
    identity = [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, sha256]
    key = hashlib.sha256(json.dumps(["verified-shard", 1, *identity]).encode()).hexdigest()[:32]
    return Path(cache_dir).expanduser() / VERIFIED_DIR / key


def _recorded(record: Path) -> bool:
    """Whether the cache holds `record` (a cache that cannot be read holds nothing)."""
    try:
        return record.is_file()
    except OSError:
        return False


def _settled(before: os.stat_result, after: os.stat_result) -> bool:
    """Whether a file did not change while it was hashed and its last change is older than
    `SETTLED_NS` (so that a later change must move its ctime)."""
    same = all(
        getattr(before, field) == getattr(after, field)
        for field in ("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")
    )
    return same and time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns) >= SETTLED_NS


def _remember(record: Path, info: os.stat_result, sha256: str) -> None:
    """Record a verified shard; a cache that cannot be written is skipped (nothing is cached):
    the cache only saves time, so it never stops a run."""
    identity = {"dev": info.st_dev, "ino": info.st_ino, "size": info.st_size}
    identity.update(mtime_ns=info.st_mtime_ns, ctime_ns=info.st_ctime_ns, sha256=sha256)
    with contextlib.suppress(OSError, ResstreamError):
        write_json(record, identity)


def store_fingerprint(manifest: dict[str, Any]) -> str:
    """sha256 (16 hex) of what decides a store's ids: format, tokenizer, corpus, dtype and
    every shard's count and checksum."""
    key = {
        "format": [manifest["format"], manifest["version"]],
        "tokenizer": manifest["tokenizer"]["fingerprint"],
        "corpus": manifest["corpus"]["fingerprint"],
        "dtype": manifest["dtype"],
        "shards": [[s["tokens"], s["sha256"]] for s in manifest["shards"]],
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


class ShardedTokens:
    """A 1-D, read-only run of a store's ids, read through one `np.memmap` per shard.

    `len()` is its number of ids. Slicing (step 1) gives another `ShardedTokens` without
    reading anything, as slicing a memory map does; an integer index gives one id;
    `np.asarray(view)` reads the ids of the view (crossing shard boundaries as needed). So
    the trainer's `windows` reads only the windows it stacks, and `split_tokens` splits a
    store without copying it.
    """

    def __init__(self, maps: list[np.ndarray], start: int = 0, stop: int | None = None) -> None:
        self._maps = maps
        self._offsets = [0, *itertools.accumulate(len(m) for m in maps)]  # first id of each shard
        self._start = start
        self._stop = self._offsets[-1] if stop is None else stop
        self.dtype = maps[0].dtype if maps else np.dtype(np.uint16)

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        verify: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        rank: int = 0,
        world: int = 1,
    ) -> ShardedTokens:
        """The ids of the complete store in `directory`: UsageError for an incomplete store or
        one whose shards do not match its manifest (`check_shard_files`; with `verify`, the
        default, their sha256 too, `verify_shards`, cached in `cache_dir` when given). Each
        shard is mapped from the very file that was checked."""
        directory = Path(directory)
        stored_corpus(directory)  # complete
        manifest = read_manifest(directory)
        dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
        with _opened_shards(directory, manifest) as shards:
            if verify:
                verify_shards(directory, manifest, shards, cache_dir=cache_dir, rank=rank, world=world)
            maps = [
                np.memmap(handle, dtype=dtype, mode="r", shape=(entry["tokens"],))
                for (handle, _), entry in zip(shards, manifest["shards"], strict=True)
                if entry["tokens"]
            ]
        return cls(maps)

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def ndim(self) -> int:
        return 1

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("a ShardedTokens slice must have step 1")
            return ShardedTokens(self._maps, self._start + start, self._start + max(start, stop))
        position = int(index) + (len(self) if int(index) < 0 else 0)
        if not 0 <= position < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} ids")
        shard = bisect.bisect_right(self._offsets, self._start + position) - 1
        return self._maps[shard][self._start + position - self._offsets[shard]]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        first = bisect.bisect_right(self._offsets, self._start) - 1
        parts = []
        for shard in range(max(first, 0), len(self._maps)):
            lo, hi = self._offsets[shard], self._offsets[shard + 1]
            if lo >= self._stop:
                break
            parts.append(self._maps[shard][max(self._start, lo) - lo : min(self._stop, hi) - lo])
        ids = np.concatenate(parts) if len(parts) != 1 else np.array(parts[0])
        ids = ids if parts else np.zeros(0, dtype=self.dtype)
        return ids.astype(dtype, copy=False) if dtype is not None else ids

    def split(self, val_fraction: float) -> tuple[ShardedTokens, ShardedTokens]:
        """(train, val) by `split_tokens`'s rule: val is the last floor(len * val_fraction) ids."""
        return split_tokens(self, val_fraction)


# --------------------------------------------------------------------------- training on a store


@dataclass(frozen=True)
class StoredCorpus:
    """The corpus a complete store was made from, as its manifest records it."""

    name: str
    origin: str
    fingerprint: str
    tokenizer: str | None  # how the store's tokenizer was named (`write_shards`'s `tokenizer_name`)
    tokenizer_fingerprint: str
    store_fingerprint: str


def stored_corpus(directory: str | os.PathLike[str]) -> StoredCorpus:
    """What the complete store in `directory` holds (UsageError for an incomplete one)."""
    manifest = read_manifest(directory)
    if not manifest.get("complete"):
        raise UsageError(
            f"shard store {str(directory)!r} is incomplete ({len(manifest['shards'])} shards so far): "
            f"finish it by running the same `resstream tokenize` again"
        )
    _check_complete_fields(directory, manifest)
    if manifest["fingerprint"] != store_fingerprint(manifest):
        raise UsageError(
            f"shard store {str(directory)!r}: {MANIFEST} records fingerprint {manifest['fingerprint']}, "
            f"but its fields give {store_fingerprint(manifest)}: it was edited after tokenising; "
            "tokenise the corpus again"
        )
    corpus, tokenizer = manifest["corpus"], manifest["tokenizer"]
    return StoredCorpus(
        name=corpus["name"],
        origin=corpus["origin"],
        fingerprint=corpus["fingerprint"],
        tokenizer=tokenizer.get("name"),
        tokenizer_fingerprint=tokenizer["fingerprint"],
        store_fingerprint=manifest["fingerprint"],
    )


def check_store_tokenizer(
    directory: str | os.PathLike[str], stored: StoredCorpus, tokenizer: PreTrainedTokenizerFast, spec: str
) -> None:
    """UsageError unless `tokenizer` (given as `spec`) is the one the store's ids were made with."""
    found = tokenizer_fingerprint(tokenizer)
    if found != stored.tokenizer_fingerprint:
        raise UsageError(
            f"shard store {str(directory)!r} holds ids of tokenizer {stored.tokenizer!r} (fingerprint "
            f"{stored.tokenizer_fingerprint}), not of `tokenizer` {spec!r} (fingerprint {found}); "
            f"train with `tokenizer` {stored.tokenizer!r} or tokenise the corpus again"
        )


def store_splits(
    directory: str | os.PathLike[str],
    val_fraction: float,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    rank: int = 0,
    world: int = 1,
) -> TokenSplits:
    """The complete store in `directory` split as the single-file cache is, its shards
    verified against the manifest (size and sha256; the verifications cached in `cache_dir`,
    shared out between the `world` ranks of a torchrun job: `verify_shards`); the fingerprint
    is the store's."""
    tokens = ShardedTokens.open(directory, cache_dir=cache_dir, rank=rank, world=world)
    train, val = tokens.split(val_fraction)
    manifest = read_manifest(directory)
    return TokenSplits(
        train=train,
        val=val,
        fingerprint=manifest["fingerprint"],
        path=Path(directory),
        vocab_size=int(manifest["tokenizer"]["vocab_size"]),
    )
