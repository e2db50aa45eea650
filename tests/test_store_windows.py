"""tune-lens's windows read from a shard store are the windows `sample_sequences` draws (issue 28)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resstream.data import train_bpe
from resstream.data.sampling import CorpusTooSmall, sample_sequences
from resstream.data.shards import ShardedTokens
from resstream.data.sources import stream_corpus
from resstream.data.store_windows import TokenWindows, corpus_store, store_sample
from tests.test_train import corpus_text


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    folder = tmp_path_factory.mktemp("words")
    text = corpus_text()
    path = folder / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return path, train_bpe([text], 300)


@pytest.mark.parametrize(("seq_len", "bos"), [(16, None), (9, 0)])
def test_store_windows_are_the_sampled_windows(words, tmp_path, seq_len, bos):
    path, tokenizer = words
    store = corpus_store(stream_corpus(str(path)), tokenizer, tmp_path, workers=1)
    ids = ShardedTokens.open(store, cache_dir=tmp_path)
    if bos is not None:
        tokenizer.bos_token = tokenizer.convert_ids_to_tokens(bos)
    expected = sample_sequences(
        stream_corpus(str(path)),
        tokenizer,
        num_seqs=20,
        seq_len=seq_len,
        seed=3,
        bos="always" if bos is not None else "never",
        corpus_name="c",
    )
    got = store_sample(ids, num_seqs=20, seq_len=seq_len, seed=3, bos_id=bos, corpus_name="c")
    assert got.rule == expected.rule
    assert got.windows_available == expected.windows_available
    assert got.bos_prepended == expected.bos_prepended
    assert isinstance(got.sequences, TokenWindows)
    assert len(got.sequences) == len(expected.sequences)
    for mine, theirs in zip(got.sequences, expected.sequences, strict=True):
        assert torch.equal(mine, theirs)
    assert got.sequences.largest_id() == max(int(s.max()) for s in expected.sequences)


def test_token_windows_slice_and_take_without_reading():
    ids = np.arange(40, dtype=np.uint16)
    windows = TokenWindows(ids, np.array([0, 3, 5]), 4, (99,))
    assert windows.window_length == 5
    assert torch.equal(windows[1], torch.tensor([99, 12, 13, 14, 15]))
    taken = windows.take([2, 0])
    assert [int(w[1]) for w in taken] == [20, 0]
    assert [int(w[1]) for w in windows[1:]] == [12, 20]
    assert windows.largest_id() == 99
    assert TokenWindows(ids, np.array([0, 3, 5]), 4).largest_id() == 23


def test_a_store_too_small_names_its_windows():
    with pytest.raises(CorpusTooSmall, match="it has 2 non-overlapping sequences of 5 tokens") as caught:
        store_sample(np.arange(10, dtype=np.uint16), num_seqs=3, seq_len=5, corpus_name="tiny")
    assert caught.value.available == 2
    assert caught.value.exit_code == 2


def test_the_store_is_reused(words, tmp_path):
    path, tokenizer = words
    first = corpus_store(stream_corpus(str(path)), tokenizer, tmp_path, workers=1)
    mtime = (first / "manifest.json").stat().st_mtime_ns
    assert corpus_store(stream_corpus(str(path)), tokenizer, tmp_path, workers=1) == first
    assert (first / "manifest.json").stat().st_mtime_ns == mtime
