"""Residual gates: injected modules that give each block the scale α_l of its identity path.

A block computes `y = α_l·x + attn(ln1(x))`. The gate is called once per forward pass with
the embedding output h_0 and returns one entry per layer: `None` (identity path untouched,
so the baseline is reproduced bit for bit), a scalar tensor, or a (batch, seq, 1) tensor for
per-token gates.

- `none`: α_l = 1 everywhere.
- `fixed`: α at one layer k, 1 elsewhere.
- `learned`: logits θ ∈ R^L (initialised to 0), p = softmax(θ), α_l = 1 − s·p_l.
- `router`: like `learned`, but θ depends on the token: θ(i) = W·h_0(i) + b with W, b
  initialised to 0, so training starts from the uniform distribution (mixture-of-depths style).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from resstream.training.config import ModelConfig

Alphas = list[Tensor | None]


class ResidualGate(nn.Module):
    """Base class: `forward(h0)` returns the per-layer α; `distribution()` the gate's p."""

    def __init__(self, n_layer: int) -> None:
        super().__init__()
        self.n_layer = n_layer

    def forward(self, h0: Tensor) -> Alphas:  # pragma: no cover - abstract
        raise NotImplementedError

    def distribution(self) -> Tensor | None:
        """The gating distribution over layers (detached), or None for gates without one."""
        return None


class NoGate(ResidualGate):
    """α_l = 1 for every layer: the plain residual stream."""

    def forward(self, h0: Tensor) -> Alphas:
        return [None] * self.n_layer


class FixedGate(ResidualGate):
    """α at layer `cut_layer`, 1 elsewhere."""

    def __init__(self, n_layer: int, cut_layer: int, alpha: float) -> None:
        super().__init__(n_layer)
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha {alpha} is outside (0, 1]")
        if not 0 <= cut_layer < n_layer:
            raise ValueError(f"cut_layer {cut_layer} is outside [0, {n_layer})")
        self.cut_layer = cut_layer
        self.alpha = alpha

    def forward(self, h0: Tensor) -> Alphas:
        alphas: Alphas = [None] * self.n_layer
        alphas[self.cut_layer] = h0.new_tensor(self.alpha)
        return alphas

    def distribution(self) -> Tensor:
        p = torch.zeros(self.n_layer)
        p[self.cut_layer] = 1.0
        return p


class LearnedGate(ResidualGate):
    """A learned softmax distribution over layers: α_l = 1 − s·p_l, p = softmax(θ)."""

    def __init__(self, n_layer: int, strength: float) -> None:
        super().__init__(n_layer)
        self.strength = strength
        self.logits = nn.Parameter(torch.zeros(n_layer))

    def forward(self, h0: Tensor) -> Alphas:
        alpha = 1.0 - self.strength * torch.softmax(self.logits.float(), dim=0)
        return list(alpha.to(h0.dtype).unbind(0))

    def distribution(self) -> Tensor:
        return torch.softmax(self.logits.detach().float(), dim=0).cpu()


class RouterGate(ResidualGate):
    """A per-token distribution over layers computed from the token's embedding h_0(i)."""

    def __init__(self, n_layer: int, d_model: int, strength: float) -> None:
        super().__init__(n_layer)
        self.strength = strength
        self.router = nn.Linear(d_model, n_layer)
        self._last_mean: Tensor | None = None

    def reset_parameters(self) -> None:
        """Zero weights and bias: every token starts from the uniform distribution."""
        nn.init.zeros_(self.router.weight)
        nn.init.zeros_(self.router.bias)

    def forward(self, h0: Tensor) -> Alphas:
        p = torch.softmax(self.router(h0).float(), dim=-1)  # (batch, seq, L)
        self._last_mean = p.detach().mean(dim=(0, 1))  # stays on the device: no sync per step
        alpha = (1.0 - self.strength * p).to(h0.dtype)
        return list(alpha.unsqueeze(-1).unbind(-2))

    def distribution(self) -> Tensor:
        """Mean over tokens of the last batch seen (uniform before any)."""
        if self._last_mean is None:
            return torch.full((self.n_layer,), 1.0 / self.n_layer)
        return self._last_mean.cpu()


def make_gate(config: ModelConfig) -> ResidualGate:
    """The gate module that `config.gate` names."""
    if config.gate == "none":
        return NoGate(config.n_layer)
    if config.gate == "fixed":
        return FixedGate(config.n_layer, config.resolved_cut_layer, config.alpha)
    if config.gate == "learned":
        return LearnedGate(config.n_layer, config.gate_strength)
    if config.gate == "router":
        return RouterGate(config.n_layer, config.d_model, config.gate_strength)
    raise ValueError(f"unknown gate {config.gate!r}")
