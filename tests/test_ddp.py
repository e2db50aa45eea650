"""Data parallel training: 2 CPU processes (gloo, launched by torchrun) make the same update
as one process with the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from resstream.training import checkpoint as ckpt
from tests.test_cli_train import TINY
from tests.test_train import corpus_text
from tests.training_support import assert_same_training


def _args(corpus, cache, out, *extra):
    return [
        "train",
        "--dataset",
        str(corpus),
        *extra,
        "--cache-dir",
        str(cache),
        "--out",
        str(out),
        *TINY,
        "--max-steps",
        "3",
        "--batch-size",
        "8",
        "--grad-accum",
        "2",
        "--device",
        "cpu",
        "--threads",
        "1",
    ]


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(), encoding="utf-8")
    _check_ddp_matches_one_process(tmp_path, corpus)


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_on_a_shard_store(tmp_path):
    """Every rank reads its own windows from the store's memory maps (issue 13, item 4). About
    30 s on 2 cores, so slow; the default suite checks each rank's batches from a store in
    tests/test_data_shards.py."""
    from resstream.data import Corpus, save_tokenizer, train_bpe
    from resstream.data.shards import write_shards
    from resstream.data.sources import corpus_fingerprint

    text = corpus_text()
    corpus = Corpus("words", (text,), corpus_fingerprint([text]), "test")
    tokenizer = train_bpe([text], 300)
    save_tokenizer(tokenizer, tmp_path / "bpe")
    write_shards(corpus, tokenizer, tmp_path / "store", shard_tokens=300, workers=1)
    _check_ddp_matches_one_process(tmp_path, tmp_path / "store", "--tokenizer", str(tmp_path / "bpe"))


def _check_ddp_matches_one_process(tmp_path, corpus, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "resstream.cli.main",
        *_args(corpus, tmp_path / "cache", tmp_path / "ddp", *extra),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    single = subprocess.run(
        [
            sys.executable,
            "-m",
            "resstream.cli.main",
            *_args(corpus, tmp_path / "cache", tmp_path / "single", *extra),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-3000:]

    assert_same_training(
        ckpt.load_run(tmp_path / "ddp"), ckpt.load_run(tmp_path / "single"), rtol=1e-5, atol=1e-6
    )
    init = ckpt.load_run(tmp_path / "single")
    assert init.meta["steps"] == 3
    ddp_record = (tmp_path / "ddp" / "run.json").read_text()
    assert '"world_size": 2' in ddp_record


if not hasattr(torch.distributed, "is_available") or not torch.distributed.is_available():
    pytestmark = pytest.mark.skip("torch.distributed is not available")
