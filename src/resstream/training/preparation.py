"""A training run's set-up before its first step: corpus, tokenizer, vocabulary, token splits.

The `Trainer` (`resstream.training.loop`) takes these steps in this order, each refusing bad
input with one line before the next, slower one starts: the corpus (`open_corpus`: a corpus
streamed and read once for its fingerprint, or a shard store), the tokenizer (`run_tokenizer`:
the run's saved one on resume, else trained or loaded), the vocabulary (`resolve_vocab`) and the
token ids (`token_splits`: the store's, or the single-file token cache). A step that lasts
longer than `STATUS_DELAY_S` says what it does while it runs (`saying`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from resstream.data import CorpusStream, build_token_cache, cached_bpe, load_tokenizer, stream_corpus
from resstream.data.shards import (
    StoredCorpus,
    check_store_tokenizer,
    is_shard_store,
    store_splits,
    stored_corpus,
)
from resstream.data.tokenizer import bpe_cache_entry
from resstream.data.tokens import TokenSplits, check_cache_dir
from resstream.errors import UsageError
from resstream.io import cache_root
from resstream.training import checkpoint as ckpt
from resstream.training.config import TrainConfig
from resstream.training.distributed import Distributed

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

#: A step of a run's set-up (corpus, tokenizer, token cache, model) that takes longer than
#: this many seconds says what it does (`saying`).
STATUS_DELAY_S = 0.5

#: Where a run's one-line notices go; None: nowhere.
Log = Callable[[str], None]


@contextlib.contextmanager
def saying(what: str, log: Log | None) -> Iterator[None]:
    """Say "preparing: <what>" on `log` if the block lasts longer than `STATUS_DELAY_S` (with
    `log` None, nothing): a slow step is named while it runs, and bad input refused at once
    still gets its one line and nothing else."""
    if log is None:
        yield
        return
    line = f"preparing: {what}"
    if STATUS_DELAY_S <= 0:
        log(line)
        yield
        return
    timer = threading.Timer(STATUS_DELAY_S, log, args=(line,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def default_cache_dir(config: TrainConfig) -> Path:
    """Where token caches live: `cache_dir`, env RESSTREAM_CACHE, or ~/.cache/resstream."""
    if config.run.cache_dir:
        return Path(config.run.cache_dir)
    return cache_root()


def store_directory(config: TrainConfig) -> Path:
    """The shard store a run trains on, when its `dataset` names one (`is_shard_store`)."""
    return Path(config.data.dataset).expanduser()


# ------------------------------------------------------------------ the corpus
def open_corpus(config: TrainConfig, log: Log | None) -> CorpusStream | StoredCorpus:
    """The run's corpus: streamed (memory holds a piece of it, not all of it; one reading pass
    checks the text and gives its fingerprint before any tokenising), or a shard store's."""
    if not is_shard_store(config.data.dataset):
        check_cache_dir(default_cache_dir(config))
        with saying(f"reading the corpus {config.data.dataset!r}", log):
            corpus = stream_corpus(config.data.dataset, data_dir=config.run.data_dir)
            corpus.scan()
        return corpus
    store = store_directory(config)
    stored = stored_corpus(store)
    refuse_bpe_for_a_store(config, store, stored)
    return stored


def refuse_bpe_for_a_store(config: TrainConfig, store: Path, stored: StoredCorpus) -> None:
    """A `bpe` tokenizer is trained on the corpus, so it cannot be known before a shard store of
    the corpus exists: a run on a store names the store's tokenizer instead."""
    if config.tokenizer.tokenizer == "bpe":
        raise UsageError(
            f"`tokenizer` 'bpe' trains a tokenizer on the corpus, but the shard store {str(store)!r} "
            f"holds ids of tokenizer {stored.tokenizer!r} already: pass `tokenizer` {stored.tokenizer!r}"
        )


# ------------------------------------------------------------------ the tokenizer
def tokenizer_task(
    config: TrainConfig, out_dir: Path, resume: bool, corpus: CorpusStream | StoredCorpus
) -> str:
    """What `prepare_tokenizer` is about to do, in words."""
    if resume and (out_dir / ckpt.TOKENIZER_DIR).is_dir():
        return "loading the run's saved tokenizer"
    if config.tokenizer.tokenizer == "bpe" and isinstance(corpus, CorpusStream):
        size = config.tokenizer.bpe_vocab_size
        kept = bpe_cache_entry(corpus, size, default_cache_dir(config))
        if (kept / "tokenizer.json").is_file():
            return f"loading the {size}-token BPE tokenizer of this corpus kept in {str(kept)!r}"
        return f"training a {size}-token byte-level BPE tokenizer on the corpus"
    return f"loading the tokenizer {config.tokenizer.tokenizer!r}"


def prepare_tokenizer(
    config: TrainConfig, corpus: CorpusStream | StoredCorpus, out_dir: Path, resume: bool
) -> PreTrainedTokenizerFast:
    """The run's tokenizer: the saved one when resuming, else trained (`bpe`) or loaded."""
    saved = out_dir / ckpt.TOKENIZER_DIR
    if resume and saved.is_dir():
        return load_tokenizer(str(saved))
    if config.tokenizer.tokenizer == "bpe":
        assert isinstance(corpus, CorpusStream), "a shard store's run names its tokenizer (open_corpus)"
        return cached_bpe(corpus, config.tokenizer.bpe_vocab_size, default_cache_dir(config))
    return load_tokenizer(config.tokenizer.tokenizer, data_dir=config.run.data_dir)


def run_tokenizer(
    config: TrainConfig, corpus: CorpusStream | StoredCorpus, out_dir: Path, resume: bool, log: Log | None
) -> PreTrainedTokenizerFast:
    """`prepare_tokenizer`, said while it runs; a shard store's ids must be of that tokenizer."""
    with saying(tokenizer_task(config, out_dir, resume, corpus), log):
        tokenizer = prepare_tokenizer(config, corpus, out_dir, resume)
    if isinstance(corpus, StoredCorpus):
        check_store_tokenizer(store_directory(config), corpus, tokenizer, config.tokenizer.tokenizer)
    return tokenizer


def resolve_vocab(config: TrainConfig, tokenizer_size: int) -> TrainConfig:
    """Fill in `vocab_size` from the tokenizer (0), or check a padded one is large enough."""
    vocab = config.model.vocab_size
    if vocab == 0:
        vocab = tokenizer_size
    elif vocab < tokenizer_size:
        raise UsageError(f"`vocab_size` {vocab} is smaller than the tokenizer's {tokenizer_size} tokens")
    return dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=vocab))


# ------------------------------------------------------------------ the token ids
def token_splits(
    config: TrainConfig,
    corpus: CorpusStream | StoredCorpus,
    tokenizer: PreTrainedTokenizerFast,
    dist: Distributed,
    log: Log | None,
) -> TokenSplits:
    """The training and validation ids: the shard store's, or the single-file cache's (the
    corpus is tokenised into it on first use)."""
    val_fraction = config.data.val_fraction
    cache = default_cache_dir(config)
    if isinstance(corpus, StoredCorpus):
        store = store_directory(config)
        with saying(f"opening the shard store {str(store)!r} (checking each shard's sha256)", log):
            return store_splits(store, val_fraction, cache_dir=cache, rank=dist.rank, world=dist.world)
    with saying(f"the token cache in {str(cache)!r} (the corpus is tokenised on first use)", log):
        return build_token_cache(corpus, tokenizer, cache, val_fraction=val_fraction)


def model_task(config: TrainConfig, checkpoint: ckpt.Checkpoint | None) -> str:
    """What the `Trainer` is about to do when it builds the model, in words."""
    m = config.model
    shape = f"{m.n_layer} layers x {m.d_model} wide, gate {m.gate!r}"
    if checkpoint is not None:
        return f"building the model ({shape}) from checkpoint step {checkpoint.step}"
    return f"building the model ({shape})"
