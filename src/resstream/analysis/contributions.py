"""Log-probability contribution scores: how much adding a vector raises the target's log-prob.

For a vector v added onto a residual state x and a token w (Yu & Ananiadou 2024, "Neuron-Level
Knowledge Attribution in Large Language Models"):

    C(v; x, w) = log p(w | x + v) − log p(w | x),   p(· | h) = softmax(decoder(h)),

the decoder being the logit lens (final norm, unembedding, bias, soft-capping: `decoding.py`).
Computed exactly, and fast, from the norm's formula (`norms.py`):
decoder(h) = A(h) / s(h) + b, A(h) = (W_U ⊙ g) · centre(h), b = W_U·β + b_U, so A is linear:
A(x + v) = A(x) + A(v), and s(x + v) needs only d-dimensional sums. A batch of vectors then
costs one (V × d) product each; a layer's neurons v_k = m_k · w_k (w_k the value vector) share
P = (W_U ⊙ g) · centre(W_out)ᵀ (V × d_ff, computed in chunks of neurons), after which every
neuron's scores are A(x) + m_k·P[:, k] — the floor is that product, L·d_ff·V·d multiply-adds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from resstream.analysis.decoding import Decoder
from resstream.analysis.norms import NormForm, norm_form

#: Bytes of (vectors × vocabulary) scores computed at once.
CHUNK_BYTES = 256 * 2**20


@dataclass(frozen=True, eq=False)
class LogProbs:
    """Exact log-probabilities of target tokens through a decoder, in the split form of the
    module docstring. Build with `log_probs_of(decoder)`; all arithmetic in float32."""

    form: NormForm
    weighted: Tensor  # W_U ⊙ g (V, d)
    offset: Tensor  # W_U·β + b_U (V,)
    softcap: float | None

    @property
    def vocab_size(self) -> int:
        return int(self.weighted.shape[0])

    def project(self, v: Tensor) -> Tensor:
        """A(v) = (W_U ⊙ g)·centre(v), (..., V) for v (..., d)."""
        return self.form.centred(v.float()) @ self.weighted.T

    def inverse_scale(self, h: Tensor) -> Tensor:
        """1 / s(h), (..., 1)."""
        return self.form.inverse_scale(h.float())

    def from_projection(self, projected: Tensor, inverse_scale: Tensor, target: Tensor) -> Tensor:
        """log p(target) from A(h) (..., V) and 1/s(h) (..., 1); `target` token ids, shaped
        like A(h)'s leading dims or broadcastable to them from the right."""
        logits = projected * inverse_scale + self.offset
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        picked = logits.gather(-1, target.expand(logits.shape[:-1]).unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)

    def of_states(self, h: Tensor, target: Tensor) -> Tensor:
        """log p(target | h) for states h (..., d)."""
        return self.from_projection(self.project(h), self.inverse_scale(h), target)

    def logits(self, h: Tensor) -> Tensor:
        """The decoder's scores (soft-capped) of h (..., d): equal to `Decoder.logits`."""
        logits = self.project(h) * self.inverse_scale(h) + self.offset
        return torch.tanh(logits / self.softcap) * self.softcap if self.softcap else logits

    def added(self, x: Tensor, vectors: Tensor, target: Tensor) -> Tensor:
        """C of each of `vectors` (C, N, d) added onto x (N, d), target (N,): (C, N)."""
        x = x.float()
        base_projection = self.project(x)
        base = self.from_projection(base_projection, self.inverse_scale(x), target)
        out = torch.empty(vectors.shape[:2], dtype=torch.float32, device=x.device)
        step = _chunk(vectors.shape[1] * self.vocab_size)
        for start in range(0, vectors.shape[0], step):
            v = vectors[start : start + step].float()
            projected = base_projection + self.project(v)
            scale = self.inverse_scale(x + v)
            out[start : start + step] = self.from_projection(projected, scale, target) - base
        return out

    def neurons(self, x: Tensor, coefficients: Tensor, values: Tensor, target: Tensor) -> Tensor:
        """C of every neuron k, v_k = m_k·values[k], added onto x: (d_ff, N) for x (N, d),
        coefficients m (N, d_ff), values (d_ff, d), target (N,). Uses P = A(values) in chunks
        of neurons (module docstring)."""
        x = x.float()
        base_projection = self.project(x)  # (N, V)
        base = self.from_projection(base_projection, self.inverse_scale(x), target)
        cx = self.form.centred(x)
        n_neurons = values.shape[0]
        out = torch.empty((n_neurons, x.shape[0]), dtype=torch.float32, device=x.device)
        step = _chunk(max(x.shape[0], 1) * self.vocab_size)
        for start in range(0, n_neurons, step):
            w = values[start : start + step].float()  # (k, d)
            cw = self.form.centred(w)
            P = self.project(w)  # (k, V)
            m = coefficients[:, start : start + step].T.float()  # (k, N)
            projected = base_projection.unsqueeze(0) + m.unsqueeze(-1) * P.unsqueeze(1)  # (k, N, V)
            scale = self._scale_of_sum(cx, cw, m)
            out[start : start + step] = self.from_projection(projected, scale, target) - base
        return out

    def _scale_of_sum(self, cx: Tensor, cw: Tensor, m: Tensor) -> Tensor:
        """1/s(x + m·w) (k, N, 1) from centred x (N, d), centred w (k, d), m (k, N)."""
        if self.form.identity:
            return torch.ones((*m.shape, 1), dtype=cx.dtype, device=cx.device)
        d = cx.shape[-1]
        xx = cx.pow(2).sum(-1) / d  # (N,)
        xw = (cw @ cx.T) / d  # (k, N)
        ww = cw.pow(2).sum(-1, keepdim=True) / d  # (k, 1)
        mean_square = xx + 2 * m * xw + m.pow(2) * ww
        return torch.rsqrt(mean_square.clamp_min(0) + self.form.eps).unsqueeze(-1)


def _chunk(scores_per_item: int) -> int:
    return max(1, CHUNK_BYTES // (4 * max(scores_per_item, 1)))


def log_probs_of(decoder: Decoder) -> LogProbs:
    """The split form of a logit-lens decoder (refused for the embedding decoder, whose
    scores are not the model's probabilities)."""
    if decoder.kind != "logit-lens":
        raise ValueError(f"contribution scores are defined through the logit lens, not {decoder.kind!r}")
    form = norm_form(decoder.norm)
    W_U = decoder.matrix.float()
    weighted = W_U if form.gain is None else W_U * form.gain.float()
    offset = torch.zeros(W_U.shape[0], dtype=torch.float32, device=W_U.device)
    if form.bias is not None:
        offset = offset + W_U @ form.bias.float()
    if decoder.bias is not None:
        offset = offset + decoder.bias.float()
    return LogProbs(form=form, weighted=weighted, offset=offset, softcap=decoder.softcap)


__all__ = ["CHUNK_BYTES", "LogProbs", "log_probs_of"]
