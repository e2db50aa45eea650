"""Exact ranks of given tokens among all decoder scores, fast (floating-point bounds).

A decoder turns an input vector x (a normed residual state) into scores over the vocabulary,
s_j = w_j · x (+ b_j). This module answers "what is the rank of token t" (rank = the number of
entries whose score is *strictly* greater than s_t, scores evaluated in float64, so t ∈ top-k
⇔ rank < k) and "which k tokens score highest" (`RankScreen.top_k`, ties broken by the lower
token id), exactly, without building a ranking. It is the one door to the rank engine, whose
parts are modules of their own:

* `ranks_exact`: the definition, its fp64 reference `exact_ranks`, and the input checks.
* `ranks_screen`: the screen — all V scores in a screening precision (bf16 or fp32), the exact
  score of each target, and a rigorous per-position bound on |screen − exact| that makes two
  thresholds per query (the bound's derivation is `Screen`'s docstring).
* `ranks_selecting`: the selecting scheme — count what the thresholds decide, re-score only
  the ambiguous band exactly; with a `limit` k, one top-k of the screen scores decides almost
  every position. The CPU's default.
* `ranks_sync_free`: the same answers in fixed shapes, without host synchronisation (`sync_free`:
  on CUDA by default, where it pays); `RankScreen.deferred` settles what it leaves unsure once
  for a whole batch of calls, by the selecting scheme.
* `ranks_top_k`: exact top-k lists from the same screen.
* `ranks_decode`: top-k lists, ranks and the softmax's normaliser from one fp32 screen (a lens).

`RankScreen` prepares a matrix once for many queries; `fast_ranks` is one query. Every public
name of those modules that callers use is importable from here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, TypedDict, Unpack

import torch
from torch import Tensor

from resstream.analysis.decoding.ranks_decode import Decoded, decode_states
from resstream.analysis.decoding.ranks_exact import (
    DEFAULT_CHUNK_BYTES,
    check_ids,
    check_limit,
    check_matrix,
    check_rank_inputs,
    exact_ranks,
)
from resstream.analysis.decoding.ranks_screen import (
    LowPrecision,
    Screen,
    ScreenStats,
    resolve_chunk_bytes,
    resolve_low_precision,
)
from resstream.analysis.decoding.ranks_selecting import selecting_ranks
from resstream.analysis.decoding.ranks_sync_free import sync_free_ranks
from resstream.analysis.decoding.ranks_top_k import top_k_lists

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "TOPK_MAX",
    "Decoded",
    "LowPrecision",
    "NonFiniteCall",
    "RankScreen",
    "ScreenOptions",
    "ScreenStats",
    "SyncFree",
    "check_ids",
    "check_matrix",
    "exact_ranks",
    "fast_ranks",
    "resolve_chunk_bytes",
    "resolve_low_precision",
    "resolve_sync_free",
]

SyncFree = bool | Literal["auto"]

TOPK_MAX = 256  # above this, `limit` queries use the counting path instead of a top-k


def resolve_sync_free(sync_free: SyncFree, device: torch.device) -> bool:
    """Whether ranks are computed without host synchronisation: "auto" is True on CUDA (where a
    synchronisation costs more than the work it decides) and False elsewhere."""
    if isinstance(sync_free, str):
        if sync_free != "auto":
            raise ValueError(f"sync_free {sync_free!r}; allowed: auto, True, False")
        return device.type == "cuda"
    if not isinstance(sync_free, bool):
        raise ValueError(f"sync_free {sync_free!r}; allowed: auto, True, False")
    return sync_free


class NonFiniteCall(ValueError):
    """Inputs holding inf or nan found when a `RankScreen.deferred` block settled: `call` is the
    0-based index of the first such `ranks` call inside the block."""

    def __init__(self, call: int) -> None:
        super().__init__(f"non-finite values in the decoder inputs of call {call} of the block")
        self.call = call


@dataclass
class _Pending:
    """A `ranks` call inside a `deferred` block, kept until the block settles."""

    x: Tensor
    ids: Tensor
    limit: int | None
    ranks: Tensor
    unsure: Tensor | None  # None: the selecting scheme answered every row already
    finite: Tensor


class ScreenOptions(TypedDict, total=False):
    """How the rank engine computes (`RankScreen`'s keywords, its defaults there): the
    screening dtype ``low_precision``, the score-block size ``chunk_bytes`` and the
    ``sync_free`` scheme. The answers depend on none of them; a function that builds a
    `RankScreen` for its caller takes them as ``**screen: Unpack[ScreenOptions]``."""

    low_precision: LowPrecision
    chunk_bytes: int | None
    sync_free: SyncFree


class RankScreen(Screen):
    """A decoder matrix prepared for repeated fast exact rank queries and top-k lists (module
    docstring; the screen and its error bound: `ranks_screen.Screen`).

    `low_precision`: the screening dtype (`resolve_low_precision`); `chunk_bytes`: the size of
    one (positions × vocab) score block (`resolve_chunk_bytes`); `sync_free`: the fixed-shape
    scheme instead of the selecting one (`resolve_sync_free`).
    """

    def __init__(
        self,
        matrix: Tensor,
        bias: Tensor | None = None,
        *,
        low_precision: LowPrecision = "auto",
        chunk_bytes: int | None = None,
        sync_free: SyncFree = "auto",
    ) -> None:
        super().__init__(matrix, bias, low_precision, chunk_bytes)
        self.sync_free = resolve_sync_free(sync_free, self.device)
        self._pending: list[_Pending] | None = None  # inside a `deferred` block

    @property
    def deferring(self) -> bool:
        """Whether a `deferred` block is open."""
        return self._pending is not None

    def ranks(
        self, x: Tensor, ids: Tensor, limit: int | None = None, *, ids_checked: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Exact ranks of tokens `ids` (n, m) for decoder inputs `x` (n, d), and their fp64 scores.

        With `limit` = k the ranks are min(rank, k): exact below k, which is all top-k
        membership needs (rank < k). Returns (ranks int64 (n, m), scores float64 (n, m)).
        `ids_checked`: the caller has checked `ids` against the vocabulary already (the check
        reads them on the host). Inside a `deferred` block the ranks are final only once the
        block has ended.
        """
        x = self.check_inputs(x)
        if not isinstance(ids, Tensor) or ids.dim() != 2:
            shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"token ids must be (n, m), got {shape}")
        ids = ids.to(self.device)
        if not ids_checked or ids.shape[0] != x.shape[0]:
            check_ids("token ids", ids, (x.shape[0], ids.shape[1]), self.vocab)
        check_limit(limit, self.vocab, "limit")
        if limit is not None and limit >= self.vocab:  # every rank is < vocab: no clamping
            limit = None
        if x.shape[0] == 0:
            empty = torch.zeros(0, ids.shape[1], device=self.device)
            return empty.long(), empty.double()
        ranks, scores, unsure = self._blocks(x, ids, limit, self.sync_free)
        if self._pending is not None:
            self._pending.append(_Pending(x, ids, limit, ranks, unsure, torch.isfinite(x).all()))
        elif unsure is not None:
            self._settle_rows(x, ids, limit, ranks, unsure)
        return ranks, scores

    def top_k(self, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The `k` highest-scoring tokens of each input, exactly: (ids (n, k), fp64 scores),
        exact score descending, ties by the lower token id (`ranks_top_k`), so the list agrees
        with `ranks` (the token at list position p has rank <= p, equality without ties)."""
        return top_k_lists(self, x, k)

    def decode(
        self, x: Tensor, ids: Tensor, k: int, *, softcap: float | None = None, probabilities: bool = True
    ) -> Decoded:
        """The top-`k` lists, the ranks of `ids` (n, m) and the log-normaliser of decoder
        inputs `x` (n, d), from one fp32 screen per block (`ranks_decode`); needs a screen
        built with ``low_precision=None``. `softcap`: the logit soft-capping constant the
        probabilities apply (the ranks and lists ignore it: it is monotone); `probabilities`
        False skips the normaliser."""
        return decode_states(self, x, ids, k, softcap, probabilities)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A block of `ranks` calls (e.g. every layer of a batch) that synchronises with the
        host once, when it ends: then the inputs' finiteness is checked (`NonFiniteCall`
        names the first call that had inf or nan; its ranks mean nothing) and the rows the
        sync-free scheme left unsure are settled in place. Read the ranks after the block."""
        if self._pending is not None:
            raise RuntimeError("deferred blocks of one RankScreen do not nest")
        self._pending = []
        try:
            yield
            pending = self._pending
        finally:
            self._pending = None
        self._settle(pending)

    def _settle(self, pending: list[_Pending]) -> None:
        if not pending:
            return
        no = torch.zeros((), dtype=torch.bool, device=self.device)
        flags = torch.stack(
            [torch.stack([~p.finite, no if p.unsure is None else p.unsure.any()]) for p in pending]
        ).tolist()  # the block's one host synchronisation
        for call, (non_finite, _) in enumerate(flags):
            if non_finite:
                raise NonFiniteCall(call)
        for p, (_, unsure) in zip(pending, flags, strict=True):
            if unsure:
                assert p.unsure is not None
                self._settle_rows(p.x, p.ids, p.limit, p.ranks, p.unsure)

    def _settle_rows(self, x: Tensor, ids: Tensor, limit: int | None, ranks: Tensor, unsure: Tensor) -> None:
        """Replace the ranks of rows with an unsure entry by the selecting scheme's, in place."""
        rows = torch.nonzero(unsure.any(1)).flatten()
        if rows.numel():
            self.stats.unsure_rows += rows.numel()
            ranks[rows] = self._blocks(x[rows], ids[rows], limit, False)[0]

    def _blocks(
        self, x: Tensor, ids: Tensor, limit: int | None, sync_free: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(ranks, scores, unsure or None) of every block of `chunk_rows` positions."""
        parts = [self._ranks_block(x[rows], ids[rows], limit, sync_free) for rows in self.blocks(x.shape[0])]
        ranks, scores = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        unsure = torch.cat([p[2] for p in parts]) if sync_free else None  # type: ignore[misc]
        return ranks, scores, unsure

    def _ranks_block(
        self, x: Tensor, ids: Tensor, limit: int | None, sync_free: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        block = self.screened(x, ids)
        top_k_path = limit is not None and limit <= TOPK_MAX
        if sync_free:
            ranks, unsure = sync_free_ranks(self, block, limit, top_k_path)
            return ranks, block.s_t, unsure
        return selecting_ranks(self, block, limit, top_k_path), block.s_t, None


def fast_ranks(
    x: Tensor,
    matrix: Tensor,
    bias: Tensor | None,
    token_ids: Tensor,
    *,
    limit: int | None = None,
    **screen: Unpack[ScreenOptions],
) -> Tensor:
    """The ranks of `exact_ranks`, computed by the screened scheme (module docstring; `screen`:
    the engine's settings, `ScreenOptions`).

    With `limit` = k returns min(rank, k) (exact below k: what top-k membership needs), which
    is much cheaper than full ranks. For repeated calls on one matrix build a `RankScreen`.
    """
    check_rank_inputs(x, matrix, bias, token_ids)
    return RankScreen(matrix, bias, **screen).ranks(x, token_ids[:, None], limit)[0][:, 0]
