"""Training and evaluating tuned-lens translators on captured residual states.

Objective (Belrose et al. 2023): for every layer l < L, the KL divergence from the model's
own final next-token distribution p = softmax(z(h_L)) to the lens distribution
q_l = softmax(z(T_l(h_l))), where z(x) = W_U · final_norm(x) (+ b_U, soft-capped where the
model is) and T_l the layer's translator, averaged over positions; the layers' losses are
summed (each translator only sees its own layer's term, so the sum trains them independently).

The model is frozen and never differentiated: the states come from one forward pass without
gradients, and the gradient of KL(p ‖ softmax(z)) with respect to the logits z is written
down, q − p (times the soft-cap derivative 1 − tanh²), and carried back through W_U by one
matrix product; autograd only runs through the final norm and the translators. Positions are
processed in blocks of rows, all layers of a block in one batched product, so no (L, n, vocab)
tensor is ever held whole: `chunk_bytes` bounds the score block.

`LensObjective.measure` evaluates the same quantities without training: per layer, the KL to the
final distribution and the cross-entropy against the next token, in nats summed over positions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from resstream.analysis.decoding.tuned_lens import Translators
from resstream.analysis.norms import norm_form
from resstream.display import Displayable
from resstream.io import jsonable
from resstream.models.adapters.base import ModelView
from resstream.reprs import summary

#: Score-block size (bytes of float32 logits for all layers of one block of positions).
CHUNK_BYTES = 256 * 2**20
#: Nats per bit.
LN2 = math.log(2.0)


class LensObjective:
    """The KL objective of one model's tuned lens (module docstring), in float32."""

    def __init__(self, view: ModelView, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        device = view.W_U.device
        self.W_U = view.W_U.detach().to(device, torch.float32)
        self.b_U = None if view.b_U is None else view.b_U.detach().to(device, torch.float32)
        self.norm = norm_form(view.final_norm).to(torch.float32)
        self.softcap = view.logit_softcap
        self.n_layers = view.n_layers
        self.chunk_bytes = chunk_bytes

    @property
    def vocab(self) -> int:
        return int(self.W_U.shape[0])

    # ----------------------------------------------------------------- pieces

    def logits(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Logits z (..., V) of states x (..., d) after the final norm, and tanh(s / c) where
        the model soft-caps (for the derivative), else None."""
        return self._logits_of_normed(self.norm(x))

    def _logits_of_normed(self, normed: Tensor) -> tuple[Tensor, Tensor | None]:
        """`logits` of states already through the final norm."""
        scores = normed @ self.W_U.T
        if self.b_U is not None:
            scores += self.b_U
        if not self.softcap:
            return scores, None
        capped = torch.tanh(scores / self.softcap)
        return capped * self.softcap, capped

    def rows_per_block(self, depth: int) -> int:
        """Positions per block so that `depth` layers of float32 logits fit `chunk_bytes`."""
        return max(1, self.chunk_bytes // (4 * self.vocab * depth))

    def final_log_probs(self, h_last: Tensor) -> Tensor:
        """log p (n, V) of the model's own final distribution for final states (n, d)."""
        with torch.no_grad():
            z, _ = self.logits(h_last.float())
            return torch.log_softmax(z, dim=-1)

    # ----------------------------------------------------------------- training

    def backward(self, translators: Translators, states: Tensor, total: int) -> Tensor:
        """Accumulate into the translators' .grad the gradient of Σ_l mean KL_l over `total`
        positions (this call's share: the positions of `states`), and return this call's
        per-layer KL sums (L,) in nats. `states`: (L+1, n, d) — h_0..h_L of n positions."""
        depth = self.n_layers
        sums = torch.zeros(depth, dtype=torch.float64, device=self.W_U.device)
        rows = self.rows_per_block(depth)
        for start in range(0, states.shape[1], rows):
            block = states[:, start : start + rows].to(self.W_U.device, torch.float32)
            log_p = self.final_log_probs(block[depth])
            normed = self.norm(translators.translate_all(block[:depth]))  # (L, c, d), differentiable
            kl, grad = self._kl_and_gradient(normed.detach(), log_p, total)
            normed.backward(grad)
            sums += kl.double().sum(1)
        return sums

    def _kl_and_gradient(self, normed: Tensor, log_p: Tensor, total: int) -> tuple[Tensor, Tensor]:
        """KL(p ‖ q_l) per layer and position (L, c) of normed states (L, c, d), and the
        gradient of Σ KL / total with respect to them (L, c, d)."""
        with torch.no_grad():
            scores, tanh = self._logits_of_normed(normed)
            kl = self._kl_in_place(scores, log_p)  # scores now hold q − p
            if tanh is not None:
                scores *= 1 - tanh.square()
            return kl, (scores @ self.W_U).div_(total)

    @staticmethod
    def _kl_in_place(z: Tensor, log_p: Tensor) -> Tensor:
        """KL(p ‖ softmax(z)) per row (L, c) of logits z (L, c, V); leaves q − p in z.

        KL = Σ p log p − Σ p z + logsumexp(z); the softmax is formed in place (max, exp, sum,
        divide), which on a CPU beats torch's log-softmax and softmax by ~1.6× here."""
        p = log_p.exp()
        cross = torch.matmul(z.transpose(0, 1), p.unsqueeze(-1)).squeeze(-1).T  # Σ p z
        top = z.amax(-1, keepdim=True)
        total = z.sub_(top).exp_().sum(-1, keepdim=True)
        z.div_(total).sub_(p)
        log_normaliser = (top + total.log()).squeeze(-1)
        return (p * log_p).sum(-1) - cross + log_normaliser

    # ----------------------------------------------------------------- evaluation

    def measure(self, translators: Translators | None, states: Tensor, targets: Tensor) -> LayerSums:
        """Per-layer sums over positions (layers 0..L) of KL(final ‖ lens) and of the
        cross-entropy −log q_l(target), in nats, without training. `states` (L+1, n, d),
        `targets` (n,) the next token of each position; `translators` None: the logit lens."""
        depth = self.n_layers + 1
        kl = torch.zeros(depth, dtype=torch.float64)
        ce = torch.zeros(depth, dtype=torch.float64)
        rows = self.rows_per_block(depth)
        with torch.no_grad():
            for start in range(0, states.shape[1], rows):
                block = states[:, start : start + rows].to(self.W_U.device, torch.float32)
                log_p = self.final_log_probs(block[-1])
                x = (
                    block
                    if translators is None
                    else torch.cat([translators.translate_all(block[:-1]), block[-1:]])
                )
                log_q = torch.log_softmax(self.logits(x)[0], dim=-1)
                index = targets[start : start + rows].to(log_q.device)
                picked = log_q.gather(-1, index.expand(depth, -1).unsqueeze(-1)).squeeze(-1)
                ce -= picked.double().sum(1).cpu()
                p = log_p.exp()
                kl += ((p * log_p).sum(-1) - (log_q * p).sum(-1)).double().sum(1).cpu()
        return LayerSums(kl, ce, int(states.shape[1]))


@dataclass
class LayerSums:
    """Per-layer sums (layers 0..L) of KL and cross-entropy in nats over `positions`."""

    kl: Tensor
    ce: Tensor
    positions: int

    def __add__(self, other: LayerSums) -> LayerSums:
        return LayerSums(self.kl + other.kl, self.ce + other.ce, self.positions + other.positions)


#: The columns of `LensEvaluation.to_pandas()` (and of evaluation.csv).
EVALUATION_COLUMNS = ("model", "layer", "lens", "metric", "value")


@dataclass(frozen=True)
class LensEvaluation(Displayable, renderer="resstream.reporting.tuned_lens"):
    """Per layer 0..L, on held-out positions: the mean KL from the model's final distribution
    and the mean cross-entropy against the next token, in bits, of the logit lens and of the
    tuned lens (at layer L both are the model's own output).

    `to_pandas()` columns (`EVALUATION_COLUMNS`), one row per layer, metric and lens: model —
    the model's name; layer — 0..L (0 = the embedding output); lens — "logit" or "tuned";
    metric — "kl_bits" (the mean KL(final ‖ lens), `logit_kl` / `tuned_kl`) or "ce_bits" (the
    mean cross-entropy against the next token, `logit_ce` / `tuned_ce`); value — in bits.
    evaluation.csv is this frame. In a notebook the evaluation shows its values per layer and
    bits_per_layer.png.
    """

    model: str
    layers: tuple[int, ...]
    logit_kl: tuple[float, ...]
    tuned_kl: tuple[float, ...]
    logit_ce: tuple[float, ...]
    tuned_ce: tuple[float, ...]
    num_tokens: int
    sample: str = ""
    dataset: str | None = None
    dataset_fingerprint: str | None = None
    num_sequences: int = 0
    seq_len: int = 0  # tokens per evaluated window
    seed: int | None = None  # of the window sample (and of the training split, on its corpus)

    @classmethod
    def from_sums(cls, model: str, logit: LayerSums, tuned: LayerSums, sample: str = "") -> LensEvaluation:
        """Means in bits of the two lenses' sums over the same positions."""
        n = logit.positions

        def bits(t: Tensor) -> tuple[float, ...]:
            return tuple((t / (n * LN2)).tolist())

        layers = tuple(range(len(logit.kl)))
        return cls(model, layers, bits(logit.kl), bits(tuned.kl), bits(logit.ce), bits(tuned.ce), n, sample)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict (evaluation.json)."""
        return jsonable(asdict(self))

    @property
    def mean_kl(self) -> tuple[float, float]:
        """The KL (bits) of the logit lens and of the tuned lens, each averaged over layers
        0..L−1 (layer L, the model's output, has none)."""
        inner = max(1, len(self.layers) - 1)
        return sum(self.logit_kl[:-1]) / inner, sum(self.tuned_kl[:-1]) / inner

    def headline(self) -> str:
        """The evaluation in one line: the mean KL of both lenses and on how many positions."""
        logit, tuned = self.mean_kl
        return (
            f"held-out KL to the final distribution, mean over layers 0..{len(self.layers) - 2}: "
            f"logit lens {logit:.3f} bits, tuned lens {tuned:.3f} bits, on {self.num_tokens:,} positions"
        )

    def __repr__(self) -> str:
        return summary(self, f"{self.model}: {self.headline()}", self.sample)


@dataclass(frozen=True)
class LensOptimiser:
    """SGD with Nesterov momentum, the joint gradient norm clipped to 1 and a linear decay to
    zero over `steps`: the recipe of the tuned-lens paper and package (250 steps, lr 1.0 ×
    (1 − momentum) = 0.1, weight decay 1e-3, no warm-up; docs/tuned-lens.md)."""

    steps: int = 250
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-3
    max_grad_norm: float | None = 1.0

    def clip(self, translators: Translators) -> None:
        """Clip the translators' joint gradient norm to `max_grad_norm` (None: no clipping)."""
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(translators.parameters(), self.max_grad_norm)

    def build(
        self, translators: Translators, start: int = 0
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        """The optimiser over the translators and its schedule (call `scheduler.step()` after
        each optimiser step), `start` steps into the run: a resumed run's rates are those of
        the uninterrupted one from its step `start` on (the rate depends on the step alone)."""
        optimiser = torch.optim.SGD(
            translators.parameters(),
            lr=self.lr,
            momentum=self.momentum,
            nesterov=True,
            weight_decay=self.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimiser, lambda step: max(0.0, 1.0 - (start + step) / self.steps)
        )
        return optimiser, scheduler


__all__ = [
    "CHUNK_BYTES",
    "EVALUATION_COLUMNS",
    "LayerSums",
    "LensEvaluation",
    "LensObjective",
    "LensOptimiser",
]
