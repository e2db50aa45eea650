"""Host synchronisations of the sync-free rank scheme (issue 28), counted on the CPU: every
operation that makes a CUDA host wait for the device (reading a value: `.item()`, `bool()`,
`int()`, `.tolist()`; a shape that depends on values: `nonzero`, boolean indexing, `bincount`,
`repeat_interleave` by a tensor, ...) shows up as an aten call that a dispatch mode can see,
whatever the device. The per-layer loop of a deferred block must make none of them; a
batch of `shift` must make the same number whatever its number of layers."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from resstream.analysis.decoding import Decoder
from resstream.analysis.decoding.ranks import RankScreen
from resstream.analysis.shift.alignment import AlignmentAccumulator
from tests.test_ranks import gpt2_like, near_tie_case

SYNCING = {
    "aten._local_scalar_dense",  # .item(), bool(), int(), float()
    "aten.nonzero",
    "aten.nonzero_static",
    "aten.masked_select",
    "aten.bincount",  # on CUDA it reads the maximum to size its output
    "aten.unique",
    "aten._unique2",
    "aten.unique_consecutive",
    "aten.unique_dim",
    "aten.equal",
    "aten.is_nonzero",
}


class SyncCounter(TorchDispatchMode):
    """Counts the aten calls that would synchronise a CUDA device with its host."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.replace("::", ".")
        if name in SYNCING or _boolean_index(name, args) or _tensor_repeats(name, args):
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


def _boolean_index(name, args) -> bool:
    if name not in ("aten.index", "aten.index_put", "aten.index_put_"):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


def _tensor_repeats(name, args) -> bool:
    return name == "aten.repeat_interleave" and len(args) > 1 and isinstance(args[1], torch.Tensor)


@contextlib.contextmanager
def host_reads_refused():
    """Reading tensors on the host by the paths that bypass the dispatcher fails the test."""
    with pytest.MonkeyPatch.context() as patch:
        for method in ("tolist", "numpy", "cpu"):
            patch.setattr(torch.Tensor, method, _refused(method))
        yield


def _refused(method):
    def read(self, *args, **kwargs):
        raise AssertionError(f"Tensor.{method}() inside the per-layer loop: a host synchronisation")

    return read


@pytest.mark.parametrize("limit", [5, 300, None])
@pytest.mark.parametrize("low_precision", [None, torch.bfloat16])
def test_deferred_sync_free_calls_make_no_host_synchronisation(low_precision, limit):
    x, W, ids = near_tie_case()
    targets = torch.stack([ids, ids.flip(0)], 1)
    screen = RankScreen(W, None, low_precision=low_precision, sync_free=True, chunk_bytes=40 * 3100 * 4)
    counter = SyncCounter()
    with screen.deferred():
        with counter, host_reads_refused():
            for layer in range(4):  # "layers": several blocks, both targets, every path
                screen.ranks(x * (1 + layer / 8), targets, limit, ids_checked=True)
        assert not counter.calls, dict(counter.calls)


def test_the_selecting_scheme_does_synchronise():
    """The counter sees what it is meant to see (so the test above can fail)."""
    x, W, ids = gpt2_like(n=32, vocab=3000, d=32)
    screen = RankScreen(W, None, low_precision=torch.bfloat16, sync_free=False)
    counter = SyncCounter()
    with screen.deferred(), counter:
        screen.ranks(x, ids[:, None], None, ids_checked=True)
    assert counter.calls


def _shift_batch_syncs(num_layers: int, sync_free: bool) -> int:
    g = torch.Generator().manual_seed(num_layers)
    vocab, d = 3000, 32
    W = torch.randn(vocab, d, generator=g)
    tokens = torch.randint(0, vocab, (2, 9), generator=g)
    states = torch.randn(num_layers + 1, 2, 9, d, generator=g)
    acc = AlignmentAccumulator(
        num_layers=num_layers,
        top_k=5,
        decoder=Decoder("embedding", W),
        W_E=W,
        W_U=W,
        low_precision=None,
        sync_free=sync_free,
    )
    acc.update(states, tokens)  # warm-up: the screen's reused buffer
    counter = SyncCounter()
    with counter:
        acc.update(states, tokens)
    return sum(counter.calls.values())


def test_a_shift_batch_synchronises_a_fixed_number_of_times_whatever_its_depth():
    assert _shift_batch_syncs(2, True) == _shift_batch_syncs(9, True)
    assert _shift_batch_syncs(9, False) > _shift_batch_syncs(2, False)  # the selecting scheme: per layer


def test_host_read_guard_works():
    with pytest.raises(AssertionError, match="host synchronisation"), host_reads_refused():
        torch.ones(2).tolist()
    assert torch.ones(2).tolist() == [1.0, 1.0]
