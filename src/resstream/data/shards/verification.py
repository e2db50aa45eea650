"""Opening a store's shards safely, and checking them against the manifest: size, then sha256
(each file hashed once, its verification cached).

* **Confined to its folder.** A shard that is a symbolic link (wherever it points) or not a
  regular file is refused and never opened (`io.open_in_folder`), so reading a store never reads
  outside its folder; one of another size than its manifest entry gives is refused too.
* **Checksums.** sha256 of each shard (16 hex digits, as every resstream fingerprint). Hashing
  runs at about 1 GB/s, hundreds of times faster than tokenising, so a cheaper checksum would
  save nothing measurable. `verify_shards` hashes each shard once per file: the verification is
  recorded in the cache directory under the file's identity (device, inode, size, mtime, ctime)
  and expected sha256, so a later open of the unchanged store reads nothing. A store may be
  read-only and shared, so nothing is written into it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from resstream.errors import ResstreamError, UsageError, short_reason
from resstream.io import UntrustedEntry, open_in_folder, write_json

#: Folder of the cache directory that records verified shards (one small file per shard).
VERIFIED_DIR = "verified-shards"
#: A verification is cached only for a file whose last change is at least this old (ns): a
#: change within the same tick of a coarse file-system clock would not move its ctime.
SETTLED_NS = 2_000_000_000
#: A shard opened for reading, and its status as it was opened.
OpenShard = tuple[io.BufferedReader, os.stat_result]


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
def opened_shards(directory: Path, manifest: dict[str, Any]) -> Iterator[list[OpenShard]]:
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
    with opened_shards(directory, manifest) as shards:
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


def shard_digest(handle: io.BufferedReader) -> str:
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
    identity = {
        "dev": info.st_dev,
        "ino": info.st_ino,
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
        "ctime_ns": info.st_ctime_ns,
        "sha256": sha256,
    }
    with contextlib.suppress(OSError, ResstreamError):
        write_json(record, identity)
