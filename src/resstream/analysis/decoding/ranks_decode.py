"""One screen per block for everything a lens asks of a state (`ranks.RankScreen.decode`).

A decoding trajectory needs, per state, the exact top-k list, the exact ranks of a few
targets (the input and the next token) and the probabilities of those tokens. Each of them
alone screens the whole vocabulary once (`ranks_top_k`, `ranks_selecting`) and the softmax
scores it once more; here one fp32 screen of a block of states serves all three while the
block is in memory:

* the top-k lists: `ranks_top_k.top_of_screened` on the block's screen scores;
* the ranks: `ranks_selecting.selecting_ranks` on the same block (two counts per row decide
  almost every rank; the rest re-score their band exactly);
* the log-normaliser log Σ_j exp(c(z_j)) of the scores z as the fast decoder computes them
  (`Decoder.logits`: fp32, soft-capping c applied where the model has it). An fp32 screen's
  scores are those logits, so no second matmul is needed. Terms below e^-80 of the largest
  are raised to it before the exponential: they change the sum by less than vocab · e^-80
  (relative), far below fp32 rounding, and never make a subnormal (which CPUs compute at a
  fraction of the speed).

The ranks and top-k lists are the exact answers of `ranks_exact` (the screen only decides
which entries need re-scoring); the probabilities are fp32-accurate values, as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from resstream.analysis.decoding.ranks_exact import check_ids, check_limit
from resstream.analysis.decoding.ranks_screen import Screen, ScreenedBlock
from resstream.analysis.decoding.ranks_selecting import selecting_ranks
from resstream.analysis.decoding.ranks_top_k import top_of_screened

__all__ = ["Decoded", "decode_states"]

#: Positions whose screen scores one group of passes reads (`_row_groups`).
POST_ROWS = 8
#: Scores more than this far below a row's largest are raised to it before exp (docstring).
_EXP_FLOOR = -80.0


@dataclass(frozen=True)
class Decoded:
    """What `decode_states` finds for n states: `top_ids` (n, k) and their exact fp64
    `top_scores`, the exact `ranks` (n, m) of the targets and their exact fp64 `scores`, and
    `log_normaliser` (n,) (fp64 of fp32 work) with `logits_of(ids)` (the fp32 scores of any
    tokens, soft-capped) so that log p(j) = logit_j − log_normaliser."""

    top_ids: Tensor
    top_scores: Tensor
    ranks: Tensor
    scores: Tensor
    log_normaliser: Tensor
    picked_logits: Tensor  # (n, k + m): the soft-capped fp32 scores of top_ids, then of the targets

    def probabilities(self) -> Tensor:
        """(n, k + m) float32: the softmax probability of each top-k token, then of each target."""
        return torch.exp(self.picked_logits.double() - self.log_normaliser[:, None]).float()


def decode_states(
    screen: Screen, x: Tensor, ids: Tensor, k: int, softcap: float | None, probabilities: bool = True
) -> Decoded:
    """The `Decoded` of decoder inputs `x` (n, d) with targets `ids` (n, m; m may be 0), from
    one fp32 screen per block of `screen.chunk_rows()` states (module docstring). Without
    `probabilities` the normaliser is not computed (NaN)."""
    if screen.dtype != torch.float32:
        raise ValueError("decode_states needs an fp32 screen (low_precision=None): its scores are the logits")
    x = screen.check_inputs(x)
    if ids.dim() != 2:
        raise ValueError(f"token ids must be (n, m), got {tuple(ids.shape)}")
    ids = ids.to(screen.device)
    check_ids("token ids", ids, (x.shape[0], ids.shape[1]), screen.vocab)
    check_limit(k, screen.vocab, "k")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("non-finite values in the decoder inputs")
    parts = [
        _decode_block(screen, x[rows], ids[rows], k, softcap, probabilities)
        for rows in screen.blocks(x.shape[0])
    ]
    if not parts:
        raise ValueError("decode_states needs at least one state")
    return Decoded(*(torch.cat([getattr(p, name) for p in parts]) for name in Decoded.__dataclass_fields__))


def _decode_block(
    screen: Screen, x: Tensor, ids: Tensor, k: int, softcap: float | None, probabilities: bool
) -> Decoded:
    block = screen.screened(x, ids)
    groups = _row_groups(x.shape[0])
    parts = [_decode_rows(screen, block.rows(rows), k, softcap, probabilities) for rows in groups]
    return Decoded(*(torch.cat([getattr(p, name) for p in parts]) for name in Decoded.__dataclass_fields__))


def _row_groups(n: int) -> list[slice]:
    """Groups of `POST_ROWS` positions: the screen scores of one group stay in the core's
    cache through the passes that read them (measured: ~1.5× faster than whole blocks)."""
    return [slice(start, start + POST_ROWS) for start in range(0, n, POST_ROWS)]


def _decode_rows(
    screen: Screen, block: ScreenedBlock, k: int, softcap: float | None, probabilities: bool
) -> Decoded:
    top_ids, top_scores = top_of_screened(screen, block.z, block.x64, block.eps, k)
    if block.ids.shape[1]:
        ranks = selecting_ranks(screen, block, None, False)
    else:
        ranks = block.ids.new_zeros(block.ids.shape)
    if not probabilities:
        nan = torch.full((block.z.shape[0],), math.nan, dtype=torch.float64, device=screen.device)
        return Decoded(top_ids, top_scores, ranks, block.s_t, nan, torch.cat([top_ids, block.ids], 1).float())
    logits = screen.scratch(block.z.shape[0])
    if softcap:
        torch.div(block.z, softcap, out=logits).tanh_().mul_(softcap)
    else:
        logits.copy_(block.z)
    picked = logits.gather(1, torch.cat([top_ids, block.ids], 1))
    top = logits.amax(1, keepdim=True)
    logits.sub_(top).clamp_(min=_EXP_FLOOR).exp_()
    normaliser = top[:, 0].double() + logits.sum(1).double().log()
    return Decoded(top_ids, top_scores, ranks, block.s_t, normaliser, picked)
