"""Batches of token windows, chosen as a pure function of (seed, step).

Step s draws `batch_size` window starts from a generator seeded with (seed, s); micro-step m
of process r takes its own contiguous slice of them. So the data order does not depend on
how many processes or accumulation steps share a batch, and a resumed run sees exactly the
batches an uninterrupted run would have seen, with no iterator state to save.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from resstream.data.tokens import TokenIds
from resstream.errors import UsageError

_STEP_STRIDE = 1_000_003  # a prime, so (seed, step) pairs do not collide for realistic runs


def check_enough_tokens(tokens: TokenIds, block_size: int, what: str, *, sequences: int = 1) -> None:
    """Refuse a split smaller than `sequences` disjoint windows of block_size tokens, plus
    the one more token that window sampling needs (`window_starts` draws from
    [0, len - block_size - 1))."""
    needed = sequences * block_size + 2
    if len(tokens) < needed:
        unit = "one sequence" if sequences == 1 else f"one batch ({sequences} sequences)"
        raise UsageError(
            f"the {what} split has {len(tokens)} tokens, fewer than {unit} of `block_size` "
            f"{block_size} needs ({needed}); use a larger corpus or a smaller `block_size`/`batch_size`"
        )


def window_starts(num_tokens: int, block_size: int, batch_size: int, *, seed: int, step: int) -> Tensor:
    """The `batch_size` window starts of training step `step` (int64, CPU)."""
    gen = torch.Generator().manual_seed(seed * _STEP_STRIDE + step)
    return torch.randint(0, num_tokens - block_size - 1, (batch_size,), generator=gen)


def windows(tokens: TokenIds, starts: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """Inputs and next-token targets (both batch × block_size, int64) at the given starts."""
    rows = np.stack([tokens[s : s + block_size + 1] for s in starts.tolist()]).astype(np.int64)
    batch = torch.from_numpy(rows)
    return batch[:, :-1], batch[:, 1:]


def micro_batch(
    tokens: TokenIds,
    block_size: int,
    batch_size: int,
    *,
    seed: int,
    step: int,
    micro: int,
    grad_accum: int,
    rank: int = 0,
    world: int = 1,
) -> tuple[Tensor, Tensor]:
    """The slice of step `step`'s batch that micro-step `micro` of process `rank` trains on."""
    per_slice = batch_size // (grad_accum * world)
    starts = window_starts(len(tokens), block_size, batch_size, seed=seed, step=step)
    first = (micro * world + rank) * per_slice
    return windows(tokens, starts[first : first + per_slice], block_size)


def eval_starts(num_tokens: int, block_size: int, count: int) -> Tensor:
    """`count` window starts spread evenly over a split: the same for every model and seed."""
    last = num_tokens - block_size - 1
    return torch.linspace(0, last, count).round().long().unique()
