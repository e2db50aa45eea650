"""What an intervention changed about one prediction: the metrics of a final state.

For the final state h_L at the prediction's position, through the model's own read-out (final
norm, unembedding, bias, then soft-capping where the model has it):

* `logprob`: log p(target) of the next-token distribution;
* `logit`: the target's logit before soft-capping (the quantity direct logit attribution
  splits exactly), computed in float64;
* `logit_diff`: the target's minus the foil's logit before soft-capping (with a foil);
* `rank`: the target's 0-based rank, the number of tokens scored strictly above it;
* `kl`: KL(clean ‖ patched) of the next-token distribution, against a reference `Measured`.

`measure` reads states; `measure_direct` reads the base run's state plus a change carried to
h_L with the final norm frozen at the base state (`carry`): the direct path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from resstream.analysis.attribution.readouts import actual_logits, direction
from resstream.analysis.decoding.decoder import Decoder
from resstream.analysis.norms import norm_form

#: The metrics every effect reports, in the order tables show them.
METRICS = ("logprob", "logit", "logit_diff", "rank", "kl")


@dataclass(frozen=True, eq=False)
class Measured:
    """Metrics of N final states (module docstring): each (N,) float64 (rank int64);
    `logit_diff` None without a foil; `log_probs` (N, vocab) float64 for KL."""

    logprob: Tensor
    logit: Tensor
    logit_diff: Tensor | None
    rank: Tensor
    log_probs: Tensor

    def kl_from(self, clean: Measured) -> Tensor:
        """KL(clean ‖ self) per row (N,), clean holding one row."""
        p = clean.log_probs[0].exp()
        return (p * (clean.log_probs[0] - self.log_probs)).sum(-1).clamp_min(0.0)

    def row(self, index: int) -> Measured:
        """One state's metrics as a `Measured` of one row."""
        pick = slice(index, index + 1)
        diff = None if self.logit_diff is None else self.logit_diff[pick]
        return Measured(self.logprob[pick], self.logit[pick], diff, self.rank[pick], self.log_probs[pick])

    def values(self, index: int, clean: Measured | None = None) -> dict[str, float | int | None]:
        """Row `index` as plain numbers by metric name (`kl` against `clean`, when given)."""
        out: dict[str, float | int | None] = {
            "logprob": float(self.logprob[index]),
            "logit": float(self.logit[index]),
            "logit_diff": None if self.logit_diff is None else float(self.logit_diff[index]),
            "rank": int(self.rank[index]),
        }
        if clean is not None:
            out["kl"] = float(self.kl_from(clean)[index])
        return out


@torch.no_grad()
def measure(decoder: Decoder, h: Tensor, target: int, foil: int | None = None) -> Measured:
    """The metrics of final states h (N, d) for `target` (and `foil`)."""
    pre = _pre_cap(decoder, h)
    ids = torch.full((h.shape[0],), target, dtype=torch.long, device=h.device)
    logit = actual_logits(decoder, h, ids)
    diff = None if foil is None else actual_logits(decoder, h, ids, torch.full_like(ids, foil))
    return _from_scores(decoder, pre, target, logit, diff)


@torch.no_grad()
def measure_direct(
    decoder: Decoder, base: Tensor, changes: Tensor, target: int, foil: int | None = None
) -> Measured:
    """The metrics of `base` (d,) + each change (N, d) with the final norm frozen at `base`:
    the direct path of each change to the logits."""
    form = norm_form(decoder.norm).to(torch.float64)
    changes = changes.to(base.device)
    moved = form.freeze(base.double().unsqueeze(0)).apply(changes.double())  # (N, d)
    W_U = decoder.matrix
    pre = _pre_cap(decoder, base.unsqueeze(0)) + (moved.to(W_U.dtype) @ W_U.T).float()
    device = W_U.device
    ids = torch.full((changes.shape[0],), target, dtype=torch.long, device=device)
    base_logit = actual_logits(decoder, base.unsqueeze(0), ids[:1])
    logit = base_logit + (moved.to(device) * direction(decoder, ids)).sum(-1)
    diff = None
    if foil is not None:
        foils = torch.full_like(ids, foil)
        base_diff = actual_logits(decoder, base.unsqueeze(0), ids[:1], foils[:1])
        diff = base_diff + (moved.to(device) * direction(decoder, ids, foils)).sum(-1)
    return _from_scores(decoder, pre, target, logit, diff)


def _pre_cap(decoder: Decoder, h: Tensor) -> Tensor:
    """Float32 logits (N, vocab) before soft-capping."""
    scores = decoder.inputs(h).float() @ decoder.matrix.float().T
    return scores + decoder.bias.float() if decoder.bias is not None else scores


def _from_scores(decoder: Decoder, pre: Tensor, target: int, logit: Tensor, diff: Tensor | None) -> Measured:
    scores = pre.double()
    if decoder.softcap:
        scores = torch.tanh(scores / decoder.softcap) * decoder.softcap
    log_probs = torch.log_softmax(scores, dim=-1)
    rank = (scores > scores[:, target : target + 1]).sum(-1)
    return Measured(log_probs[:, target], logit.double(), diff, rank, log_probs)


__all__ = ["METRICS", "Measured", "measure", "measure_direct"]
