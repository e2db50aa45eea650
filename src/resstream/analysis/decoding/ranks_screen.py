"""The screen under every fast exact rank: a decoder matrix in a screening precision, with a
rigorous bound on how far a screen score can lie from the exact score.

Per block of positions the screen gives all V scores in a screening precision (bf16 matmul, or
fp32), the exact fp64 score s_t of each target (a gathered dot product, `ranks_exact`'s
definition) and per query two thresholds: a screen score above `hi` certainly beats s_t, one
at or below `lo` certainly does not (`Screen` derives them). The rank schemes
(`ranks_selecting`, `ranks_sync_free`) and the top-k lists (`ranks_top_k`) compare against these
thresholds only; the entries between them are re-scored exactly (`Screen._pair_scores`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from resstream.analysis.decoding.ranks_exact import (
    DEFAULT_CHUNK_BYTES,
    check_bias,
    check_inputs,
    check_matrix,
)

__all__ = [
    "HEAVY_FRACTION",
    "UNIT_ROUNDOFF",
    "LowPrecision",
    "Screen",
    "ScreenStats",
    "ScreenedBlock",
    "gamma",
    "resolve_chunk_bytes",
    "resolve_low_precision",
]

LowPrecision = torch.dtype | None | Literal["auto"]

HEAVY_FRACTION = 16  # a band above vocab/16 entries is re-scored by an fp64 matmul instead
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24, torch.float64: 2.0**-53}
_DEVICE_CHUNK_FRACTION = 16  # on a GPU: up to this fraction of the free memory per block
_DEVICE_CHUNK_MAX = 2**30
_PAIR_BLOCK_BYTES = 32 * 2**20  # memory for one block of gathered fp64 rows
_PER_ROW_PAIRS = 16  # pairs per position from which they are scored one position at a time


def gamma(n: int, u: float) -> float:
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


@dataclass(frozen=True)
class ScreenedBlock:
    """One block of n positions screened against the whole vocabulary for m targets each
    (`Screen.screened`): `z` (n, V) screen scores, `x64` (n, d) the fp64 inputs, `ids` (n, m)
    the targets, `s_t` (n, m) their exact scores, `hi` / `lo` (n, m) their thresholds, `eps`
    (n,) the bound E of each position (`Screen._bound`)."""

    z: Tensor
    x64: Tensor
    ids: Tensor
    s_t: Tensor
    hi: Tensor
    lo: Tensor
    eps: Tensor

    def rows(self, part: slice) -> ScreenedBlock:
        """The same block restricted to the positions `part` (views, no copies)."""
        return ScreenedBlock(*(getattr(self, name)[part] for name in self.__dataclass_fields__))


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


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


class Screen:
    """A decoder matrix prepared for screening, with the error bound of its screen scores.

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
    value lies within c·|z_j| of z_j, c = u/(1 − u) (`output_rounding`). Hence s_j > s_t for
    sure when z_j − c|z_j| > s_t + E and s_j ≤ s_t for sure when z_j + c|z_j| ≤ s_t − E; both
    tests are monotone in z_j and become comparisons against per-position thresholds, rounded
    outwards to fp32. Only entries between the thresholds are re-scored exactly.
    """

    def __init__(
        self, matrix: Tensor, bias: Tensor | None, low_precision: LowPrecision, chunk_bytes: int | None
    ) -> None:
        """The screen of `matrix` (+ `bias`); built by `ranks.RankScreen`, which documents the
        settings."""
        check_matrix("decoder matrix", matrix)
        self.vocab, self.d_model = matrix.shape
        check_bias(bias, self.vocab)
        self.matrix = matrix
        self.device = matrix.device
        self.bias64 = bias.to(self.device, torch.float64) if bias is not None else None
        self.dtype = resolve_low_precision(low_precision, self.device)
        self.chunk_bytes = resolve_chunk_bytes(chunk_bytes, self.device)
        self.d_eff = self.d_model + (1 if bias is not None else 0)
        self.stats = ScreenStats()
        self._augment = bias is not None and self.dtype != torch.float32
        self._screen_w, self._screen_b = self._screen_matrix(bias)
        self.w_max, self._dw_max = self._row_norm_maxima(bias)
        self._buffer: Tensor | None = None
        self._scratch: Tensor | None = None
        self._inf = torch.tensor(math.inf, device=self.device)  # made once: no copy per call

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
        """fp64 scores of the targets `ids` (n, m) for inputs `x64` (n, d): the canonical exact
        score every comparison is made against."""
        return self.entry_scores(x64, ids)

    def entry_scores(self, x64: Tensor, cols: Tensor) -> Tensor:
        """Exact scores (r, c) of vocabulary entries `cols` (r, c) for inputs `x64` (r, d)."""
        r, c = cols.shape
        rows = torch.arange(r, device=self.device).repeat_interleave(c)
        return self._pair_scores(x64, rows, cols.reshape(-1)).reshape(r, c)

    def _pair_scores(
        self, x64: Tensor, rows: Tensor, cols: Tensor, *, rows_ascending: bool = False
    ) -> Tensor:
        """Exact scores of (position, vocabulary entry) pairs by gathered fp64 dot products.
        With many pairs per position (a band) and `rows_ascending` (the caller's promise):
        one position at a time, its input broadcast instead of gathered per pair (the same
        products and sums, bit for bit; a host synchronisation, which callers of the
        sync-free scheme avoid by not promising)."""
        if rows_ascending and rows.numel() >= _PER_ROW_PAIRS * x64.shape[0]:
            return self._pair_scores_by_row(x64, rows, cols)
        block = max(1, _PAIR_BLOCK_BYTES // (16 * self.d_model))
        out = torch.empty(rows.numel(), dtype=torch.float64, device=self.device)
        for start in range(0, rows.numel(), block):
            r, c = rows[start : start + block], cols[start : start + block]
            dots = (x64[r] * self.matrix[c].to(torch.float64)).sum(-1)
            out[start : start + block] = dots + self.bias64[c] if self.bias64 is not None else dots
        return out

    def _pair_scores_by_row(self, x64: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
        counts = torch.bincount(rows, minlength=x64.shape[0]).tolist()
        block = max(1, _PAIR_BLOCK_BYTES // (16 * self.d_model))
        out = []
        for row, of_row in enumerate(torch.split(cols, counts)):
            for picked in torch.split(of_row, block) if of_row.numel() else ():
                dots = (self.matrix[picked].to(torch.float64) * x64[row]).sum(-1)
                out.append(dots + self.bias64[picked] if self.bias64 is not None else dots)
        return torch.cat(out)

    def input_norms(self, x64: Tensor) -> Tensor:
        """‖x'‖ per position: the input's norm with the bias column's 1 (class doc)."""
        squares = x64.square().sum(1)
        return (squares + 1.0 if self.d_eff > self.d_model else squares).sqrt()

    def _bound(self, x64: Tensor, xs: Tensor) -> Tensor:
        """Per-position bound E on |screen − exact| before the output rounding (class doc)."""
        dx = (x64 - xs[:, : self.d_model].to(torch.float64)).norm(dim=1)
        big_x = self.input_norms(x64) + dx
        big_w = self.w_max + self._dw_max
        u32, u64 = UNIT_ROUNDOFF[torch.float32], UNIT_ROUNDOFF[torch.float64]
        gam = gamma(self.d_eff, u32) + gamma(self.d_eff + 2, u64)
        tiny = self.d_eff * 2.0**-125 * (1.0 + big_x) * (1.0 + big_w)
        return 2.0 * (dx * big_w + big_x * self._dw_max + gam * big_x * big_w + tiny)

    def output_rounding(self) -> float:
        """c = u/(1 − u): a stored screen score z lies within c·|z| of its accumulated value."""
        u = UNIT_ROUNDOFF[self.dtype]
        return u / (1.0 - u)

    def _thresholds(self, s_t: Tensor, eps: Tensor) -> tuple[Tensor, Tensor]:
        """(hi, lo) per query: z > hi ⇒ s_j > s_t for sure; z ≤ lo ⇒ s_j ≤ s_t for sure."""
        c = self.output_rounding()
        hi = s_t + eps[:, None]
        lo = s_t - eps[:, None]
        hi = torch.where(hi >= 0, hi / (1.0 - c), hi / (1.0 + c))
        lo = torch.where(lo >= 0, lo / (1.0 + c), lo / (1.0 - c))
        hi32, lo32 = hi.to(torch.float32), lo.to(torch.float32)
        return torch.nextafter(hi32, self._inf), torch.nextafter(lo32, -self._inf)

    # ----------------------------------------------------------------- screening

    def check_inputs(self, x: Tensor) -> Tensor:
        """`x` on the screen's device, once it is (n, d_model)."""
        check_inputs(x, self.d_model)
        return x.to(self.device)

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

    def scratch(self, n: int) -> Tensor:
        """A reused fp32 (n, vocab) work block, apart from the screen scores' buffer."""
        if self._scratch is None or self._scratch.shape[0] < n:
            self._scratch = torch.empty(n, self.vocab, dtype=torch.float32, device=self.device)
        return self._scratch[:n]

    def chunk_rows(self) -> int:
        """Positions per screening block, so that the (positions × vocab) block fits chunk_bytes."""
        return max(1, self.chunk_bytes // (self.vocab * _itemsize(self.dtype)))

    def blocks(self, n: int) -> list[slice]:
        """The blocks of `chunk_rows` positions that cover n positions, in order."""
        step = self.chunk_rows()
        return [slice(start, start + step) for start in range(0, n, step)]

    def screened(self, x: Tensor, ids: Tensor) -> ScreenedBlock:
        """One block's screen scores, exact target scores and thresholds (`ScreenedBlock`).
        The screen scores live in a buffer that the block's next screening overwrites."""
        x64 = x.to(torch.float64)
        s_t = self.exact_scores(x64, ids)
        self.stats.rows += ids.numel()
        xs = self._screen_inputs(x)
        eps = self._bound(x64, xs)
        hi, lo = self._thresholds(s_t, eps)
        return ScreenedBlock(self._screen_scores(xs), x64, ids, s_t, hi, lo, eps)
