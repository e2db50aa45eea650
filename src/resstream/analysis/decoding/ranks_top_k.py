"""Exact top-k lists from the screen (`ranks.RankScreen.top_k`): which k tokens score highest.

Order: exact score descending, ties broken by the lower token id, so a list agrees with the
ranks (the token at list position p has rank <= p, equality without ties). One screen per
block: with E the screen's error bound (`ranks_screen.Screen`) and z_k the k-th largest screen
score, every one of the k top screen entries scores at least F = z_k − c|z_k| − E exactly; an
entry whose screen score lies at or below the threshold that certifies "exact score <= F −
margin" has k entries strictly above it and cannot be in any top-k list. Only the rest (usually
a few more than k) is re-scored with the canonical fp64 dot and sorted. Rows where more than
vocab / `HEAVY_FRACTION` entries remain (degenerate states, e.g. all scores tied) are scored in
full.
"""

from __future__ import annotations

import torch
from torch import Tensor

from resstream.analysis.decoding.ranks_exact import check_limit
from resstream.analysis.decoding.ranks_screen import HEAVY_FRACTION, Screen

__all__ = ["top_k_lists", "top_of_screened"]


def top_k_lists(screen: Screen, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The `k` highest-scoring tokens of each input `x` (n, d), exactly: (ids (n, k), fp64
    scores (n, k)), in the order of the module docstring."""
    x = screen.check_inputs(x)
    check_limit(k, screen.vocab, "k")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("non-finite values in the decoder inputs")
    parts = [_top_block(screen, x[rows], k) for rows in screen.blocks(x.shape[0])]
    if not parts:
        empty = torch.zeros(0, k, device=screen.device)
        return empty.long(), empty.double()
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _top_block(screen: Screen, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    x64 = x.to(torch.float64)
    xs = screen._screen_inputs(x)
    eps = screen._bound(x64, xs)
    return top_of_screened(screen, screen._screen_scores(xs), x64, eps, k)


def top_of_screened(screen: Screen, z: Tensor, x64: Tensor, eps: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The exact top-k lists (ids, fp64 scores) of one block whose screen scores `z` (n, V),
    fp64 inputs `x64` and bounds `eps` (n,) are computed already (module docstring). A row
    whose only candidates are its k top screen entries (the usual case) is answered from them
    without forming the candidate set."""
    vals, top = torch.topk(z, k, dim=1)
    kth = vals[:, -1].to(torch.float64)
    floor = kth - screen.output_rounding() * kth.abs() - eps  # no exact score of the k top entries is lower
    floor = floor - (kth.abs() + eps) * 2.0**-50 - 2.0**-1000  # rounding of this fp64 line
    _, lo = screen._thresholds(floor[:, None], eps)
    counts = (z > lo).sum(1, dtype=torch.int32)
    screen.stats.rows += z.shape[0]
    if bool((counts < k).any()):  # the k top screen entries are always candidates
        raise RuntimeError("top_k: fewer than k candidates in a row; the screen bound is broken")
    heavy = counts > max(k, screen.vocab // HEAVY_FRACTION)
    ids = torch.empty(z.shape[0], k, dtype=torch.int64, device=screen.device)
    scores = torch.empty(z.shape[0], k, dtype=torch.float64, device=screen.device)
    exactly_k = torch.nonzero(counts == k).flatten()
    if exactly_k.numel():
        cols = top[exactly_k].sort(1).values  # ascending ids: ties keep the lower id first
        r = torch.arange(exactly_k.numel(), device=screen.device).repeat_interleave(k)
        ids[exactly_k], scores[exactly_k] = _best_of(screen, x64, exactly_k, r, cols.flatten(), k)
    light = torch.nonzero(~heavy & (counts > k)).flatten()
    if light.numel():
        r, j = torch.nonzero(z[light] > lo[light], as_tuple=True)
        ids[light], scores[light] = _best_of(screen, x64, light, r, j, k)
    every = torch.arange(screen.vocab, device=screen.device)
    for row in torch.nonzero(heavy).flatten().tolist():
        screen.stats.heavy_rows += 1
        one = torch.tensor([row], device=screen.device)
        best_ids, best_scores = _best_of(screen, x64, one, torch.zeros_like(every), every, k)
        ids[row], scores[row] = best_ids[0], best_scores[0]
    return ids, scores


def _best_of(
    screen: Screen, x64: Tensor, rows: Tensor, r: Tensor, cols: Tensor, k: int
) -> tuple[Tensor, Tensor]:
    """The k best (row r → rows[r], column) pairs of each row by canonical exact score,
    ties by the lower column; `r` ascending and, within a row, `cols` ascending."""
    screen.stats.rescored_entries += r.numel()
    pair = screen._pair_scores(x64, rows[r], cols, rows_ascending=True)  # rows and r ascend
    order = torch.sort(-pair, stable=True).indices  # score descending; ties keep column order
    order = order[torch.sort(r[order], stable=True).indices]  # back into rows, order kept
    per_row = torch.bincount(r, minlength=rows.numel())
    starts = torch.cumsum(per_row, 0) - per_row
    take = order[(starts[:, None] + torch.arange(k, device=screen.device)).flatten()].reshape(-1, k)
    return cols[take], pair[take]
