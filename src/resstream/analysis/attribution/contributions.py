"""Log-probability contribution scores: how much adding a vector raises the target's log-prob.

For a vector v added onto a residual state x and a token w (Yu & Ananiadou 2024, "Neuron-Level
Knowledge Attribution in Large Language Models"):

    C(v; x, w) = log p(w | x + v) − log p(w | x),   p(· | h) = softmax(decoder(h)),

the decoder being the logit lens (final norm, unembedding, bias, soft-capping: `decoding.py`).
Computed exactly from the norm's formula (`norms.py`): decoder(h) = (W_U ⊙ g)·n(h) + b with
n(h) = centre(h)/s(h) and b = W_U·β + b_U, so the scores of a batch of states are one fused
matrix product with the bias added in the same call (`torch.addmm`), followed by a
log-sum-exp — no pass over the (states × vocabulary) scores beyond those two. A layer's
neurons, v_k = m_k·w_k, need the scores of x + m_k·w_k for every k: the product of the
d_ff states with the d × V unembedding is the floor, L·d_ff·V·d multiply-adds for all layers.

A head's attention sources v_j = α_j·(x_j W_V + b_V)·W_O all lie in the head's d_head-wide
output space, so `low_rank_added` projects a layer's W_O into the vocabulary once
(V·d·d, all heads in one product) and scores every source through it with d_head + 1
multiply-adds per token instead of d.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from resstream.analysis.decoding.decoder import Decoder
from resstream.analysis.norms import NormForm, norm_form

#: Bytes of (states × vocabulary) scores computed at once.
CHUNK_BYTES = 64 * 2**20


@dataclass(frozen=True, eq=False)
class LogProbs:
    """Exact log-probabilities of target tokens through a logit-lens decoder (module
    docstring). Build with `log_probs_of(decoder)`; all arithmetic in float32."""

    form: NormForm
    weighted: Tensor  # W_U ⊙ g (V, d)
    offset: Tensor  # W_U·β + b_U (V,)
    softcap: float | None
    # One (rows × vocabulary) buffer reused by every chunk: a fresh allocation of that size
    # is new memory the kernel must map page by page, which costs more than the scores.
    _scratch: dict[str, Tensor] = field(default_factory=dict, repr=False)

    @property
    def vocab_size(self) -> int:
        return int(self.weighted.shape[0])

    def normalised(self, h: Tensor) -> Tensor:
        """n(h) = centre(h)/s(h) (..., d): what the gain-weighted unembedding reads."""
        h = h.float()
        return self.form.centred(h) * self.form.inverse_scale(h)

    def logits(self, h: Tensor) -> Tensor:
        """The decoder's scores (soft-capped) of h (..., d): equal to `Decoder.logits`."""
        rows = self.normalised(h).reshape(-1, h.shape[-1])
        return self._capped(torch.addmm(self.offset, rows, self.weighted.T)).reshape(*h.shape[:-1], -1)

    def of_states(self, h: Tensor, target: Tensor) -> Tensor:
        """log p(target | h) for states h (..., d); `target` broadcastable to h's leading dims."""
        rows = self.normalised(h).reshape(-1, h.shape[-1])
        ids = target.to(rows.device).expand(h.shape[:-1]).reshape(-1)
        out = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
        step = _chunk(self.vocab_size)
        for start in range(0, rows.shape[0], step):
            scores = self._scores(rows[start : start + step], self.weighted.T)
            out[start : start + step] = _picked_log_softmax(scores, ids[start : start + step])
        return out.reshape(h.shape[:-1])

    def _scores(self, rows: Tensor, reader: Tensor) -> Tensor:
        """offset + rows @ reader, soft-capped, in the reused scratch buffer (rows, V)."""
        scores = torch.addmm(self.offset, rows, reader, out=self._buffer(rows.shape[0]))
        return self._capped_(scores)

    def log_prob_and_gradient(self, h: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """log p(target | h) (N,) and ∂ log p(target | h) / ∂h (N, d) for states h (N, d),
        target (N,), from one decode: the gradient is the first-order change of the
        log-probability per unit of a vector added onto h. With δ = e_w − p (times the
        soft-cap's derivative), u = (W_U ⊙ g)ᵀ·δ and n = centre(h)/s:
        ∂/∂centre(h) = (u − n·(u·n)/d)/s, then centred again for LayerNorm."""
        rows = self.normalised(h).reshape(-1, h.shape[-1])
        ids = target.to(rows.device).reshape(-1)
        out = torch.empty_like(rows)
        log_probs = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
        step = _chunk(self.vocab_size)
        for start in range(0, rows.shape[0], step):
            n = rows[start : start + step]
            raw = torch.addmm(self.offset, n, self.weighted.T, out=self._buffer(n.shape[0]))
            if self.softcap:
                raw.div_(self.softcap).tanh_()
                slope = 1 - raw.pow(2)
                raw.mul_(self.softcap)
            log_probs[start : start + step] = _picked_log_softmax(raw, ids[start : start + step])
            delta = raw.softmax(dim=1).neg_()
            delta[torch.arange(n.shape[0]), ids[start : start + step]] += 1
            if self.softcap:
                delta.mul_(slope)
            out[start : start + step] = delta @ self.weighted
        d = rows.shape[-1]
        if self.form.identity:
            return log_probs, out.reshape(h.shape)
        u = out
        scale = self.form.inverse_scale(h.float().reshape(-1, d))
        grad = (u - rows * (u * rows).sum(-1, keepdim=True) / d) * scale
        return log_probs, self.form.centred(grad).reshape(h.shape)

    def added(self, x: Tensor, vectors: Tensor, target: Tensor) -> Tensor:
        """C of each of `vectors` (C, N, d) added onto x (N, d), target (N,): (C, N)."""
        x = x.float()
        base = self.of_states(x, target)
        out = torch.empty(vectors.shape[:2], dtype=torch.float32, device=x.device)
        step = max(1, _chunk(self.vocab_size) // max(vectors.shape[1], 1))
        for start in range(0, vectors.shape[0], step):
            out[start : start + step] = (
                self.of_states(x + vectors[start : start + step].float(), target) - base
            )
        return out

    def neurons(self, x: Tensor, coefficients: Tensor, values: Tensor, target: Tensor) -> Tensor:
        """C of every neuron k, v_k = m_k·values[k], added onto x: (d_ff, N) for x (N, d),
        coefficients m (N, d_ff), values (d_ff, d), target (N,). The states x + v_k are built
        a chunk of neurons at a time, never all at once."""
        x = x.float()
        base = self.of_states(x, target)
        n_neurons = values.shape[0]
        out = torch.empty((n_neurons, x.shape[0]), dtype=torch.float32, device=x.device)
        step = max(1, _chunk(self.vocab_size) // max(x.shape[0], 1))
        for start in range(0, n_neurons, step):
            m = coefficients[:, start : start + step].T.float()  # (k, N)
            states = x + m.unsqueeze(-1) * values[start : start + step].float().unsqueeze(1)  # (k, N, d)
            out[start : start + step] = self.of_states(states, target) - base
        return out

    def low_rank_added(self, x: Tensor, coefficients: Tensor, bases: Tensor, target: Tensor) -> Tensor:
        """C of the vectors v_{h,i} = coefficients[h, i] @ bases[h], each added onto its state
        x[i] (x (n, d), or one state (d,) shared by all), for coefficients (H, n, r) and bases
        (H, r, d) with r ≪ d — a layer's heads (r = d_head) at n positions, or one head's
        sources at one position; `target` (n,) or a 0-d id. Returns (H, n).

        Scores are s·(A(x) + M_h·c) + b with A(x) = (W_U ⊙ g)·centre(x) and
        M = centre(bases) @ (W_U ⊙ g)ᵀ (H·r × V), one product for all heads; per head and chunk
        of rows that is one fused `addmm` onto s ⊙ A(x) + b."""
        x, coefficients, bases = x.float(), coefficients.float(), bases.float()
        n_heads, n, rank = coefficients.shape
        xs = x.expand(n, x.shape[-1]) if x.ndim == 1 else x
        ids = target.to(xs.device).expand(n)
        M = self.form.centred(bases.reshape(n_heads * rank, -1)) @ self.weighted.T  # (H·r, V)
        out = torch.empty((n_heads, n), dtype=torch.float32, device=xs.device)
        shared = x.ndim == 1  # one state: A(x) and its log p once, broadcast over the rows
        if shared:
            A_shared = (self.form.centred(x) @ self.weighted.T).unsqueeze(0)  # (1, V)
            base_shared = self._log_probs_of(A_shared, self.form.inverse_scale(x).unsqueeze(0), ids[:1])
        step = _chunk(self.vocab_size)
        for start in range(0, n, step):
            rows = slice(start, start + step)
            if shared:
                A_x, base = A_shared, base_shared
            else:
                A_x = self.form.centred(xs[rows]) @ self.weighted.T  # (k, V)
                base = self._log_probs_of(A_x, self.form.inverse_scale(xs[rows]), ids[rows])
            for head in range(n_heads):
                c = coefficients[head, rows]
                scale = self.form.inverse_scale(xs[rows] + c @ bases[head])  # (k, 1)
                reader = M[head * rank : (head + 1) * rank]
                out[head, rows] = (
                    self._log_probs_of(A_x, scale, ids[rows], low_rank=(c * scale, reader)) - base
                )
        return out

    def _log_probs_of(
        self, A_x: Tensor, scale: Tensor, ids: Tensor, *, low_rank: tuple[Tensor, Tensor] | None = None
    ) -> Tensor:
        """log p(ids) from scores b + scale ⊙ A_x (+ rows @ reader, `low_rank` = (rows, reader)),
        built in the scratch buffer; A_x (k or 1, V) broadcasts over the k rows of `scale` (k, 1)."""
        scores = torch.addcmul(self.offset, A_x, scale, out=self._buffer(scale.shape[0]))
        if low_rank is not None:
            scores.addmm_(*low_rank)
        return _picked_log_softmax(self._capped_(scores), ids)

    def _buffer(self, n: int) -> Tensor:
        """The reused scratch buffer's first n rows (see `_scratch`)."""
        buffer = self._scratch.get("scores")
        if buffer is None or buffer.shape[0] < n:
            size = (max(n, _chunk(self.vocab_size)), self.vocab_size)
            buffer = torch.empty(size, dtype=torch.float32, device=self.weighted.device)
            self._scratch["scores"] = buffer
        return buffer[:n]

    def _capped(self, scores: Tensor) -> Tensor:
        return torch.tanh(scores / self.softcap) * self.softcap if self.softcap else scores

    def _capped_(self, scores: Tensor) -> Tensor:
        """Soft-capping in place."""
        if self.softcap:
            scores.div_(self.softcap).tanh_().mul_(self.softcap)
        return scores


def _picked_log_softmax(scores: Tensor, ids: Tensor) -> Tensor:
    """log softmax(scores)[ids] per row."""
    return scores.gather(1, ids.unsqueeze(1)).squeeze(1) - torch.logsumexp(scores, dim=1)


def _chunk(vocab: int) -> int:
    """Rows of scores per step."""
    return max(1, CHUNK_BYTES // (4 * max(vocab, 1)))


def log_probs_of(decoder: Decoder) -> LogProbs:
    """The split form of a logit-lens decoder (refused for the embedding decoder, whose
    scores are not the model's probabilities)."""
    if decoder.kind != "logit-lens":
        raise ValueError(f"contribution scores are defined through the logit lens, not {decoder.kind!r}")
    form = norm_form(decoder.norm).to(torch.float32)
    W_U = decoder.matrix.detach().float()
    weighted = W_U if form.gain is None else W_U * form.gain
    offset = torch.zeros(W_U.shape[0], dtype=torch.float32, device=W_U.device)
    if form.bias is not None:
        offset = offset + W_U @ form.bias
    if decoder.bias is not None:
        offset = offset + decoder.bias.detach().float()
    return LogProbs(form=form, weighted=weighted.contiguous(), offset=offset, softcap=decoder.softcap)


__all__ = ["CHUNK_BYTES", "LogProbs", "log_probs_of"]
