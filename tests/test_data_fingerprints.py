"""Pinned fingerprints: every named corpus gives the same documents whichever code reads it.

The expected values were computed with the code as it stood before the corpus table
(commit 0ddfb23); a change that alters a document, a boundary, a split's file or a hub row's
parsing changes a fingerprint here. Local copies need the shared data directory (skipped when
absent); the Hugging Face rows are faked, so those cases run everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from resstream import hub
from resstream.data import CorpusStream, Pieces, load_corpus, stream_corpus
from resstream.errors import UsageError

# (name, split, documents, fingerprint, whether the stream hands out file pieces)
LOCAL_CORPORA = [
    ("wikitext-2", "test", 62, "9f2eb66ef1a969bc", False),
    ("wikitext-2", "valid", 60, "2f19bc1765b433e1", False),
    ("lambada", "test", 5153, "d5cd1104aa85dc29", False),
    ("ptb", "valid", 1, "3f48d69e01843cf6", True),
    ("ptb", "test", 1, "256f6c4a3b0ea04c", True),
    ("openwebtext", "train", 1, "c625fca4f299e0ef", True),
    ("openwebtext", "test", 1, "c625fca4f299e0ef", True),
    ("fineweb-edu", "train", 1, "4c5d6a540928bb54", True),
    ("fineweb-edu", "valid", 1, "4c5d6a540928bb54", True),
    ("tinyshakespeare", "train", 1, "b20eb1dc66ddb45e", True),
    ("tinyshakespeare", "test", 1, "b20eb1dc66ddb45e", True),
    ("shakespeare", "train", 38, "6bf1d1ede3d5a568", False),
]


def _full_pass(stream: CorpusStream) -> list[bool]:
    """Consume every document (and piece); whether each document came in pieces."""
    in_pieces = []
    for document in stream:
        in_pieces.append(isinstance(document, Pieces))
        for _ in (document,) if isinstance(document, str) else document:
            pass
    return in_pieces


@pytest.mark.parametrize(("name", "split", "num_documents", "fingerprint", "in_pieces"), LOCAL_CORPORA)
def test_named_corpora_keep_their_fingerprints(
    shared_data: Path, name: str, split: str, num_documents: int, fingerprint: str, in_pieces: bool
) -> None:
    corpus = load_corpus(name, split=split, data_dir=shared_data)
    assert (len(corpus.documents), corpus.fingerprint) == (num_documents, fingerprint)
    stream = stream_corpus(name, split=split, data_dir=shared_data)
    # the same file (a stream names it resolved, a loaded corpus as the data directory was
    # given, so the two spellings differ where the data directory is reached through a link)
    assert Path(stream.origin).resolve() == Path(corpus.origin).resolve()
    assert _full_pass(stream) == [in_pieces] * num_documents
    assert stream.fingerprint == fingerprint
    if in_pieces:
        small_pieces = stream_corpus(name, split=split, data_dir=shared_data, block_bytes=4096)
        _full_pass(small_pieces)
        assert small_pieces.fingerprint == fingerprint


# --------------------------------------------------------------------------- hub rows, faked

_HUB_ROWS = {
    "Salesforce/wikitext": [
        "",
        " = Alpha = \n",
        "",
        " first line . \n",
        " = = Sub = = \n",
        " more . \n",
        "",
        " = Beta = \n",
        " second . \n",
    ],
    "EleutherAI/lambada_openai": ["a passage that ends in word", "another passage with target"],
    "ptb-text-only/ptb_text_only": ["the cat sat", "on the <unk> mat"],
    "Skylion007/openwebtext": [f"web document {i}\n\nwith a blank line" for i in range(150)],
    "HuggingFaceFW/fineweb-edu": [f"edu document {i}." for i in range(1500)],
}

# (name, split, documents, fingerprint, origin, load_dataset call: repo, config, split, streaming)
HUB_CORPORA = [
    (
        "wikitext-2",
        "train",
        2,
        "0985b1e635e1e59c",
        "hf:Salesforce/wikitext (config wikitext-2-raw-v1, split train)",
        ("Salesforce/wikitext", "wikitext-2-raw-v1", "train", False),
    ),
    (
        "wikitext-2",
        "valid",
        2,
        "0985b1e635e1e59c",
        "hf:Salesforce/wikitext (config wikitext-2-raw-v1, split validation)",
        ("Salesforce/wikitext", "wikitext-2-raw-v1", "validation", False),
    ),
    (
        "lambada",
        "test",
        2,
        "b037f5487d420bd3",
        "hf:EleutherAI/lambada_openai (config default, split test)",
        ("EleutherAI/lambada_openai", "default", "test", False),
    ),
    (
        "ptb",
        "train",
        1,
        "4f84de019f5202d8",
        "hf:ptb-text-only/ptb_text_only (config penn_treebank, split train)",
        ("ptb-text-only/ptb_text_only", "penn_treebank", "train", False),
    ),
    (
        "openwebtext",
        "train",
        100,
        "2c0eb8480c5c6556",
        "hf:Skylion007/openwebtext (split train, first 100 rows)",
        ("Skylion007/openwebtext", None, "train", True),
    ),
    (
        "fineweb-edu",
        "valid",
        1000,
        "debad98d8a32ead0",
        "hf:HuggingFaceFW/fineweb-edu (config sample-10BT, split train, first 1000 rows)",
        ("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True),
    ),
]


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """An online hub whose `datasets.load_dataset` serves `_HUB_ROWS`; returns the calls made."""
    datasets = pytest.importorskip("datasets")
    for variable in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    monkeypatch.setattr(hub, "probe", lambda address: None)
    calls: list[tuple[Any, ...]] = []

    def load_dataset(repo: str, config: str | None, split: str, streaming: bool = False) -> Any:
        calls.append((repo, config, split, streaming))
        field = "sentence" if repo.startswith("ptb") else "text"
        rows = _HUB_ROWS[repo]
        if streaming:
            return iter({field: row} for row in rows)
        return {field: rows}

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


@pytest.mark.parametrize(("name", "split", "num_documents", "fingerprint", "origin", "call"), HUB_CORPORA)
def test_hub_rows_keep_their_fingerprints(
    fake_hub: list[tuple[Any, ...]],
    name: str,
    split: str,
    num_documents: int,
    fingerprint: str,
    origin: str,
    call: tuple[Any, ...],
) -> None:
    corpus = load_corpus(name, split=split)
    assert (len(corpus.documents), corpus.fingerprint, corpus.origin) == (num_documents, fingerprint, origin)
    stream = stream_corpus(name, split=split)
    assert all(isinstance(document, str) for document in stream)
    assert (stream.fingerprint, stream.origin) == (fingerprint, origin)
    assert fake_hub == [call, call]


def test_a_corpus_of_billions_of_tokens_is_streamed_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """fineweb-edu-10bt is read lazily from a streamed hub dataset, never held: the stream
    pulls a row only when the consumer asks for the next document; `load_corpus` refuses it."""
    datasets = pytest.importorskip("datasets")
    for variable in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    monkeypatch.setattr(hub, "probe", lambda address: None)
    pulled: list[int] = []
    calls: list[tuple[Any, ...]] = []

    def endless_rows():
        for i in range(10**9):
            pulled.append(i)
            yield {"text": f"document {i}"}

    def load_dataset(repo: str, config: str | None, split: str, streaming: bool = False) -> Any:
        calls.append((repo, config, split, streaming))
        return endless_rows()

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    stream = stream_corpus("fineweb-edu-10bt")
    assert stream.origin == "hf:HuggingFaceFW/fineweb-edu (config sample-10BT, split train, streamed)"
    documents = iter(stream)
    assert [next(documents), next(documents)] == ["document 0", "document 1"]
    assert len(pulled) == 2 and calls == [("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True)]
    with pytest.raises(UsageError, match="too large to hold in memory"):
        load_corpus("fineweb-edu-10bt")


def test_a_streamed_hub_corpus_offline_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    expected = r"'fineweb-edu-10bt' is streamed from Hugging Face \(hf:.*\), which could not be reached"
    with pytest.raises(UsageError, match=expected):
        next(iter(stream_corpus("fineweb-edu-10bt")))
