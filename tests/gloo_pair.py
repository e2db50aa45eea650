"""Two gloo ranks in spawned processes, for tests of what ranks agree on without torchrun: each
runs `target(rank, port, results)` (a module-level function, so that it pickles), joins the
group at tcp://127.0.0.1:port and puts what it found on the `results` queue."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any


def two_ranks(target: Callable[..., None], timeout: float = 60) -> list[Any]:
    """What the two ranks put on their queue, sorted (so rank 0's first when it leads)."""
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=target, args=(rank, port, results)) for rank in range(2)]
    for worker in workers:
        worker.start()
    got = sorted(results.get(timeout=timeout) for _ in workers)
    for worker in workers:
        worker.join(timeout=timeout)
    return got
