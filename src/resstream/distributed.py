"""This process's place in a torchrun job, and the few collective steps a data-parallel run needs.

Launched with `torchrun --nproc_per_node N`, each process reads RANK / WORLD_SIZE / LOCAL_RANK
and joins the process group (NCCL on CUDA, each rank on cuda:LOCAL_RANK; gloo on CPU); run
directly, it is rank 0 of 1 and nothing here costs anything.

A corpus analysis runs data-parallel in three steps, each written once here:

* **sharding by batch** (`my_batches`): batch i, formed exactly as one process forms it, is
  measured by rank i % world. Whole batches stay whole, so every forward has the shape it has
  in one process and gives the same bits.
* **gathering in batch order** (`run_sharded`): the batches go round in rounds of one batch
  per rank; after each round the ranks' parts are exchanged (`all_gather_object`) and added in
  batch-index order, so each rank reduces them in exactly the order one process would (the
  same sums in the same order, the same result), holds at most one round of parts, and learns
  of a failure on another rank within one batch.
* **failing together** (`exchange`, `one_outcome`): every exchange carries either a rank's
  result or its failure; when any rank failed, every rank raises the lowest failing rank's
  error (same type, same message, so the same one line and exit code), and no rank is left
  waiting in a collective until torchrun kills it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from resstream.errors import ResstreamError
from resstream.rundir import locked_directory

T = TypeVar("T")
P = TypeVar("P")


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
    if not launched():
        return Distributed()
    info = Distributed(launched_rank(), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    if device_kind == "cuda":
        torch.cuda.set_device(info.local_rank)  # before NCCL, so each process owns its GPU
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
        atexit.register(_leave_group)  # NCCL warns at exit about a group never destroyed
    return info


def _leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def launched() -> bool:
    """Whether torchrun (or another launcher setting RANK and WORLD_SIZE) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched_rank() -> int:
    """This process's rank as torchrun set it (0 when run directly), before any group exists."""
    return int(os.environ.get("RANK", "0"))


def joined(device: str | torch.device = "auto") -> Distributed:
    """This process's place, the process group joined when torchrun launched it: NCCL when the
    analysis runs on CUDA (`device` "auto" with a GPU visible, or a CUDA device), else gloo."""
    if not launched():
        return Distributed()
    text = str(device)
    cuda = text.startswith("cuda") or (text == "auto" and torch.cuda.is_available())
    return init_distributed("cuda" if cuda else "cpu")


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


# --------------------------------------------------------------------------- sharding


def my_batches(batches: Iterable[T], info: Distributed) -> Iterator[tuple[int, T]]:
    """(index, batch) of the batches this rank measures: batch i goes to rank i % world
    (every batch, when run directly). `batches` is the whole sequence, as one process forms it."""
    for index, batch in enumerate(batches):
        if index % info.world == info.rank:
            yield index, batch


def run_sharded(
    batches: Iterable[T], measure: Callable[[T], P], add: Callable[[P], None], info: Distributed
) -> None:
    """`add(measure(batch))` for every batch, in batch order, on every rank. The batches go
    round in rounds of `world`: in round r rank k measures batch r·world + k (the assignment of
    `my_batches`), the round's parts are exchanged (`exchange`: a failure on any rank stops
    every rank with that failure, within the round) and every rank adds them in batch order.
    Parts must hold CPU tensors (they travel pickled, and a CUDA tensor would arrive on the
    sender's device). Run directly: exactly the plain loop, each part added when measured."""
    if info.world == 1:
        for batch in batches:
            add(measure(batch))
        return
    for first, round_ in _rounds(batches, info.world):
        mine: Any = []
        if info.rank < len(round_):
            try:
                mine = [(first + info.rank, measure(round_[info.rank]))]
            except Exception as error:
                mine = Failure(info.rank, portable(error))
        for part in in_batch_order(exchange(mine, info), start=first):
            add(part)


def _rounds(batches: Iterable[T], size: int) -> Iterator[tuple[int, list[T]]]:
    """(index of the first batch, up to `size` batches) in order: one round per `size` batches."""
    round_: list[T] = []
    first = 0
    for index, batch in enumerate(batches):
        if not round_:
            first = index
        round_.append(batch)
        if len(round_) == size:
            yield first, round_
            round_ = []
    if round_:
        yield first, round_


def map_sharded(measure: Callable[[T], P], batches: Iterable[T], info: Distributed) -> list[P]:
    """`[measure(batch) for batch in batches]` on every rank, the batches shared out among the
    ranks (`run_sharded`)."""
    parts: list[P] = []
    run_sharded(batches, measure, parts.append, info)
    return parts


def in_batch_order(per_rank: Sequence[Sequence[tuple[int, P]]], start: int = 0) -> list[P]:
    """The parts of every rank ((index, part) pairs) as one list in batch-index order; the
    indices must be start, start + 1, ... once each."""
    indexed = sorted((pair for pairs in per_rank for pair in pairs), key=lambda pair: pair[0])
    if [index for index, _ in indexed] != list(range(start, start + len(indexed))):
        raise RuntimeError(f"the ranks' batches do not cover {start}..{start + len(indexed) - 1} once each")
    return [part for _, part in indexed]


def any_rank(flag: bool, info: Distributed, device: torch.device) -> bool:
    """Whether `flag` is true on any rank: one all-reduce of one number on `device` (the rank's
    own device; NCCL needs a CUDA tensor), cheap enough for every training step. Run directly:
    `flag`. (`exchange` is for what must travel whole: a result or an error.)"""
    if info.world == 1:
        return flag
    asked = torch.tensor(float(flag), device=device)
    dist.all_reduce(asked, op=dist.ReduceOp.MAX)
    return bool(asked.item())


# --------------------------------------------------------------------------- failing together


@dataclass(frozen=True)
class Failure:
    """A rank's failure as it travels to the other ranks: its rank and its error."""

    rank: int
    error: BaseException


def portable(error: BaseException) -> BaseException:
    """`error` if it survives pickling as the same type and message, so that every rank can
    raise it; else its one line: a `ResstreamError` with the same message and exit code (the
    CLI prints the same line), any other error as a RuntimeError naming its type."""
    try:
        copy = pickle.loads(pickle.dumps(error))
        if type(copy) is type(error) and str(copy) == str(error):
            return error
    except Exception:  # an error that cannot travel travels as its one line
        pass
    if isinstance(error, ResstreamError):
        line = ResstreamError(str(error))
        line.exit_code = error.exit_code
        return line
    return RuntimeError(f"{type(error).__name__}: {error}")


def first_failure(outcomes: Sequence[Any]) -> Failure | None:
    """The failure of the lowest failing rank among the ranks' `outcomes` (None if none failed)."""
    failures = [outcome for outcome in outcomes if isinstance(outcome, Failure)]
    return min(failures, key=lambda failure: failure.rank, default=None)


def exchange(outcome: Any, info: Distributed) -> list[Any]:
    """Every rank's `outcome`, in rank order, on every rank (one `all_gather_object`); when any
    rank's is a `Failure`, every rank raises the lowest failing rank's error instead."""
    outcomes = gathered(outcome, info)
    failure = first_failure(outcomes)
    if failure is not None:
        raise _agreed(failure.error)
    return outcomes


def gathered(value: Any, info: Distributed) -> list[Any]:
    """Every rank's `value` (picklable), in rank order, on every rank: `all_gather_object`
    over the process group (NCCL or gloo), `[value]` when run directly."""
    if info.world == 1:
        return [value]
    values: list[Any] = [None] * info.world
    dist.all_gather_object(values, value)
    return values


def _agreed(error: BaseException) -> BaseException:
    """`error`, marked as agreed by every rank (`one_outcome` then exchanges nothing more)."""
    error.__dict__["_resstream_agreed"] = True
    return error


def is_agreed(error: BaseException) -> bool:
    """Whether every rank already raises `error` (it came out of an `exchange`)."""
    return bool(getattr(error, "_resstream_agreed", False))


def on_main_first(make: Callable[[], T], info: Distributed) -> T:
    """`make()` on rank 0 while the other ranks wait, its result (which must pickle) on every
    rank; a failure on rank 0 is every rank's (same type and message). One process: just `make()`."""
    if info.world == 1:
        return make()
    outcome: Any = None
    if info.is_main:
        try:
            outcome = make()
        except Exception as error:
            outcome = Failure(0, portable(error))
    result: T = exchange(outcome, info)[0]
    return result


@contextlib.contextmanager
def one_outcome(info: Distributed) -> Iterator[None]:
    """The block ends the same way on every rank: when it fails on one rank (before, between or
    after the block's own exchanges), that rank sends its failure to the exchange the others are
    in, and every rank raises the lowest failing rank's error; when it succeeds everywhere, one
    last exchange confirms it. Run directly: the block as it is."""
    if info.world == 1:
        yield
        return
    try:
        yield
    except Exception as error:
        if is_agreed(error):
            raise
        exchange(Failure(info.rank, portable(error)), info)
        raise  # not reached: the exchange raises the agreed failure
    exchange(None, info)


__all__ = [
    "Distributed",
    "Failure",
    "any_rank",
    "exchange",
    "first_failure",
    "gathered",
    "in_batch_order",
    "init_distributed",
    "is_agreed",
    "joined",
    "launched",
    "launched_rank",
    "map_sharded",
    "my_batches",
    "on_main_first",
    "one_outcome",
    "portable",
    "run_sharded",
    "writer_lock",
]
