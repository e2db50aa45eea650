"""The selecting scheme of `ranks.RankScreen`: exact ranks of one screened block by selecting
the queries and entries the screen leaves open.

Entries whose screen score is certainly above the target's exact score s_t, or certainly not
above it (`ranks_screen.Screen`'s thresholds), are counted without further work; only the
ambiguous band in between is re-scored exactly. With a `limit` k, one top-k of the screen
scores decides almost every position: the k-th largest screen score above the band means
rank ≥ k, below it means every candidate is in the top-k list. A band wider than
vocab / `HEAVY_FRACTION` (degenerate states) is re-scored by an fp64 matmul instead.

Every selection here (`nonzero`, a shape that depends on values) is a host synchronisation on
a GPU; `ranks_sync_free` answers the same queries in fixed shapes and falls back to this
scheme for the rows it leaves unsure. The CPU uses this scheme by default.
"""

from __future__ import annotations

import torch
from torch import Tensor

from resstream.analysis.decoding.ranks_screen import (
    HEAVY_FRACTION,
    UNIT_ROUNDOFF,
    Screen,
    ScreenedBlock,
    gamma,
)

__all__ = ["selecting_ranks"]


def selecting_ranks(screen: Screen, block: ScreenedBlock, limit: int | None, top_k_path: bool) -> Tensor:
    """Ranks (n, m) of one screened block; with `limit` = k they are min(rank, k).
    `top_k_path`: decide by one top-`limit` of the screen scores (module docstring)."""
    if top_k_path:
        assert limit is not None
        return _limited_ranks(screen, block, limit)
    ranks = _full_ranks(screen, block)
    return ranks if limit is None else ranks.clamp_max(limit)


def _full_ranks(screen: Screen, block: ScreenedBlock) -> Tensor:
    """Exact ranks (n, m) of every target of every row in few passes over the screen scores:
    per target the entries above `hi` are counted; the bands (`lo`, `hi`] of all targets are
    found by one selection and re-scored exactly (a target never counts against itself); a
    row whose band is wider than vocab / `HEAVY_FRACTION` is ranked by `_heavy_ranks`."""
    n, m = block.ids.shape
    ranks = torch.empty(n, m, dtype=torch.int64, device=screen.device)
    bands = torch.zeros(block.z.shape, dtype=torch.bool, device=screen.device)
    for c in range(m):
        above = block.z > block.hi[:, c, None]
        ranks[:, c] = above.sum(1, dtype=torch.int32)
        bands |= torch.gt(block.z, block.lo[:, c, None]).logical_xor_(above)  # hi > lo
    r, j = torch.nonzero(bands, as_tuple=True)
    z = block.z[r, j]
    every = torch.arange(n, device=screen.device)
    for c in range(m):
        inside = (z > block.lo[r, c]) & (z <= block.hi[r, c])
        rc, jc = r[inside], j[inside]
        width = torch.bincount(rc, minlength=n)
        screen.stats.band_entries += rc.numel()
        heavy = width > max(1, screen.vocab // HEAVY_FRACTION)
        if bool(heavy.any()):
            keep = ~heavy[rc]
            rc, jc = rc[keep], jc[keep]
            rows = torch.nonzero(heavy).flatten()
            ranks[rows, c] = _heavy_ranks(screen, block.x64[rows], block.s_t[rows, c], block.ids[rows, c])
        ranks[:, c] += _count_greater(screen, block.x64, every, rc, jc, block.s_t[:, c], block.ids[:, c])
        screen.stats.rescored_rows += int((width > 1).sum())
    return ranks


def _limited_ranks(screen: Screen, block: ScreenedBlock, limit: int) -> Tensor:
    """min(rank, limit) from one top-`limit` of the screen scores (module docstring)."""
    vals, idx = torch.topk(block.z, limit, dim=1, sorted=False)
    kth = vals.amin(1).to(torch.float32)
    ranks = torch.full_like(block.ids, limit)
    for c in range(block.ids.shape[1]):
        upper, lower = block.hi[:, c], block.lo[:, c]
        member = kth <= lower  # fewer than `limit` entries can beat s_t: all lie in the list
        amb = torch.nonzero((kth > lower) & (kth <= upper)).flatten()
        rows = torch.nonzero(member).flatten()
        if rows.numel():
            ranks[rows, c] = _ranks_from_list(screen, block, vals[rows], idx[rows], rows, c)
        if amb.numel():
            ranks[amb, c] = _counted_ranks(screen, block, amb, c).clamp_max(limit)
    return ranks


def _ranks_from_list(
    screen: Screen, block: ScreenedBlock, vals: Tensor, idx: Tensor, rows: Tensor, c: int
) -> Tensor:
    """Exact ranks of target `c` of `rows`, whose every possible competitor is in the top
    list (`vals`, `idx`: the rows' top screen scores and their entries)."""
    hi, lo = block.hi[rows, c, None], block.lo[rows, c, None]
    vals = vals.to(torch.float32)
    certain = (vals > hi).sum(1)
    r, k = torch.nonzero((vals > lo) & (vals <= hi), as_tuple=True)
    screen.stats.rescored_rows += rows.numel()
    return certain + _count_greater(
        screen, block.x64, rows, r, idx[r, k], block.s_t[rows, c], block.ids[rows, c]
    )


def _counted_ranks(screen: Screen, block: ScreenedBlock, rows: Tensor, c: int) -> Tensor:
    """Exact ranks of target `c` of `rows` (sorted, distinct) by counting screen scores above
    the band and re-scoring it; returns (len(rows),)."""
    s_t, hi, lo, own = block.s_t[:, c], block.hi[:, c], block.lo[:, c], block.ids[:, c]
    out = torch.empty(rows.numel(), dtype=torch.int64, device=screen.device)
    step = max(1, screen.chunk_rows() // 4)
    for start in range(0, rows.numel(), step):
        sel = rows[start : start + step]
        zs = block.z if sel.numel() == block.z.shape[0] else block.z[sel]
        upper, lower, s, mine = hi[sel, None], lo[sel, None], s_t[sel], own[sel]
        certain = (zs > upper).sum(1)
        band = (zs > lower) & (zs <= upper)
        width = band.sum(1)
        screen.stats.band_entries += int(width.sum())
        heavy = width > max(1, screen.vocab // HEAVY_FRACTION)
        light = torch.nonzero(~heavy).flatten()
        r, j = torch.nonzero(band[light], as_tuple=True)
        greater = _count_greater(screen, block.x64, sel[light], r, j, s[light], mine[light])
        res = certain.clone()
        res[light] += greater
        if heavy.any():
            hv = torch.nonzero(heavy).flatten()
            res[hv] = _heavy_ranks(screen, block.x64[sel[hv]], s[hv], mine[hv])
        out[start : start + step] = res
        screen.stats.rescored_rows += sel.numel()
    return out


def _count_greater(
    screen: Screen, x64: Tensor, rows: Tensor, r: Tensor, cols: Tensor, s_t: Tensor, own: Tensor
) -> Tensor:
    """For each of `rows` (m,), how many pairs (r → rows[r], cols) score strictly above
    s_t[r]; the target `own[r]` itself never counts (its score, recomputed in another
    block, might differ from s_t in the last bit where a reduction's order follows the
    block's shape, as on a GPU)."""
    screen.stats.rescored_entries += r.numel()
    if r.numel() == 0:
        return torch.zeros(rows.numel(), dtype=torch.int64, device=screen.device)
    scores = screen._pair_scores(x64, rows[r], cols, rows_ascending=True)  # rows and r ascend
    hit = (scores > s_t[r]) & (cols != own[r])
    return torch.bincount(r[hit], minlength=rows.numel())


def _heavy_ranks(screen: Screen, x64: Tensor, s_t: Tensor, own: Tensor) -> Tensor:
    """Exact ranks for rows with a very wide band: an fp64 matmul screens every entry
    (band of a few fp64 ulps), and that thin band is re-scored by the canonical dot."""
    screen.stats.heavy_rows += x64.shape[0]
    every = torch.arange(x64.shape[0], device=screen.device)
    exact_error = 2 * gamma(screen.d_eff + 2, UNIT_ROUNDOFF[torch.float64])
    tol = 4.0 * (exact_error * screen.input_norms(x64) * screen.w_max) + screen.d_eff * 2.0**-1000
    ranks = torch.zeros(x64.shape[0], dtype=torch.int64, device=screen.device)
    step = max(1, screen.chunk_bytes // (8 * max(screen.d_model, x64.shape[0])))
    for start in range(0, screen.vocab, step):
        w = screen.matrix[start : start + step].to(torch.float64)
        sc = x64 @ w.T
        if screen.bias64 is not None:
            sc += screen.bias64[start : start + step]
        ranks += (sc > (s_t + tol)[:, None]).sum(1)
        r, j = torch.nonzero((sc - s_t[:, None]).abs() <= tol[:, None], as_tuple=True)
        ranks += _count_greater(screen, x64, every, r, j + start, s_t, own)
    return ranks
