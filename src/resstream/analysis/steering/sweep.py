"""Measuring a steer: what a direction added at a coefficient buys, and what it costs.

For each site (a residual state ``L{l}.resid``) and coefficient c, the continuations of the
prompts generated under Add(site, unit direction, c) are scored four ways (float64):

* `concept_score`: the concept probe's probability σ(w·h̄ + b) of each continuation, h̄ the
  mean state of its new tokens at the probe's site in the *unsteered* model reading the text
  (does the text carry the concept, as the model itself represents it?); mean over prompts;
* `concept_logprob`: log Σ_{t ∈ concept tokens} p(t) of the steered model at each new position,
  mean over positions and prompts (how much probability the steer moves onto the concept);
* `kl`: KL(p_unsteered ‖ p_steered) of the next-token distributions on neutral text, nats a
  position, mean over positions (what the steer costs elsewhere);
* `perplexity`: of the continuations under the unsteered model, exp(mean NLL of the new
  tokens) (does the text stay fluent?).

The inference-time attenuation map: for a block l and factor α, the model with Scale(L{l}.resid,
α) — block l computes α·h_l + F_l(h_l) — is scored by its `loss` (mean next-token NLL over a
corpus sample, nats) and `shift_layer` (`shift`'s metric: the first depth where the top-k
match with the next token overtakes the match with the input).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from resstream.display import Displayable
from resstream.reprs import summary


def continuation_nll(logits: Tensor, ids: Tensor, start: int) -> Tensor:
    """NLL (nats, float64) of each token at positions start.. of `ids` (T,) given the logits
    (T, vocab) of the positions before it."""
    logp = torch.log_softmax(logits[start - 1 : -1].double(), dim=-1)
    return -logp.gather(-1, ids[start:, None].to(logp.device)).squeeze(-1)


def concept_logprob(logits: Tensor, concept: Tensor) -> Tensor:
    """log Σ_{t ∈ concept} p(t) at each position of `logits` (T, vocab), float64."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return torch.logsumexp(logp[:, concept.to(logp.device)], dim=-1)


def mean_kl(clean: Tensor, steered: Tensor) -> float:
    """Mean over positions of KL(p_clean ‖ p_steered), nats; logits (T, vocab) each."""
    p = torch.log_softmax(clean.double(), dim=-1)
    q = torch.log_softmax(steered.double(), dim=-1)
    return float((p.exp() * (p - q)).sum(dim=-1).mean())


def probe_probability(states: Tensor, weight: Tensor, bias: float) -> float:
    """σ(w·h̄ + b) of the mean of `states` (n, d), float64."""
    mean = states.double().mean(dim=0)
    return float(torch.sigmoid(mean @ weight.double().to(mean.device) + bias))


@dataclass(frozen=True)
class SteerPoint:
    """One site and coefficient (module docstring): the four scores, and the share of prompts
    whose continuation the steer changed, with the first prompt's continuation as an example."""

    site: str
    coef: float
    concept_score: float | None
    concept_logprob: float | None
    kl: float
    perplexity: float
    changed: float
    example: str = ""


@dataclass(frozen=True)
class SteerResult(Displayable, renderer="resstream.reporting.steer"):
    """A steering sweep: one `SteerPoint` per site and coefficient, in order; `settings`
    (the prompts, concept tokens, probe site, sampling)."""

    model: str
    points: tuple[SteerPoint, ...]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def sites(self) -> list[str]:
        """The sites swept, in order."""
        return list(dict.fromkeys(p.site for p in self.points))

    def curve(self, site: str) -> list[SteerPoint]:
        """One site's points, by coefficient."""
        return sorted((p for p in self.points if p.site == site), key=lambda p: p.coef)

    def __repr__(self) -> str:
        coefs = sorted({p.coef for p in self.points})
        return summary(self, f"model={self.model!r}", f"sites {', '.join(self.sites)}", f"coefs {coefs}")

    def to_dict(self) -> dict[str, Any]:
        """steer.json."""
        return {"model": self.model, "settings": self.settings, "points": [vars(p) for p in self.points]}


@dataclass(frozen=True)
class AttenuationPoint:
    """The model with block `layer`'s identity path scaled by `alpha`: its loss and shift
    layer (module docstring; None when the match with the next token never overtakes)."""

    layer: int
    alpha: float
    loss: float
    shift_layer: float | None


@dataclass(frozen=True)
class TrainedPoint:
    """A model trained with an attenuated residual path (a `reproduce` or `train` run): its
    gate, where it puts α, and the same two scores on the same sample."""

    name: str
    gate: str
    layer: int | None
    alpha: float | None
    loss: float
    shift_layer: float | None


@dataclass(frozen=True)
class AttenuationResult(Displayable, renderer="resstream.reporting.steer"):
    """The inference-time attenuation map: one `AttenuationPoint` per block and α (α = 1 is
    the unedited model), the trained runs beside it, and the sample's `settings`."""

    model: str
    n_layers: int
    points: tuple[AttenuationPoint, ...]
    trained: tuple[TrainedPoint, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def alphas(self) -> list[float]:
        """The factors, descending."""
        return sorted({p.alpha for p in self.points}, reverse=True)

    @property
    def layers(self) -> list[int]:
        """The blocks attenuated, ascending."""
        return sorted({p.layer for p in self.points})

    def grid(self, metric: str) -> list[list[float]]:
        """[layer][alpha] of `metric` ("loss" or "shift_layer"; NaN for a shift that never
        happens), layers ascending and alphas descending."""
        table = {(p.layer, p.alpha): getattr(p, metric) for p in self.points}
        return [
            [math.nan if table[(layer, a)] is None else float(table[(layer, a)]) for a in self.alphas]
            for layer in self.layers
        ]

    def __repr__(self) -> str:
        return summary(
            self,
            f"model={self.model!r}",
            f"blocks {self.layers}",
            f"alphas {self.alphas}",
            f"{len(self.trained)} trained run{'s' * (len(self.trained) != 1)}" if self.trained else "",
        )

    def to_dict(self) -> dict[str, Any]:
        """attenuation.json."""
        return {
            "model": self.model,
            "n_layers": self.n_layers,
            "settings": self.settings,
            "points": [vars(p) for p in self.points],
            "trained": [vars(t) for t in self.trained],
        }


def mean_or_none(values: Sequence[float]) -> float | None:
    """The mean of `values`, None for none."""
    return sum(values) / len(values) if values else None


__all__ = [
    "AttenuationPoint",
    "AttenuationResult",
    "SteerPoint",
    "SteerResult",
    "TrainedPoint",
    "concept_logprob",
    "continuation_nll",
    "mean_kl",
    "mean_or_none",
    "probe_probability",
]
