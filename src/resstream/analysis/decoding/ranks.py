"""Exact ranks of given tokens among all decoder scores, fast (floating-point bounds).

A decoder turns an input vector x (a normed residual state) into scores over the vocabulary,
s_j = w_j · x (+ b_j), w_j the rows of a (vocab, d) matrix. This module answers "what is the
rank of token t", rank = the number of entries whose score is *strictly* greater than s_t, so
t ∈ top-k ⇔ rank < k (ties are inclusive), and "which k tokens score highest" (`top_k`,
ties broken by the lower token id), exactly, without building a ranking.

Exact scores. A score is the dot product of x with a row of the matrix, plus the bias,
evaluated in float64 from the values as given (fp32, or bf16 for bf16 models). Products of
two fp32 numbers are exact in fp64 and the fp64 sum is within d·2^-53 of the real value, so
ranks do not depend on BLAS kernels, batch shapes or devices (a plain fp32 matmul differs by a
few ulps between kernels, so "the fp32 rank" is not well defined at near ties; the fp64
evaluation is the well-defined version of it).

Fast exact scheme (`RankScreen`, `fast_ranks`). Membership needs the rank of one token, not
a ranking. Per chunk of positions: the exact score s_t of each target (a gathered fp64 dot
product), all V scores in a screening precision (bf16 matmul, or fp32), and a rigorous
per-position bound E on |screen − exact| (see `RankScreen` for the derivation). Entries whose
screen score is certainly above s_t, or certainly not above it, are counted without further
work; only the ambiguous band in between is re-scored exactly. With a `limit` k, one top-k
of the screen scores decides almost every position: the k-th largest screen score above the
band means rank ≥ k, below it means every candidate is in the top-k list.

On a GPU the selections of this scheme (which rows are ambiguous, which entries lie in the band)
are host synchronisations; `ranks_sync_free` computes the same answers in fixed shapes, and
`RankScreen.deferred` settles what that variant leaves unsure once for a whole batch of calls
(`sync_free`: on CUDA by default, where it pays; the CPU keeps the selecting scheme).

`exact_ranks` is the straightforward reference (an fp64 matmul over every entry) that the
tests hold the fast scheme to.

(Longer than the ~500 lines we aim for, on purpose: it is one idea — a screen with a rigorous
error bound and the three queries built on it, full ranks, ranks up to k, top-k lists — and
the bound's derivation in `RankScreen`'s docstring has to stay beside every comparison that
relies on it.)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from resstream.analysis.decoding.ranks_sync_free import sync_free_ranks

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "LowPrecision",
    "NonFiniteCall",
    "RankScreen",
    "ScreenStats",
    "check_ids",
    "check_matrix",
    "exact_ranks",
    "fast_ranks",
    "resolve_chunk_bytes",
    "resolve_low_precision",
    "resolve_sync_free",
]

LowPrecision = torch.dtype | None | Literal["auto"]
SyncFree = bool | Literal["auto"]

DEFAULT_CHUNK_BYTES = 64 * 2**20  # one (positions × vocab) score block on a CPU (its caches)
_DEVICE_CHUNK_FRACTION = 16  # on a GPU: up to this fraction of the free memory per block
_DEVICE_CHUNK_MAX = 2**30
_TOPK_MAX = 256  # above this, `limit` queries use the counting path instead of a top-k
_HEAVY_FRACTION = 16  # a band above vocab/16 entries is re-scored by an fp64 matmul instead
_PAIR_BLOCK_BYTES = 32 * 2**20  # memory for one block of gathered fp64 rows
_U = {torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24, torch.float64: 2.0**-53}


# --------------------------------------------------------------------------- checks


def check_matrix(what: str, matrix: Tensor) -> None:
    if not isinstance(matrix, Tensor) or matrix.dim() != 2 or not matrix.is_floating_point():
        shape = tuple(matrix.shape) if isinstance(matrix, Tensor) else type(matrix).__name__
        raise ValueError(f"{what} must be a floating (vocab, d_model) tensor, got {shape}")
    if matrix.shape[0] < 1 or matrix.shape[1] < 1:
        raise ValueError(f"{what} is empty: shape {tuple(matrix.shape)}")


def _check_limit(limit: int | None, vocab: int, what: str = "top_k") -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= vocab:
        raise ValueError(f"{what} = {limit!r}; allowed: an integer from 1 to the vocabulary size {vocab}")


# --------------------------------------------------------------------------- reference


def exact_ranks(
    x: Tensor,
    matrix: Tensor,
    bias: Tensor | None,
    token_ids: Tensor,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Tensor:
    """Reference rank of `token_ids[i]` among the scores `matrix @ x[i] (+ bias)`.

    `x` (n, d) are decoder inputs (already normed); rank = number of vocabulary entries with a
    strictly greater score, scores evaluated in float64 (module docstring). Straightforward and
    slow: a float64 copy of the matrix and an fp64 matmul over every entry. Returns int64 (n,).
    """
    vocab = _check_rank_inputs(x, matrix, bias, token_ids)
    w64 = matrix.to(torch.float64)
    b64 = bias.to(device=matrix.device, dtype=torch.float64) if bias is not None else None
    x64 = x.to(device=matrix.device, dtype=torch.float64)
    ids = token_ids.to(matrix.device)
    rows = max(1, chunk_bytes // (8 * vocab))
    out = []
    for start in range(0, x64.shape[0], rows):
        scores = x64[start : start + rows] @ w64.T
        if b64 is not None:
            scores += b64
        own = scores.gather(1, ids[start : start + rows, None])
        out.append((scores > own).sum(1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64, device=matrix.device)


def _check_rank_inputs(x: Tensor, matrix: Tensor, bias: Tensor | None, token_ids: Tensor) -> int:
    check_matrix("decoder matrix", matrix)
    vocab, d = matrix.shape
    if x.dim() != 2 or x.shape[1] != d:
        raise ValueError(f"x has shape {tuple(x.shape)}, expected (n, {d}) to match the matrix")
    if bias is not None and tuple(bias.shape) != (vocab,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({vocab},)")
    check_ids("token_ids", token_ids, (x.shape[0],), vocab)
    return vocab


def check_ids(what: str, ids: Tensor, shape: tuple[int, ...], vocab: int) -> None:
    if not isinstance(ids, Tensor) or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"{what} must be an integer tensor")
    if tuple(ids.shape) != shape:
        raise ValueError(f"{what} has shape {tuple(ids.shape)}, expected {shape}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(
            f"{what} holds ids from {int(ids.min())} to {int(ids.max())}; "
            f"allowed: 0 to {vocab - 1} (the decoder's vocabulary)"
        )


# --------------------------------------------------------------------------- fast scheme


@dataclass
class ScreenStats:
    """Counters of the work the screen left to exact re-scoring (for measurements)."""

    rows: int = 0  # (position, target) queries answered
    rescored_rows: int = 0  # queries whose screen result needed exact re-scoring
    rescored_entries: int = 0  # vocabulary entries re-scored by gathered fp64 dot products
    heavy_rows: int = 0  # queries whose band was so wide that an fp64 matmul re-scored the row
    band_entries: int = 0  # entries inside the ambiguous band, where the band was formed
    unsure_rows: int = 0  # sync-free: rows left unsure, then settled by the selecting scheme
    # (with `sync_free` the counters above count only that settling: the fixed-shape work is
    # not counted, which would need a host synchronisation per block)


def _gamma(n: int, u: float) -> float:
    """Higham's γ_n = n·u / (1 − n·u): bound on the relative error of n roundings."""
    return n * u / (1.0 - n * u)


def resolve_low_precision(low_precision: LowPrecision, device: torch.device) -> torch.dtype:
    """The screening dtype: bf16 or fp32. "auto" is bf16 on CUDA, fp32 elsewhere.

    (On CPUs without native bf16 arithmetic a bf16 matmul is several times slower than fp32:
    measured 5× on an AVX2 EPYC, so the fp32 screen is the fast one there.)
    """
    if isinstance(low_precision, str):
        if low_precision != "auto":
            raise ValueError(f"low_precision {low_precision!r}; allowed: auto, torch.bfloat16, None")
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if low_precision is None or low_precision == torch.float32:
        return torch.float32
    if low_precision == torch.bfloat16:
        return torch.bfloat16
    raise ValueError(f"low_precision {low_precision}; allowed: auto, torch.bfloat16, None (fp32)")


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


def resolve_chunk_bytes(chunk_bytes: int | None, device: torch.device) -> int:
    """The score-block size: `chunk_bytes` as given, or by default 64 MiB on a CPU (a block
    that stays near its caches) and 1/16 of the free memory, at most 1 GiB, on a GPU (few,
    large blocks: each block costs kernel launches, not cache misses)."""
    if chunk_bytes is not None:
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes = {chunk_bytes!r}; allowed: a positive integer or None")
        return chunk_bytes
    if device.type != "cuda":
        return DEFAULT_CHUNK_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return max(DEFAULT_CHUNK_BYTES, min(_DEVICE_CHUNK_MAX, free // _DEVICE_CHUNK_FRACTION))


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


@contextlib.contextmanager
def _strict_matmul(device: torch.device) -> Iterator[None]:
    """Matmuls with IEEE fp32 accumulation: no TF32 / implicit bf16, no reduced-precision
    split-K reductions (the error bound assumes fp32 accumulation). Restores the settings."""
    saved_precision = torch.get_float32_matmul_precision()
    saved_cuda: dict[str, bool] = {}
    names = (
        "allow_bf16_reduced_precision_reduction",
        "allow_fp16_reduced_precision_reduction",
    )
    try:
        if saved_precision != "highest":
            torch.set_float32_matmul_precision("highest")
        if device.type == "cuda":
            for name in names:
                saved_cuda[name] = getattr(torch.backends.cuda.matmul, name)
                setattr(torch.backends.cuda.matmul, name, False)
        yield
    finally:
        if saved_precision != "highest":
            torch.set_float32_matmul_precision(saved_precision)
        for name, value in saved_cuda.items():
            setattr(torch.backends.cuda.matmul, name, value)


class RankScreen:
    """A decoder matrix prepared for repeated fast exact rank queries (module docstring).

    Error bound. Write x' = [x, 1], w'_j = [w_j, b_j] (the bias as an extra input column; d' =
    d + 1 with a bias, else d), x̃, w̃ their screening-precision roundings, δx = x' − x̃,
    δw = w' − w̃ (computed exactly). Then x'·w' − x̃·w̃_j = δx·w'_j + x̃·δw_j, bounded by
    Cauchy–Schwarz with the exactly computed norms; the fp32 accumulation of the screening
    matmul (products of bf16 numbers are exact in fp32) adds at most γ_{d'}(2^-24)·Σ|x̃||w̃| ≤
    γ_{d'}(2^-24)·‖x̃‖‖w̃_j‖ (Higham, any summation order); the fp64 evaluation of the exact
    score adds γ_{d'+2}(2^-53)·‖x'‖‖w'_j‖; flushed denormals add < d'·2^-126 per unit norm. With
    X = ‖x'‖ + ‖δx‖ and W = max_j ‖w'_j‖ + max_j ‖δw_j‖:

        E = 2·( ‖δx‖·W + X·max_j‖δw_j‖ + (γ_{d'}(2^-24) + γ_{d'+2}(2^-53))·X·W
               + d'·2^-125·(1 + X)(1 + W) )

    (2 = safety factor). The stored screen score z_j is the accumulated value rounded once to
    the output precision (unit roundoff u: 2^-8 for bf16, 2^-24 for fp32), so the accumulated
    value lies within c·|z_j| of z_j, c = u/(1 − u). Hence s_j > s_t for sure when
    z_j − c|z_j| > s_t + E and s_j ≤ s_t for sure when z_j + c|z_j| ≤ s_t − E; both tests are
    monotone in z_j and become comparisons against per-position thresholds, rounded outwards
    to fp32. Only entries between the thresholds are re-scored exactly.
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
        check_matrix("decoder matrix", matrix)
        self.vocab, self.d_model = matrix.shape
        if bias is not None and tuple(bias.shape) != (self.vocab,):
            raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({self.vocab},)")
        self.matrix = matrix
        self.device = matrix.device
        self.bias64 = bias.to(self.device, torch.float64) if bias is not None else None
        self.dtype = resolve_low_precision(low_precision, self.device)
        self.chunk_bytes = resolve_chunk_bytes(chunk_bytes, self.device)
        self.sync_free = resolve_sync_free(sync_free, self.device)
        self.d_eff = self.d_model + (1 if bias is not None else 0)
        self.stats = ScreenStats()
        self._augment = bias is not None and self.dtype != torch.float32
        self._screen_w, self._screen_b = self._screen_matrix(bias)
        self._w_max, self._dw_max = self._row_norm_maxima(bias)
        self._buffer: Tensor | None = None
        self._pending: list[_Pending] | None = None  # inside a `deferred` block
        self._inf = torch.tensor(math.inf, device=self.device)  # made once: no copy per call

    @property
    def deferring(self) -> bool:
        """Whether a `deferred` block is open."""
        return self._pending is not None

    # ----------------------------------------------------------------- preparation

    def _screen_matrix(self, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The matrix in screening precision; a bias becomes an extra column (bf16) or is
        added after the fp32 matmul."""
        if self._augment:
            assert bias is not None
            full = torch.empty(self.vocab, self.d_eff, dtype=self.dtype, device=self.device)
            full[:, : self.d_model] = self.matrix
            full[:, self.d_model] = bias.to(self.device)
            return full, None
        w = self.matrix.to(self.dtype)
        b = bias.to(self.device, torch.float32) if bias is not None else None
        return w, b

    def _row_norm_maxima(self, bias: Tensor | None) -> tuple[float, float]:
        """max_j ‖w'_j‖ and max_j ‖w'_j − w̃_j‖, in fp64, a block of rows at a time (small
        blocks: this runs once per model, and its temporaries should not raise the peak).
        A screen in the matrix's own precision rounds nothing, so δw = 0 there."""
        rows = max(1, self.chunk_bytes // (128 * self.d_eff))
        rounds = self._screen_w.dtype != self.matrix.dtype or self._augment
        w_max = dw_max = 0.0
        for start in range(0, self.vocab, rows):
            stop = min(self.vocab, start + rows)
            exact = self.matrix[start:stop].to(torch.float64)
            sq = exact.square().sum(1)
            if rounds:
                screen = self._screen_w[start:stop, : self.d_model].to(torch.float64)
                dsq = exact.sub_(screen).square_().sum(1)
            else:
                dsq = torch.zeros_like(sq)
            if bias is not None:
                b = bias[start:stop].to(self.device, torch.float64)
                sq += b.square()
                if self._augment:
                    dsq += (b - self._screen_w[start:stop, self.d_model].to(torch.float64)).square()
            w_max = max(w_max, float(sq.max().sqrt()))
            dw_max = max(dw_max, float(dsq.max().sqrt()))
        return w_max, dw_max

    # ----------------------------------------------------------------- exact pieces

    def exact_scores(self, x64: Tensor, ids: Tensor) -> Tensor:
        """fp64 scores of token `ids` (n, m) for inputs `x64` (n, d): the canonical exact score."""
        n, m = ids.shape
        rows = torch.arange(n, device=self.device).repeat_interleave(m)
        return self._pair_scores(x64, rows, ids.reshape(-1)).reshape(n, m)

    def _pair_scores(self, x64: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
        """Exact scores of (position, vocabulary entry) pairs by gathered fp64 dot products."""
        block = max(1, _PAIR_BLOCK_BYTES // (16 * self.d_model))
        out = torch.empty(rows.numel(), dtype=torch.float64, device=self.device)
        for start in range(0, rows.numel(), block):
            r, c = rows[start : start + block], cols[start : start + block]
            dots = (x64[r] * self.matrix[c].to(torch.float64)).sum(-1)
            out[start : start + block] = dots + self.bias64[c] if self.bias64 is not None else dots
        return out

    def _bound(self, x64: Tensor, xs: Tensor) -> Tensor:
        """Per-position bound E on |screen − exact| before the output rounding (class doc)."""
        dx = (x64 - xs[:, : self.d_model].to(torch.float64)).norm(dim=1)
        xn = x64.square().sum(1)
        if self.d_eff > self.d_model:
            xn = xn + 1.0
        big_x = xn.sqrt() + dx
        big_w = self._w_max + self._dw_max
        gam = _gamma(self.d_eff, _U[torch.float32]) + _gamma(self.d_eff + 2, _U[torch.float64])
        tiny = self.d_eff * 2.0**-125 * (1.0 + big_x) * (1.0 + big_w)
        return 2.0 * (dx * big_w + big_x * self._dw_max + gam * big_x * big_w + tiny)

    def _thresholds(self, s_t: Tensor, eps: Tensor) -> tuple[Tensor, Tensor]:
        """(hi, lo) per query: z > hi ⇒ s_j > s_t for sure; z ≤ lo ⇒ s_j ≤ s_t for sure."""
        u = _U[self.dtype]
        c = u / (1.0 - u)
        hi = s_t + eps[:, None]
        lo = s_t - eps[:, None]
        hi = torch.where(hi >= 0, hi / (1.0 - c), hi / (1.0 + c))
        lo = torch.where(lo >= 0, lo / (1.0 + c), lo / (1.0 - c))
        hi32, lo32 = hi.to(torch.float32), lo.to(torch.float32)
        return torch.nextafter(hi32, self._inf), torch.nextafter(lo32, -self._inf)

    # ----------------------------------------------------------------- screening

    def _screen_inputs(self, x: Tensor) -> Tensor:
        xs = x.to(self.dtype)
        if self._augment:
            xs = torch.cat([xs, xs.new_ones(xs.shape[0], 1)], dim=1)
        return xs

    def _screen_scores(self, xs: Tensor) -> Tensor:
        """Screen scores (n, vocab) written into a reused buffer."""
        n = xs.shape[0]
        if self._buffer is None or self._buffer.shape[0] < n:
            self._buffer = torch.empty(n, self.vocab, dtype=self.dtype, device=self.device)
        z = self._buffer[:n]
        with _strict_matmul(self.device):
            torch.mm(xs, self._screen_w.T, out=z)
        if self._screen_b is not None:
            z += self._screen_b
        return z

    def chunk_rows(self) -> int:
        """Positions per screening block, so that the (positions × vocab) block fits chunk_bytes."""
        return max(1, self.chunk_bytes // (self.vocab * _itemsize(self.dtype)))

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
        if x.dim() != 2 or x.shape[1] != self.d_model:
            raise ValueError(f"x has shape {tuple(x.shape)}, expected (n, {self.d_model})")
        if not isinstance(ids, Tensor) or ids.dim() != 2:
            shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"token ids must be (n, m), got {shape}")
        ids = ids.to(self.device)
        if not ids_checked or ids.shape[0] != x.shape[0]:
            check_ids("token ids", ids, (x.shape[0], ids.shape[1]), self.vocab)
        _check_limit(limit, self.vocab, "limit")
        if limit is not None and limit >= self.vocab:  # every rank is < vocab: no clamping
            limit = None
        x = x.to(self.device)
        if x.shape[0] == 0:
            empty = torch.zeros(0, ids.shape[1], device=self.device)
            return empty.long(), empty.double()
        ranks, scores, unsure = self._blocks(x, ids, limit, self.sync_free)
        if self._pending is not None:
            self._pending.append(_Pending(x, ids, limit, ranks, unsure, torch.isfinite(x).all()))
        elif unsure is not None:
            self._settle_rows(x, ids, limit, ranks, unsure)
        return ranks, scores

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
        step = self.chunk_rows()
        parts = [
            self._ranks_block(x[s : s + step], ids[s : s + step], limit, sync_free)
            for s in range(0, x.shape[0], step)
        ]
        ranks, scores = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        unsure = torch.cat([p[2] for p in parts]) if sync_free else None  # type: ignore[misc]
        return ranks, scores, unsure

    def _ranks_block(
        self, x: Tensor, ids: Tensor, limit: int | None, sync_free: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        x64 = x.to(torch.float64)
        s_t = self.exact_scores(x64, ids)
        self.stats.rows += ids.numel()
        xs = self._screen_inputs(x)
        hi, lo = self._thresholds(s_t, self._bound(x64, xs))
        z = self._screen_scores(xs)
        top_k_path = limit is not None and limit <= _TOPK_MAX
        if sync_free:
            ranks, unsure = sync_free_ranks(self, z, x64, ids, s_t, hi, lo, limit, top_k_path)
            return ranks, s_t, unsure
        if top_k_path:
            assert limit is not None
            ranks = self._limited_ranks(z, x64, ids, s_t, hi, lo, limit)
        else:
            every = torch.arange(x.shape[0], device=self.device)
            ranks = torch.stack(
                [
                    self._counted_ranks(z, x64, every, s_t[:, c], hi[:, c], lo[:, c], ids[:, c])
                    for c in range(ids.shape[1])
                ],
                dim=1,
            )
            if limit is not None:
                ranks = ranks.clamp_max(limit)
        return ranks, s_t, None

    def _limited_ranks(
        self,
        z: Tensor,
        x64: Tensor,
        ids: Tensor,
        s_t: Tensor,
        hi: Tensor,
        lo: Tensor,
        limit: int,
    ) -> Tensor:
        """min(rank, limit) from one top-`limit` of the screen scores (class doc)."""
        vals, idx = torch.topk(z, limit, dim=1, sorted=False)
        kth = vals.amin(1).to(torch.float32)
        ranks = torch.full_like(ids, limit)
        for c in range(ids.shape[1]):
            upper, lower = hi[:, c], lo[:, c]
            member = kth <= lower  # fewer than `limit` entries can beat s_t: all lie in the list
            amb = torch.nonzero((kth > lower) & (kth <= upper)).flatten()
            rows = torch.nonzero(member).flatten()
            if rows.numel():
                ranks[rows, c] = self._ranks_from_list(
                    vals[rows], idx[rows], x64, rows, s_t[rows, c], upper[rows], lower[rows], ids[rows, c]
                )
            if amb.numel():
                counted = self._counted_ranks(z, x64, amb, s_t[:, c], upper, lower, ids[:, c])
                ranks[amb, c] = counted.clamp_max(limit)
        return ranks

    def _ranks_from_list(
        self,
        vals: Tensor,
        idx: Tensor,
        x64: Tensor,
        rows: Tensor,
        s_t: Tensor,
        hi: Tensor,
        lo: Tensor,
        own: Tensor,
    ) -> Tensor:
        """Exact ranks of rows whose every possible competitor is in the top list (`own`: the
        rows' target ids)."""
        vals = vals.to(torch.float32)
        certain = (vals > hi[:, None]).sum(1)
        band = (vals > lo[:, None]) & (vals <= hi[:, None])
        r, k = torch.nonzero(band, as_tuple=True)
        self.stats.rescored_rows += rows.numel()
        return certain + self._count_greater(x64, rows, r, idx[r, k], s_t, own)

    def _counted_ranks(
        self, z: Tensor, x64: Tensor, rows: Tensor, s_t: Tensor, hi: Tensor, lo: Tensor, own: Tensor
    ) -> Tensor:
        """Exact ranks of `rows` by counting screen scores above the band and re-scoring it.

        `s_t`, `hi`, `lo` and the target ids `own` are indexed by block position (full
        length); returns (len(rows),).
        """
        out = torch.empty(rows.numel(), dtype=torch.int64, device=self.device)
        step = max(1, self.chunk_rows() // 4)
        for start in range(0, rows.numel(), step):
            sel = rows[start : start + step]
            zs = z if sel.numel() == z.shape[0] else z[sel]  # rows are sorted and distinct
            upper, lower, s, mine = hi[sel, None], lo[sel, None], s_t[sel], own[sel]
            certain = (zs > upper).sum(1)
            band = (zs > lower) & (zs <= upper)
            width = band.sum(1)
            self.stats.band_entries += int(width.sum())
            heavy = width > max(1, self.vocab // _HEAVY_FRACTION)
            light = torch.nonzero(~heavy).flatten()
            r, j = torch.nonzero(band[light], as_tuple=True)
            greater = self._count_greater(x64, sel[light], r, j, s[light], mine[light])
            res = certain.clone()
            res[light] += greater
            if heavy.any():
                hv = torch.nonzero(heavy).flatten()
                res[hv] = self._heavy_ranks(x64[sel[hv]], s[hv], mine[hv])
            out[start : start + step] = res
            self.stats.rescored_rows += sel.numel()
        return out

    def _count_greater(
        self, x64: Tensor, rows: Tensor, r: Tensor, cols: Tensor, s_t: Tensor, own: Tensor
    ) -> Tensor:
        """For each of `rows` (m,), how many pairs (r → rows[r], cols) score strictly above
        s_t[r]; the target `own[r]` itself never counts (its score, recomputed in another
        block, might differ from s_t in the last bit where a reduction's order follows the
        block's shape, as on a GPU)."""
        self.stats.rescored_entries += r.numel()
        if r.numel() == 0:
            return torch.zeros(rows.numel(), dtype=torch.int64, device=self.device)
        scores = self._pair_scores(x64, rows[r], cols)
        hit = (scores > s_t[r]) & (cols != own[r])
        return torch.bincount(r[hit], minlength=rows.numel())

    def _heavy_ranks(self, x64: Tensor, s_t: Tensor, own: Tensor) -> Tensor:
        """Exact ranks for rows with a very wide band: an fp64 matmul screens every entry
        (band of a few fp64 ulps), and that thin band is re-scored by the canonical dot."""
        self.stats.heavy_rows += x64.shape[0]
        every = torch.arange(x64.shape[0], device=self.device)
        xn = x64.square().sum(1) + (1.0 if self.d_eff > self.d_model else 0.0)
        tol = 4.0 * (2 * _gamma(self.d_eff + 2, _U[torch.float64]) * xn.sqrt() * self._w_max)
        tol = tol + self.d_eff * 2.0**-1000
        ranks = torch.zeros(x64.shape[0], dtype=torch.int64, device=self.device)
        step = max(1, self.chunk_bytes // (8 * max(self.d_model, x64.shape[0])))
        for start in range(0, self.vocab, step):
            w = self.matrix[start : start + step].to(torch.float64)
            sc = x64 @ w.T
            if self.bias64 is not None:
                sc += self.bias64[start : start + step]
            ranks += (sc > (s_t + tol)[:, None]).sum(1)
            r, j = torch.nonzero((sc - s_t[:, None]).abs() <= tol[:, None], as_tuple=True)
            ranks += self._count_greater(x64, every, r, j + start, s_t, own)
        return ranks

    # ----------------------------------------------------------------- top-k lists

    def top_k(self, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The `k` highest-scoring tokens of each input, exactly: (ids (n, k), fp64 scores).

        Order: exact score descending, ties broken by the lower token id, so the list agrees
        with `ranks` (the token at list position p has rank <= p, equality without ties).
        One screen per block: with E the bound of the class doc and z_k the k-th largest
        screen score, every one of the k top screen entries scores at least
        F = z_k − c|z_k| − E exactly; an entry whose screen score lies at or below the
        threshold that certifies "exact score <= F − margin" has k entries strictly above it
        and cannot be in any top-k list. Only the rest (usually a few more than k) is
        re-scored with the canonical fp64 dot and sorted. Rows where more than vocab/16
        entries remain (degenerate states, e.g. all scores tied) are scored in full.
        """
        if x.dim() != 2 or x.shape[1] != self.d_model:
            raise ValueError(f"x has shape {tuple(x.shape)}, expected (n, {self.d_model})")
        _check_limit(k, self.vocab, "k")
        x = x.to(self.device)
        if not bool(torch.isfinite(x).all()):
            raise ValueError("non-finite values in the decoder inputs")
        step = self.chunk_rows()
        parts = [self._top_block(x[s : s + step], k) for s in range(0, x.shape[0], step)]
        if not parts:
            return torch.zeros(0, k, dtype=torch.int64, device=self.device), torch.zeros(
                0, k, dtype=torch.float64, device=self.device
            )
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _top_block(self, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        x64 = x.to(torch.float64)
        xs = self._screen_inputs(x)
        eps = self._bound(x64, xs)
        z = self._screen_scores(xs)
        kth = torch.topk(z, k, dim=1).values.amin(1).to(torch.float64)
        c = _U[self.dtype] / (1.0 - _U[self.dtype])
        floor = kth - c * kth.abs() - eps  # no exact score of the k top screen entries is lower
        floor = floor - (kth.abs() + eps) * 2.0**-50 - 2.0**-1000  # rounding of this fp64 line
        _, lo = self._thresholds(floor[:, None], eps)
        candidates = z > lo
        counts = candidates.sum(1)
        self.stats.rows += x.shape[0]
        heavy = counts > max(k, self.vocab // _HEAVY_FRACTION)
        ids = torch.empty(x.shape[0], k, dtype=torch.int64, device=self.device)
        scores = torch.empty(x.shape[0], k, dtype=torch.float64, device=self.device)
        light = torch.nonzero(~heavy).flatten()
        if bool((counts[light] < k).any()):  # the k top screen entries are always candidates
            raise RuntimeError("top_k: fewer than k candidates in a row; the screen bound is broken")
        if light.numel():
            r, j = torch.nonzero(candidates[light], as_tuple=True)
            ids[light], scores[light] = self._best_of(x64, light, r, j, k)
        every = torch.arange(self.vocab, device=self.device)
        for row in torch.nonzero(heavy).flatten().tolist():
            self.stats.heavy_rows += 1
            one = torch.tensor([row], device=self.device)
            best_ids, best_scores = self._best_of(x64, one, torch.zeros_like(every), every, k)
            ids[row], scores[row] = best_ids[0], best_scores[0]
        return ids, scores

    def _best_of(self, x64: Tensor, rows: Tensor, r: Tensor, cols: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The k best (row r → rows[r], column) pairs of each row by canonical exact score,
        ties by the lower column; `r` ascending and, within a row, `cols` ascending."""
        self.stats.rescored_entries += r.numel()
        pair = self._pair_scores(x64, rows[r], cols)
        order = torch.sort(-pair, stable=True).indices  # score descending; ties keep column order
        order = order[torch.sort(r[order], stable=True).indices]  # back into rows, order kept
        starts = torch.cumsum(torch.bincount(r, minlength=rows.numel()), 0) - torch.bincount(
            r, minlength=rows.numel()
        )
        take = order[(starts[:, None] + torch.arange(k, device=self.device)).flatten()].reshape(-1, k)
        return cols[take], pair[take]


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def fast_ranks(
    x: Tensor,
    matrix: Tensor,
    bias: Tensor | None,
    token_ids: Tensor,
    *,
    limit: int | None = None,
    low_precision: LowPrecision = "auto",
    chunk_bytes: int | None = None,
    sync_free: SyncFree = "auto",
) -> Tensor:
    """The ranks of `exact_ranks`, computed by the screened scheme (module docstring).

    With `limit` = k returns min(rank, k) (exact below k: what top-k membership needs), which
    is much cheaper than full ranks. For repeated calls on one matrix build a `RankScreen`.
    """
    _check_rank_inputs(x, matrix, bias, token_ids)
    screen = RankScreen(
        matrix, bias, low_precision=low_precision, chunk_bytes=chunk_bytes, sync_free=sync_free
    )
    return screen.ranks(x, token_ids[:, None], limit)[0][:, 0]
