"""`resstream tokenize` end to end, training on its store, and the bad inputs of both."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from resstream.cli.main import main
from resstream.data import save_tokenizer, train_bpe
from resstream.data.shards import MANIFEST, shard_name
from tests.cli_support import assert_nothing_written, expect_usage_error
from tests.test_cli_train import TINY
from tests.test_train import corpus_text

DATA = Path(os.environ.get("RESSTREAM_DATA", "/nonexistent"))
needs_gpt2 = pytest.mark.skipif(not (DATA / "gpt2-tokenizer").is_dir(), reason="no local GPT-2 tokenizer")


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


@pytest.fixture
def bpe(tmp_path) -> Path:
    """A small tokenizer, so that the tiny models train in a moment."""
    save_tokenizer(train_bpe([corpus_text()], 300), tmp_path / "bpe")
    return tmp_path / "bpe"


def tokenize(corpus: Path, out: Path, tokenizer: Path) -> int:
    args = ["tokenize", "--dataset", str(corpus), "--tokenizer", str(tokenizer), "--out", str(out), "--quiet"]
    return main([*args, "--shard-tokens", "1000", "--workers", "1"])


def train_on(store: Path, out: Path, tokenizer: Path) -> int:
    flags = [*TINY, "--tokenizer", str(tokenizer), "--max-steps", "2", "--device", "cpu", "--threads", "1"]
    return main(["train", "--dataset", str(store), *flags, "--out", str(out)])


@pytest.fixture
def store(corpus, bpe, tmp_path) -> Path:
    assert tokenize(corpus, tmp_path / "store", bpe) == 0
    return tmp_path / "store"


def test_tokenize_writes_reuses_and_trains(corpus, bpe, tmp_path, capsys):
    assert tokenize(corpus, tmp_path / "store", bpe) == 0
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "store" / MANIFEST).read_text())
    shards, tokens = len(manifest["shards"]), manifest["total_tokens"]
    assert manifest["complete"] and shards == -(-tokens // 1000) >= 2
    assert out.startswith(f"wrote {shards} shards, {tokens:,} tokens in ") and "tokens/s)" in out
    assert f"holds {shards} shards, {tokens:,} tokens (fingerprint {manifest['fingerprint']})" in out
    assert tokenize(corpus, tmp_path / "store", bpe) == 0
    assert "already holds the complete store" in capsys.readouterr().out

    assert train_on(tmp_path / "store", tmp_path / "run", bpe) == 0
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["token_store"]["fingerprint"] == manifest["fingerprint"]
    assert record["dataset_fingerprint"] == manifest["fingerprint"]
    assert record["tokens"]["train"] + record["tokens"]["val"] == tokens
    assert record["tokens"]["val"] == tokens // 10


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--shard-tokens", "0"], "--shard-tokens 0 must be a whole number >= 1"),
        (["--workers", "0"], "--workers 0 must be a whole number >= 1"),
    ],
)
def test_tokenize_refuses_bad_numbers(corpus, tmp_path, capsys, flags, message):
    args = ["tokenize", "--dataset", str(corpus), "--tokenizer", "gpt2", "--quiet", *flags]  # refused first
    expect_usage_error(args, tmp_path / "store", capsys, message)


@needs_gpt2
def test_tokenize_refuses_a_store_of_another_tokenizer(corpus, store, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in store.iterdir()}
    capsys.readouterr()
    args = ["tokenize", "--dataset", str(corpus), "--tokenizer", "gpt2", "--out", str(store), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("resstream: error: --out") and "holds a shard store of another tokenizer" in err, (
        err
    )
    assert {p.name: p.stat().st_mtime_ns for p in store.iterdir()} == before


@pytest.mark.parametrize("damage", ["missing", "size"])
def test_train_refuses_a_store_whose_files_do_not_match_its_manifest(store, bpe, tmp_path, capsys, damage):
    shard = store / shard_name(1)
    if damage == "missing":
        shard.unlink()
        message = "shard-00001.bin is missing"
    else:
        shard.write_bytes(shard.read_bytes()[:-2])
        message = "shard-00001.bin has 1998 bytes; the manifest says 1000 ids (2000 bytes)"
    flags = [*TINY, "--tokenizer", str(bpe), "--max-steps", "2", "--device", "cpu"]
    expect_usage_error(["train", "--dataset", str(store), *flags], tmp_path / "run", capsys, message)


def test_train_refuses_a_store_smaller_than_one_batch(store, bpe, tmp_path, capsys):
    flags = [*TINY, "--tokenizer", str(bpe), "--device", "cpu", "--batch-size", "1000"]
    expect_usage_error(
        ["train", "--dataset", str(store), *flags],
        tmp_path / "run",
        capsys,
        "fewer than one batch (1000 sequences)",
    )


@needs_gpt2
def test_train_refuses_another_tokenizer_or_bpe_on_a_store(store, bpe, tmp_path, capsys):
    flags = [*TINY, "--device", "cpu"]
    expect_usage_error(
        ["train", "--dataset", str(store), *flags, "--tokenizer", "gpt2"],
        tmp_path / "run",
        capsys,
        f"shard store {str(store)!r} holds ids of tokenizer {str(bpe)!r}",
        "not of --tokenizer 'gpt2'",
    )
    expect_usage_error(
        ["train", "--dataset", str(store), *flags],
        tmp_path / "run",
        capsys,
        "--tokenizer 'bpe' trains a tokenizer on the corpus",
        f"pass --tokenizer {str(bpe)!r}",
    )
    assert_nothing_written(tmp_path / "run")
