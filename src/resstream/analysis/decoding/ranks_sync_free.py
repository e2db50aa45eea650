"""The screened exact ranks of `ranks.RankScreen` in fixed shapes: no host synchronisation.

On a GPU every `nonzero`, `.item()`, `bool(tensor)` or shape that depends on values makes the
host wait until the device has finished everything queued before it. The selecting scheme
(`ranks_selecting`) does several of those per block and per target — which rows are ambiguous,
which entries lie in the band — and on a device where the arithmetic is cheap those round trips
are most of the time (issue 28: 143 ms where a naive bf16 lens took 46 ms on an H100). This module
answers the same queries with work whose shapes depend only on the input shapes:

* ranks up to k (k ≤ `ranks.TOPK_MAX`): one top-k of the screen scores, and the exact fp64
  scores of all k list entries (n·k gathered dot products, a few per cent of the screen's work
  at k = 5). A row whose k-th screen score is at or below the band holds every competitor in
  its list, so its rank is the number of list entries scoring strictly above the target; a row
  whose k-th screen score is above the band has rank ≥ k for sure. Both need no selection.
* the remaining rows — the k-th screen score inside the band ("ambiguous"), or every row for a
  full rank — are gathered, at most `rows_cap` of them (a fixed number, chosen by a stable sort
  of the flags, never by `nonzero`); per row the entries above the band are counted and the
  `band_cap` highest screen scores inside the band are re-scored exactly.
* what does not fit is marked *unsure*: an ambiguous row beyond the first `rows_cap`, or a band
  wider than `band_cap` whose count does not already decide min(rank, k). The caller settles
  unsure rows with the synchronous scheme — once per `RankScreen.deferred` block (one host
  synchronisation for every layer of a batch) or at the end of a single call. On real models
  unsure rows are rare; when they occur the answer is still exact, only slower.

Every count here compares canonical fp64 scores (`Screen.entry_scores`) with the target's
canonical score, and uses the screen only through the rigorous thresholds of `Screen`, so
the ranks equal the selecting scheme's wherever the fp64 dot product of one (position, entry)
pair gives the same bits in every block it is computed in. That holds on the CPU (the tests
check both schemes against fp64 brute force, ties included); a GPU reduction may sum a dot
product in an order that follows the block's shape, which can move a score by one fp64 ulp —
enough to reorder only two entries whose exact scores agree to ~16 digits, and never the
target against itself (it is never counted).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from resstream.analysis.decoding.ranks_screen import Screen, ScreenedBlock

__all__ = ["BAND_CAP", "ROWS_FRACTION", "sync_free_ranks"]

BAND_CAP = 64  # band entries re-scored per gathered row
ROWS_FRACTION = 4  # ambiguous rows gathered per block of the top-k path: up to n / 4 (random GPT-2
# weights, bf16 screen: 185 of 13,208 queries left unsure at n / 8, none at n / 2)


def sync_free_ranks(
    screen: Screen, block: ScreenedBlock, limit: int | None, top_k_path: bool
) -> tuple[Tensor, Tensor]:
    """(ranks, unsure), both (n, m), of one screened block. With `limit` = k the ranks are
    min(rank, k); `top_k_path`: decide by one top-`limit` of the screen scores. Unsure entries
    hold no answer yet. A target never counts against itself (as in `ranks_selecting`)."""
    if top_k_path:
        assert limit is not None
        return _limited(screen, block, limit)
    everything = torch.ones_like(block.s_t, dtype=torch.bool)
    ranks, unsure = _gathered_counts(screen, block, everything, block.z.shape[0], limit)
    return (ranks if limit is None else ranks.clamp_max(limit)), unsure


def _limited(screen: Screen, block: ScreenedBlock, limit: int) -> tuple[Tensor, Tensor]:
    """min(rank, limit) from one top-`limit` of the screen scores (module docstring)."""
    ids, s_t, hi, lo = block.ids, block.s_t, block.hi, block.lo
    vals, idx = torch.topk(block.z, limit, dim=1, sorted=False)
    kth = vals.amin(1).to(torch.float32)[:, None]
    listed = screen.entry_scores(block.x64, idx)  # (n, limit) exact scores of the list entries
    above = (listed[:, None, :] > s_t[:, :, None]) & (idx[:, None, :] != ids[:, :, None])
    in_list = above.sum(2)  # (n, m)
    member = kth <= lo  # every competitor is in the list
    ambiguous = (kth > lo) & (kth <= hi)
    rows_cap = max(1, math.ceil(block.z.shape[0] / ROWS_FRACTION))
    counted, unsure = _gathered_counts(screen, block, ambiguous, rows_cap, limit)
    outside = torch.full_like(in_list, limit)  # k-th screen score above the band: rank >= k
    ranks = torch.where(member, in_list, torch.where(ambiguous, counted.clamp_max(limit), outside))
    return ranks, unsure


def _gathered_counts(
    screen: Screen, block: ScreenedBlock, wanted: Tensor, rows_cap: int, cap: int | None
) -> tuple[Tensor, Tensor]:
    """Ranks of the `wanted` (n, m) queries by counting: entries above the band, plus the band
    entries that score strictly above the target exactly. Up to `rows_cap` rows are worked on;
    a count is unsure when its row was not among them, or when its band held more than
    `BAND_CAP` entries and the count so far stays below `cap` (None: any overflow)."""
    z, x64, ids, s_t, hi, lo = block.z, block.x64, block.ids, block.s_t, block.hi, block.lo
    n, m = s_t.shape
    rows = min(n, rows_cap)
    if rows == n:
        sel = torch.arange(n, device=z.device)
        zs, xs64 = z, x64
    else:  # the wanted rows first, in order; a fixed number of rows whatever the flags say
        sel = torch.sort(wanted.any(1).to(torch.uint8), descending=True, stable=True).indices[:rows]
        zs, xs64 = z.index_select(0, sel), x64.index_select(0, sel)
    taken = torch.zeros(n, dtype=torch.bool, device=z.device).index_fill_(0, sel, True)
    counts = torch.zeros(n, m, dtype=torch.int64, device=z.device)
    unsure = wanted & ~taken[:, None]
    for c in range(m):
        count, overflow = _row_counts(screen, zs, xs64, ids[sel, c], s_t[sel, c], hi[sel, c], lo[sel, c])
        if cap is not None:
            overflow &= count < cap
        counts[sel, c] = count
        unsure[sel, c] |= overflow & wanted[sel, c]
    return counts, unsure


def _row_counts(
    screen: Screen, z: Tensor, x64: Tensor, own: Tensor, s_t: Tensor, hi: Tensor, lo: Tensor
) -> tuple[Tensor, Tensor]:
    """Per row of `z` (r, V): the entries certainly above s_t plus the band entries among the
    `BAND_CAP` highest that score above it exactly, and whether the band held more."""
    upper, lower = hi[:, None], lo[:, None]
    certain = (z > upper).sum(1)
    band = (z > lower) & (z <= upper)
    width = band.sum(1)
    buffer = min(BAND_CAP, z.shape[1])
    _, cols = torch.topk(z.masked_fill(~band, -math.inf), buffer, dim=1, sorted=False)
    real = band.gather(1, cols) & (cols != own[:, None])  # a narrower band fills up with non-entries
    greater = ((screen.entry_scores(x64, cols) > s_t[:, None]) & real).sum(1)
    return certain + greater, width > buffer
