"""This process's place in a torchrun job, and the batch layout that follows from it.

Launched with `torchrun --nproc_per_node N`, each process reads RANK / WORLD_SIZE / LOCAL_RANK
and joins the process group (NCCL on CUDA, gloo on CPU); run directly, it is rank 0 of 1. The
global batch (`batch_size` sequences) is split evenly over processes and accumulation steps.
The process-group plumbing itself is `resstream.distributed` (re-exported here).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from resstream.distributed import Distributed, init_distributed, launched_rank, writer_lock
from resstream.errors import UsageError
from resstream.training.config import TrainConfig


@contextlib.contextmanager
def run_lock(directory: str | os.PathLike[str], *, param: str | None) -> Iterator[None]:
    """`writer_lock` of a training run's folder. When the folder already holds a run, its
    holder first removes what interrupted writers left there (`checkpoint.remove_leftovers`),
    before any check, so a resume that is then refused leaves no leftovers either; a folder of
    anything else is left as it is (the trainer's checks refuse it)."""
    from resstream.rundir import previous_command
    from resstream.training.checkpoint import remove_leftovers

    with writer_lock(directory, "train", param=param):
        if launched_rank() == 0 and previous_command(Path(directory)) == "train":
            remove_leftovers(Path(directory))
        yield


def check_batch_layout(config: TrainConfig, world: int) -> None:
    """The global batch must split evenly over processes and accumulation steps."""
    parts = config.run.grad_accum * world
    if config.run.batch_size % parts:
        raise UsageError(
            f"`batch_size` {config.run.batch_size} must be divisible by `grad_accum` x processes = {parts}"
        )


__all__ = [
    "Distributed",
    "check_batch_layout",
    "init_distributed",
    "launched_rank",
    "run_lock",
    "writer_lock",
]
