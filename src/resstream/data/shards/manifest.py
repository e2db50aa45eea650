"""A shard store's manifest: its file names, reading it, checking its fields, and the store's identity.

``manifest.json`` records the format version, the tokenizer (spec and fingerprint), the corpus
(name, origin; its fingerprint once the whole corpus has been read), the dtype, `shard_tokens`,
and per shard its file, token count, sha256 and where the corpus stood when it was full (see
`resstream.data.shards.writing`). When the corpus is done: `complete`, `total_tokens` and the
store's `fingerprint` (`store_fingerprint`).

A store is often unpacked from an archive made by someone else, so every field that sizes or
locates a read (`dtype`, each shard's `file`, `tokens`, `sha256`) is checked before anything is
read (`check_manifest`): a shard's `file` must be a plain name (no path separator, no ``..``, not
absolute). A complete store's recorded fingerprint must be the one its fields give
(`stored_corpus`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resstream.data.tokenizer import tokenizer_fingerprint
from resstream.errors import UsageError
from resstream.io import kind_of, not_a_plain_name

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

MANIFEST = "manifest.json"
FORMAT = "resstream-shards"
FORMAT_VERSION = 1
#: The dtypes a store's ids may have.
DTYPES = ("uint16", "uint32")
_SHA256 = re.compile(r"[0-9a-f]{16}")
#: Fields of a complete store's manifest that training reads, with the type each must have.
_COMPLETE_FIELDS: tuple[tuple[tuple[str, ...], type], ...] = (
    (("fingerprint",), str),
    (("tokenizer", "fingerprint"), str),
    (("tokenizer", "vocab_size"), int),
    (("corpus", "name"), str),
    (("corpus", "origin"), str),
    (("corpus", "fingerprint"), str),
)


def shard_name(index: int) -> str:
    """The file name of shard `index`: ``shard-00000.bin``."""
    return f"shard-{index:05d}.bin"


def is_shard_store(value: str | os.PathLike[str]) -> bool:
    """Whether `value` names a directory that holds a ``manifest.json`` (a shard store)."""
    path = Path(value).expanduser()
    return path.is_dir() and (path / MANIFEST).is_file()


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
