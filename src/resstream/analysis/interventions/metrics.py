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

Precision: the final norm's formula is applied in float64 (`final_inputs`), the scores are
computed in the model's dtype, at least float32 (`score_dtype`: float64 for a float64 model,
float32 for float32, bfloat16 and float16 ones), and the logit, log-softmax and KL in float64:
never less precise than the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from resstream.analysis.attribution.readouts import bias_difference, direction
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
    return _read(decoder, final_inputs(decoder, h), target, foil)


@torch.no_grad()
def measure_direct(
    decoder: Decoder, base: Tensor, changes: Tensor, target: int, foil: int | None = None
) -> Measured:
    """The metrics of `base` (d,) + each change (N, d) with the final norm frozen at `base`:
    the direct path of each change to the logits. The frozen norm is applied to the moved
    state base + change itself, so a change that cancels the state reads as the zero state
    exactly (every score equal to its bias: all equal, rank 0, without biases), and a zero
    change reads as `measure` reads `base`."""
    form = norm_form(decoder.norm).to(torch.float64)
    state = base.double().unsqueeze(0)
    moved = state + changes.to(base.device).double()
    return _read(decoder, form.freeze(state).apply(moved) + form.offset(state), target, foil)


def final_inputs(decoder: Decoder, h: Tensor) -> Tensor:
    """final_norm(h) (N, d) in float64: the norm's formula (`norms.norm_form`, checked against
    the module) applied to the states in float64, so the read-out is never less precise than
    the model and the target's logit is `readouts.actual_logits`'s. The decoder is the logit
    lens (`Decoder.inputs` without a translator)."""
    return norm_form(decoder.norm).to(torch.float64)(h.double())


def score_dtype(decoder: Decoder) -> torch.dtype:
    """The dtype scores are computed in: the unembedding's (the model's), at least float32."""
    return torch.promote_types(decoder.matrix.dtype, torch.float32)


def pre_cap_scores(decoder: Decoder, x: Tensor) -> Tensor:
    """Scores (N, vocab) before soft-capping of decoder inputs x (N, d), in `score_dtype`."""
    dtype = score_dtype(decoder)
    scores = x.to(decoder.matrix.device, dtype) @ decoder.matrix.to(dtype).T
    return scores + decoder.bias.to(dtype) if decoder.bias is not None else scores


def _read(decoder: Decoder, x: Tensor, target: int, foil: int | None) -> Measured:
    """The metrics of decoder inputs x (N, d) float64 (module docstring): the rank counts the
    scores strictly above the target's before soft-capping (strictly increasing, it changes no
    rank: `Decoder`), log-probabilities and KL from the soft-capped scores in float64."""
    pre = pre_cap_scores(decoder, x)
    x = x.to(pre.device)
    ids = torch.full((x.shape[0],), target, dtype=torch.long, device=pre.device)
    logit = (x * direction(decoder, ids)).sum(-1) + bias_difference(decoder, ids)
    diff = None
    if foil is not None:
        foils = torch.full_like(ids, foil)
        diff = (x * direction(decoder, ids, foils)).sum(-1) + bias_difference(decoder, ids, foils)
    rank = (pre > pre[:, target : target + 1]).sum(-1)
    log_probs = log_probabilities(decoder, pre)
    return Measured(log_probs[:, target], logit, diff, rank, log_probs)


def log_probabilities(decoder: Decoder, pre: Tensor) -> Tensor:
    """The next-token log-probabilities (N, vocab) float64 of scores before soft-capping."""
    scores = pre.double()
    if decoder.softcap:
        scores = torch.tanh(scores / decoder.softcap) * decoder.softcap
    return torch.log_softmax(scores, dim=-1)


__all__ = [
    "METRICS",
    "Measured",
    "final_inputs",
    "log_probabilities",
    "measure",
    "measure_direct",
    "pre_cap_scores",
    "score_dtype",
]
