"""`tune-lens` under torchrun (issue 28): 2 gloo processes, each training on its share of every
step's windows with the gradients summed, make the lens one process makes (to float rounding:
the sums are reordered) and the same held-out evaluation; rank 0 alone writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from resstream.analysis.decoding.lens_checkpoint import CHECKPOINT_FILE
from resstream.api.lens_data import Ranks
from resstream.distributed import Distributed, any_rank, on_main_first
from tests.gloo_pair import two_ranks
from tests.lens_support import plays_file

#: 7 windows of 32 tokens a step: the ranks' shares differ (3 and 4), as they may.
ARGS = ["--device", "cpu", "--quiet", "--tokens", "672", "--steps", "3", "--seq-len", "32"]
ARGS += ["--eval-seqs", "6", "--batch-size", "2", "--lr", "0.01"]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
STOP_LAUNCHER = Path(__file__).with_name("tune_lens_stop_launcher.py")


def _tune_lens(launcher, plays, out, tmp_path, *extra, module=("-m", "resstream.cli.main"), code=0, env=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RESSTREAM_CACHE": str(tmp_path / "cache"), **(env or {})}
    args = ["tune-lens", *ARGS, "--dataset", str(plays), "--out", str(out), *extra]
    done = subprocess.run([*launcher, *module, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == code, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The plays file and the lens one process trains on it."""
    tmp_path = tmp_path_factory.mktemp("single")
    plays = plays_file(tmp_path, 40_000)
    _tune_lens([sys.executable], plays, tmp_path / "single", tmp_path)
    return plays, tmp_path / "single"


def assert_same_lens(mine: Path, theirs: Path) -> None:
    """The same translators and training curve to float rounding, the same logit-lens figures
    bit for bit, the tuned lens's held-out figures to rounding."""
    a, b = (load_file(run / "translators.safetensors") for run in (mine, theirs))
    assert a.keys() == b.keys()
    for name, value in a.items():
        torch.testing.assert_close(value, b[name], rtol=1e-5, atol=1e-6, msg=name)
    x, y = (json.loads((run / "evaluation.json").read_text()) for run in (mine, theirs))
    assert x["logit_kl"] == y["logit_kl"] and x["logit_ce"] == y["logit_ce"]  # no lens: bit for bit
    assert x["num_tokens"] == y["num_tokens"] and x["dataset_fingerprint"] == y["dataset_fingerprint"]
    for key in ("tuned_kl", "tuned_ce"):
        torch.testing.assert_close(torch.tensor(x[key]), torch.tensor(y[key]), rtol=1e-5, atol=1e-6)
    curves = [
        json.loads((run / "lens.json").read_text())["training"]["kl_bits_per_step"] for run in (mine, theirs)
    ]
    torch.testing.assert_close(torch.tensor(curves[0]), torch.tensor(curves[1]), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_two_gloo_processes_train_the_lens_one_process_trains(single, tmp_path):
    """About 30 s on 2 cores (torchrun and two processes), so slow."""
    plays, alone = single
    ddp = _tune_lens(TORCHRUN, plays, tmp_path / "ddp", tmp_path)
    assert_same_lens(tmp_path / "ddp", alone)
    assert ddp.stdout.count("wrote the lens") == 1  # rank 0 alone writes and speaks
    assert CHECKPOINT_FILE not in os.listdir(tmp_path / "ddp")
    record = json.loads((tmp_path / "ddp" / "run.json").read_text())
    assert record["config"]["command"] == "tune-lens" and record["processes"] == 2


@pytest.mark.slow
def test_a_ctrl_c_on_one_rank_stops_every_rank_after_the_same_step_and_resumes(single, tmp_path):
    """SIGINT in rank 1 alone during step 2: both ranks stop after step 2 (exit 130), rank 0 has
    saved its checkpoint, and a resume under torchrun gives the lens one process trains.
    About 60 s on 2 cores, so slow."""
    plays, alone = single
    parts = tmp_path / "parts"
    launcher = [*TORCHRUN, str(STOP_LAUNCHER)]
    stop = {"RESSTREAM_TEST_STOP_STEP": "2"}
    stopped = _tune_lens(launcher, plays, parts, tmp_path, module=(), code=1, env=stop)
    assert stopped.stderr.count("exitcode  : 130") == 2, stopped.stderr[-3000:]
    assert stopped.stderr.count("tune-lens stopped at step 2 of 3") == 1  # rank 0 speaks
    assert sorted(p.name for p in parts.iterdir()) == [CHECKPOINT_FILE]
    _tune_lens(TORCHRUN, plays, parts, tmp_path, "--resume")
    assert_same_lens(parts, alone)
    assert json.loads((parts / "run.json").read_text())["config"]["resumed_at_steps"] == [2]


def test_each_rank_takes_a_contiguous_share_of_a_step():
    windows = list(range(7))
    shares = [Ranks(rank, 2).share(windows) for rank in range(2)]
    assert shares == [[0, 1, 2], [3, 4, 5, 6]]
    assert [len(Ranks(rank, 4).share(windows)) for rank in range(4)] == [1, 2, 2, 2]
    assert Ranks().share(windows) == windows and Ranks().is_main


def test_run_directly_the_ranks_agree_with_this_process_alone():
    cpu = torch.device("cpu")
    assert any_rank(True, Distributed(), cpu) and not any_rank(False, Distributed(), cpu)
    assert on_main_first(lambda: 3, Ranks().place) == 3


if not hasattr(torch.distributed, "is_available") or not torch.distributed.is_available():
    pytestmark = pytest.mark.skip("torch.distributed is not available")


def _one_rank_fails_in_a_step(rank: int, port: int, results) -> None:
    """One of two gloo ranks running `LensTrainer._agreed`: rank 1's share of the step raises."""
    import types

    import torch.distributed as dist

    from resstream.api.lens_trainer import LensTrainer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    trainer = types.SimpleNamespace(
        ranks=Ranks(rank, 2), lens=types.SimpleNamespace(translators=torch.nn.Linear(1, 1))
    )

    def share():
        if rank == 1:
            raise MemoryError("CUDA out of memory on rank 1")
        return "rank 0's sums"

    try:
        fine = LensTrainer._agreed(trainer, lambda: rank)  # nobody fails: each its own result
        try:
            LensTrainer._agreed(trainer, share)
            results.put((rank, fine, "no error"))
        except MemoryError as error:
            results.put((rank, fine, str(error)))
    finally:
        dist.destroy_process_group()


def test_a_failure_in_one_ranks_share_of_a_step_stops_both_ranks():
    """No rank is left in the gradient all-reduce: both raise rank 1's error (issue 28)."""
    got = two_ranks(_one_rank_fails_in_a_step)
    assert got == [(0, 0, "CUDA out of memory on rank 1"), (1, 1, "CUDA out of memory on rank 1")]
