"""A sharded token store for corpora too large for one cache file (paper-scale training).

A store is a folder of ``shard-00000.bin``, ``shard-00001.bin``, ... (raw little-endian
``uint16`` or ``uint32`` ids, the same ids `resstream.data.tokens.build_token_cache` gives) and
a ``manifest.json`` that describes them. Its parts, each one idea:

* `writing`: `write_shards` tokenises a corpus into a store, in parallel worker processes,
  deterministically, resuming an interrupted store and reusing a complete one;
* `manifest`: the manifest read and every field that sizes or locates a read checked
  (`read_manifest`), the store's fingerprint, and what a complete store holds (`stored_corpus`);
* `verification`: shards opened without ever leaving the store's folder, their size and
  sha256 checked against the manifest, each file hashed once (`verify_shards`, cached);
* `reading`: `ShardedTokens`, a 1-D, read-only, sliceable view over the shards' memory maps,
  and `store_splits`, the store split into training and validation parts for the trainer.

The names below are importable from `resstream.data.shards` itself.
"""

from resstream.data.shards.manifest import (
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    StoredCorpus,
    check_manifest,
    check_store_tokenizer,
    is_shard_store,
    read_manifest,
    shard_name,
    store_fingerprint,
    stored_corpus,
)
from resstream.data.shards.reading import ShardedTokens, store_splits
from resstream.data.shards.verification import (
    SETTLED_NS,
    VERIFIED_DIR,
    OpenShard,
    check_shard_files,
    opened_shards,
    shard_digest,
    verification_order,
    verify_shards,
)
from resstream.data.shards.writing import (
    SHARD_TOKENS,
    StoreSummary,
    check_shard_settings,
    default_workers,
    write_shards,
)

__all__ = [
    "DTYPES",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "SETTLED_NS",
    "SHARD_TOKENS",
    "VERIFIED_DIR",
    "OpenShard",
    "ShardedTokens",
    "StoreSummary",
    "StoredCorpus",
    "check_manifest",
    "check_shard_files",
    "check_shard_settings",
    "check_store_tokenizer",
    "default_workers",
    "is_shard_store",
    "opened_shards",
    "read_manifest",
    "shard_digest",
    "shard_name",
    "store_fingerprint",
    "store_splits",
    "stored_corpus",
    "verification_order",
    "verify_shards",
    "write_shards",
]
