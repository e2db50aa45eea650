"""This process's place in a torchrun job, and the batch layout that follows from it.

Launched with `torchrun --nproc_per_node N`, each process reads RANK / WORLD_SIZE / LOCAL_RANK
and joins the process group (NCCL on CUDA, gloo on CPU); run directly, it is rank 0 of 1. The
global batch (`batch_size` sequences) is split evenly over processes and accumulation steps.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from resstream.errors import UsageError
from resstream.rundir import locked_directory
from resstream.training.config import TrainConfig


@dataclass(frozen=True)
class Distributed:
    """This process's place in a torchrun job (rank 0 of 1 when run directly)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_kind: str) -> Distributed:
    """Join the torchrun process group when launched by torchrun, else a single process."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return Distributed()
    info = Distributed(launched_rank(), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    if device_kind == "cuda":
        torch.cuda.set_device(info.local_rank)  # before NCCL, so each process owns its GPU
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return info


def launched_rank() -> int:
    """This process's rank as torchrun set it (0 when run directly), before any group exists."""
    return int(os.environ.get("RANK", "0"))


@contextlib.contextmanager
def writer_lock(directory: str | os.PathLike[str], command: str, *, param: str | None) -> Iterator[None]:
    """The run-directory lock (`resstream.rundir`), taken by the process that writes: rank 0.

    The other ranks of a torchrun job share rank 0's directory and never write to it.
    """
    if launched_rank() != 0:
        yield
        return
    with locked_directory(Path(directory), command, param=param):
        yield


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
