"""Under torchrun a failure one rank finds stops every rank at once with the same line (issue
28): a NaN in rank 1's optimizer state alone, put there just before a checkpoint is saved."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from resstream.training import checkpoint as ckpt
from tests.gloo_pair import two_ranks
from tests.test_cli_train import TINY
from tests.test_train import corpus_text

LAUNCHER = Path(__file__).with_name("ddp_nonfinite_launcher.py")
#: Far below torchrun's and gloo's own timeouts (minutes): a rank left waiting would exceed it.
PROMPT_S = 120


@pytest.mark.slow
@pytest.mark.parametrize(
    ("injected", "expected"),
    [
        (
            "RESSTREAM_TEST_NAN_STEP",
            ("non-finite optimizer state on rank 1", "at step 2; stopped, checkpoint 2 not written"),
        ),
        ("RESSTREAM_TEST_FULL_DISK_STEP", ("no space left on device", "last good checkpoint: step 1")),
    ],
    ids=["nan-on-rank-1", "full-disk-on-rank-0"],
)
def test_a_failure_at_a_checkpoint_on_one_rank_stops_every_rank_with_one_line(tmp_path, injected, expected):
    """`train` under torchrun, a NaN in rank 1's optimizer state or rank 0's write of checkpoint
    2 failing for a full disk: both ranks print the same line and exit 1 at once, and checkpoint
    2 is not written. About 17 s each on 2 cores (torchrun and two processes), so slow."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(), encoding="utf-8")
    out = tmp_path / "run"
    logs = tmp_path / "logs"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "--log-dir",
        str(logs),
        "--redirects",
        "3",
        str(LAUNCHER),
        "train",
        "--dataset",
        str(corpus),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(out),
        *TINY,
        "--checkpoint-interval",
        "1",
        "--max-steps",
        "3",
        "--batch-size",
        "4",
        "--device",
        "cpu",
        "--threads",
        "1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", injected: "2"}
    started = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=PROMPT_S + 60)
    assert time.monotonic() - started < PROMPT_S, "a rank waited for the one that stopped"
    assert done.returncode != 0
    errors = [_error_lines(path) for path in sorted(logs.rglob("stderr.log"))]
    assert len(errors) == 2, done.stderr[-3000:]
    assert errors[0] == errors[1], errors
    (line,) = errors[0]
    assert all(part in line for part in expected), line
    assert "exitcode  : 1" in done.stderr  # torchrun's account (a rank it then stops may show -15)
    assert ckpt.latest_checkpoint_step(out) == 1
    assert not (out / ckpt.CHECKPOINTS / ckpt.step_name(2)).exists()


def _agree(rank: int, port: int, results) -> None:
    """One of two gloo ranks: rank 1 alone finds something and both raise it; nothing found
    passes; both learn that rank 0 asks to stop."""
    import torch.distributed as dist

    from resstream.distributed import Distributed, Failure, any_rank, exchange

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    info = Distributed(rank, 2)
    try:
        try:
            exchange(Failure(1, RuntimeError("nan in exp_avg")) if rank == 1 else None, info)
            found = None
        except RuntimeError as error:
            found = str(error)
        nothing = exchange(None, info)
        stop = any_rank(rank == 0, info, torch.device("cpu"))
        results.put((rank, found, nothing, stop))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_agree_on_what_one_of_them_found():
    """The agreement itself, in the default suite (the slow test above runs it in `train`)."""
    got = two_ranks(_agree)
    assert got == [(0, "nan in exp_avg", [None, None], True), (1, "nan in exp_avg", [None, None], True)]


def _error_lines(path: Path) -> list[str]:
    return [
        line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("resstream: error:")
    ]


if not hasattr(torch.distributed, "is_available") or not torch.distributed.is_available():
    pytestmark = pytest.mark.skip("torch.distributed is not available")
