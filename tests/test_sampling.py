"""Seeded sequence sampling: the documented rule, hand-checkable cases, bad input."""

from __future__ import annotations

import pytest
import torch

from resstream.data import train_bpe
from resstream.data.sampling import (
    prepends_bos,
    reservoir,
    sample_sequences,
    sample_token_rows,
    token_stream,
    windows,
)
from resstream.errors import UsageError


class WordTokenizer:
    """Whitespace 'tokenizer' with ids = integers written in the text; eos 0, bos 1."""

    eos_token_id = 0
    bos_token_id = 1

    def __init__(self, adds_bos: bool = False) -> None:
        self.adds_bos = adds_bos

    def __call__(self, text, add_special_tokens=True):
        ids = [int(word) if word.isdigit() else 2 for word in text.split()]
        if add_special_tokens and self.adds_bos:
            ids = [self.bos_token_id, *ids]
        return {"input_ids": ids}


def test_stream_appends_eos_per_document_and_windows_drop_the_tail():
    stream = list(token_stream(["5 6 7", "8 9"], WordTokenizer()))
    assert stream == [5, 6, 7, 0, 8, 9, 0]
    assert list(windows(stream, 3)) == [[5, 6, 7], [0, 8, 9]]


def test_reservoir_keeps_everything_when_count_is_large_and_is_seeded():
    items = [[i] for i in range(10)]
    chosen, seen = reservoir(items, 20, seed=0)
    assert seen == 10 and [i for i, _ in chosen] == list(range(10))
    a, _ = reservoir(items, 3, seed=7)
    b, _ = reservoir(items, 3, seed=7)
    c, _ = reservoir(items, 3, seed=8)
    assert a == b and len(a) == 3 and a != c
    assert [i for i, _ in a] == sorted(i for i, _ in a)


def test_reservoir_is_uniform():
    counts = torch.zeros(6)
    for seed in range(3000):
        chosen, _ = reservoir([[i] for i in range(6)], 2, seed=seed)
        for index, _ in chosen:
            counts[index] += 1
    expected = 3000 * 2 / 6
    assert torch.all((counts - expected).abs() < 0.1 * expected), counts


def test_sample_sequences_with_and_without_bos():
    docs = [" ".join(str(i) for i in range(10, 30))]  # 20 tokens + eos = 21
    plain = sample_sequences(docs, WordTokenizer(), num_seqs=2, seq_len=5, seed=0)
    assert not plain.bos_prepended and plain.windows_available == 4
    assert all(len(s) == 5 for s in plain.sequences)
    with_bos = sample_sequences(docs, WordTokenizer(adds_bos=True), num_seqs=5, seq_len=5, seed=0)
    assert with_bos.bos_prepended and with_bos.windows_available == 5
    assert [s.tolist() for s in with_bos.sequences] == [
        [1, 10, 11, 12, 13],
        [1, 14, 15, 16, 17],
        [1, 18, 19, 20, 21],
        [1, 22, 23, 24, 25],
        [1, 26, 27, 28, 29],
    ]
    never = sample_sequences(docs, WordTokenizer(adds_bos=True), num_seqs=1, seq_len=5, bos="never")
    assert not never.bos_prepended


def test_bos_policy_follows_the_real_tokenizer():
    tokenizer = train_bpe(["hello world, this is a test"] * 5, 300)
    assert prepends_bos(tokenizer, "auto") is False  # resstream's BPE adds no BOS
    assert prepends_bos(tokenizer, "always") is True
    assert prepends_bos(tokenizer, "never") is False


def test_asking_for_more_sequences_than_the_corpus_holds_says_how_many_it_holds():
    with pytest.raises(UsageError, match=r"`num_seqs` 5 is more than 'tiny' holds: it has 4 "):
        sample_sequences(["1 2 3 4 5 6 7 8"], WordTokenizer(), num_seqs=5, seq_len=2, corpus_name="tiny")


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"num_seqs": 0, "seq_len": 4}, "`num_seqs` 0 must be >= 1"),
        ({"num_seqs": 1, "seq_len": 1}, "`seq_len` 1 is too short"),
    ],
)
def test_bad_sizes(kwargs, pattern):
    with pytest.raises(UsageError, match=pattern):
        sample_sequences(["1 2 3"], WordTokenizer(), **kwargs)


def test_pinned_rows_are_used_exactly():
    sample = sample_token_rows([[5, 6, 7], [8, 9]], source="pinned.jsonl", vocab_size=10)
    assert [s.tolist() for s in sample.sequences] == [[5, 6, 7], [8, 9]]
    assert sample.num_tokens == 5 and sample.windows_available is None
    with pytest.raises(UsageError, match="row 2 has fewer than 2 input_ids"):
        sample_token_rows([[5, 6], [7]], source="pinned.jsonl", vocab_size=10)


@pytest.mark.parametrize("token", [10, 2**63, 10**29])
def test_pinned_ids_outside_the_vocabulary_are_refused_before_they_become_tensors(token: int):
    with pytest.raises(
        UsageError,
        match=rf"^row 2 of 'pinned.jsonl' holds token id {token}, outside the model's vocabulary "
        r"of 10 \(allowed: 0\.\.9\)$",
    ):
        sample_token_rows([[5, 6], [7, token]], source="pinned.jsonl", vocab_size=10)
