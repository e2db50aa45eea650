"""Normalisation layers as formulas, so a norm can be frozen at a state and applied linearly.

Every norm the supported families use is, at an input u (..., d),

    norm(u) = centre(u) · g / s(u) + b

with centre(u) = u − mean(u) for LayerNorm (u itself for RMSNorm), s(u) =
sqrt(mean(centre(u)²) + eps), g the gain (Gemma's RMSNorm: 1 + weight) and b the bias (None
for RMSNorm). The identity (post-norm models' final norm) has g = 1, s = 1, b = 0.

With s frozen at an actual state u = Σ_c v_c, the norm is an affine map of each part:
norm(u) = Σ_c centre(v_c) · g / s(u) + b exactly, which is how decomposition and attribution
pass components through a norm (`FrozenNorm`). `norm_form(module)` reads the formula of a
module and checks it against the module's own output on a probe input. `head_norm(block,
which)` reads a block's QK-norm (a norm on each head's query or key) the same way, with the
layout of its input (one head, or all heads joined: `HeadNorm`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from resstream.models.adapters.base import BlockView, InlineScale
from resstream.models.adapters.weights import repeat_heads

#: Relative difference between a module's output and its read formula above which
#: `norm_form` refuses the module (the formula would be wrong, not rounded).
FORM_TOLERANCE = 1e-4


@dataclass(frozen=True, eq=False)
class NormForm:
    """norm(u) = centre(u) · gain / s(u) + bias (module docstring). `gain`/`bias` (d,) or None
    (1 / 0), a gain (heads, d) for a norm with one row of gains per head (u (..., heads, d));
    `identity` norms have s = 1."""

    centre: bool
    eps: float = 0.0
    gain: Tensor | None = None
    bias: Tensor | None = None
    identity: bool = False

    def centred(self, v: Tensor) -> Tensor:
        """v − mean(v) over the last dim for LayerNorm; v itself otherwise."""
        return v - v.mean(-1, keepdim=True) if self.centre else v

    def inverse_scale(self, u: Tensor) -> Tensor:
        """1 / s(u), shape (..., 1)."""
        if self.identity:
            return torch.ones_like(u[..., :1])
        c = self.centred(u)
        return torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + self.eps)

    def freeze(self, u: Tensor) -> FrozenNorm:
        """The norm with its scale fixed at the actual input `u` (..., d)."""
        return FrozenNorm(self, self.inverse_scale(u))

    def __call__(self, u: Tensor) -> Tensor:
        return self.freeze(u).apply(u) + self.offset(u)

    def vjp(self, u: Tensor, r: Tensor) -> Tensor:
        """The transpose of the norm's Jacobian at `u` (..., d) applied to `r` (..., d), r's
        leading dims broadcasting against u's: ⟨∂norm(u)·v, r⟩ = ⟨v, vjp(u, r)⟩ for every v.
        With c = centre(u) and s = s(u), it is centre(ĝ/s − c·⟨ĝ, c⟩/(d·s³)), ĝ = r·gain."""
        g = r if self.gain is None else r * self.gain.to(r.dtype)
        if self.identity:
            return g
        c = self.centred(u)
        inv = self.inverse_scale(u)
        out = g * inv - c * ((g * c).sum(-1, keepdim=True) * inv.pow(3) / u.shape[-1])
        return self.centred(out)

    def to(self, dtype: torch.dtype) -> NormForm:
        """The same formula with its gain and bias in `dtype`."""

        def cast(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.detach().to(dtype)

        return NormForm(self.centre, self.eps, cast(self.gain), cast(self.bias), self.identity)

    def offset(self, like: Tensor) -> Tensor:
        """The bias b (zeros when None), broadcast to `like`'s dtype/device."""
        if self.bias is None:
            return torch.zeros((), dtype=like.dtype, device=like.device)
        return self.bias.to(like.dtype)


@dataclass(frozen=True, eq=False)
class FrozenNorm:
    """A norm linearised at a state: `apply(v)` = centre(v) · gain · inverse_scale, linear in v
    (so the parts of a sum map to parts summing to norm(u) − bias). `inverse_scale` (..., 1)
    broadcasts over v's leading dims from the right (give v as (..., d) aligned with it)."""

    form: NormForm
    inverse_scale: Tensor

    def apply(self, v: Tensor) -> Tensor:
        out = self.form.centred(v) * self.inverse_scale.to(v.dtype)
        if self.form.gain is not None:
            out = out * self.form.gain.to(v.dtype)
        return out

    def adjoint(self, r: Tensor) -> Tensor:
        """The transpose of `apply`: ⟨apply(v), r⟩ = ⟨v, adjoint(r)⟩ for every v (centring is
        its own transpose). Carries a read-out direction back through the frozen norm."""
        out = r * self.inverse_scale.to(r.dtype)
        if self.form.gain is not None:
            out = out * self.form.gain.to(r.dtype)
        return self.form.centred(out)

    def gain_vector(self, d_model: int, like: Tensor) -> Tensor:
        """The gain as a (d,) tensor (ones when None)."""
        if self.form.gain is None:
            return torch.ones(d_model, dtype=like.dtype, device=like.device)
        return self.form.gain.to(like.device, like.dtype).expand(d_model)  # a scalar gain: `InlineScale`


def norm_form(module: Callable[[Tensor], Tensor] | None) -> NormForm:
    """The formula of a norm module: identity (None or `nn.Identity`), `nn.LayerNorm`,
    `nn.RMSNorm` (with or without an affine weight; `eps=None` is read as the eps torch adds
    then, that of float32 for half-precision modules), or a Hugging Face RMSNorm (`weight` and
    `eps`/`variance_epsilon`; the gain is `weight` or, as in Gemma, `1 + weight`, decided by
    the module's own output). Any norm callable is read the same way (a decoder's norm): its
    output on a probe decides; a centring one with `weight` and `variance_epsilon` is read as
    LayerNorm (Cohere). An `InlineScale` is its inner norm (or the identity) times its factor.
    A 2-D weight (heads, d) is a gain per row, the last dim normalised (Cohere's QK-norm).
    Raises ValueError for a module none of these formulas
    reproduces, or one that normalises over more than the last dim."""
    if module is None or isinstance(module, nn.Identity):
        return NormForm(centre=False, identity=True)
    if isinstance(module, InlineScale):
        return _scaled(norm_form(module.inner), module.factor)
    if isinstance(module, nn.LayerNorm):
        form = NormForm(True, module.eps, _detached(module.weight), _detached(module.bias))
        return _checked(module, [form])
    if isinstance(module, nn.RMSNorm):
        rms_eps = _default_rms_eps(module) if module.eps is None else module.eps
        return _checked(module, [NormForm(False, rms_eps, _detached(module.weight))])
    eps = _eps_of(module)
    weight = getattr(module, "weight", None)
    if eps is None or not isinstance(weight, Tensor):
        raise ValueError(f"cannot read the norm {type(module).__name__}: no weight and eps")
    weight, bias = weight.detach(), _detached(getattr(module, "bias", None))
    candidates = [NormForm(False, eps, weight), NormForm(False, eps, 1.0 + weight)]
    candidates.append(NormForm(True, eps, weight, bias if isinstance(bias, Tensor) else None))  # Cohere
    return _checked(module, candidates)


def _scaled(form: NormForm, factor: float) -> NormForm:
    """`form` followed by a constant factor (`InlineScale`): gain and bias times it."""
    gain = torch.tensor(factor) if form.gain is None else form.gain * factor
    bias = None if form.bias is None else form.bias * factor
    return NormForm(form.centre, form.eps, gain, bias, form.identity)


def _detached(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.detach()


def _eps_of(module: object) -> float | None:
    for name in ("eps", "variance_epsilon"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return None


def _default_rms_eps(module: nn.RMSNorm) -> float:
    """The eps `nn.RMSNorm(eps=None)` adds: that of the type it computes in, float64 for
    float64 inputs and float32 otherwise (half-precision inputs are computed in float32).
    The input's type is taken to be the weight's (float32 without a weight)."""
    dtype = torch.float32 if module.weight is None else module.weight.dtype
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def _probe_like(module: object) -> tuple[tuple[int, ...], Tensor | None]:
    """The shape of one input a norm module normalises, (d,) or for a per-head gain (heads,
    d) (Cohere's QK-norm: the last dim normalised, each row its own gain), and a tensor whose
    device and dtype its input takes (its weight; None for a module without one, whose input
    is float32 on the CPU)."""
    weight = getattr(module, "weight", None)
    shape = getattr(module, "normalized_shape", None)
    if shape is not None and len(shape) != 1:
        raise ValueError(
            f"the norm {type(module).__name__} normalises over {len(shape)} dims; only the last is supported"
        )
    if shape is not None:
        return (int(shape[0]),), weight
    if not isinstance(weight, Tensor):
        raise ValueError(f"cannot read the width of the norm {type(module).__name__}: no weight")
    return tuple(int(n) for n in weight.shape), weight


def _checked(module: Callable[[Tensor], Tensor], candidates: list[NormForm]) -> NormForm:
    """The first candidate formula that reproduces the module on a probe input."""
    shape, like = _probe_like(module)
    device, dtype = (torch.device("cpu"), torch.float32) if like is None else (like.device, like.dtype)
    probe = torch.randn(3, *shape, generator=torch.Generator().manual_seed(0)).to(device, torch.float32)
    with torch.no_grad():
        actual = module(probe.to(dtype)).float()
        for form in candidates:
            ours = form.to(torch.float32)(probe)
            allowed = FORM_TOLERANCE * (actual.abs().max() + 1e-6) + _dtype_slack(dtype)
            if (ours - actual).abs().max() <= allowed:
                return form
    raise ValueError(f"the norm {type(module).__name__} matches neither LayerNorm nor RMSNorm formulas")


def _dtype_slack(dtype: torch.dtype) -> float:
    """Absolute slack for half-precision modules (their output is rounded to 8-11 bits)."""
    return 0.0 if dtype in (torch.float32, torch.float64) else 2e-2


@dataclass(frozen=True, eq=False)
class HeadNorm:
    """A block's QK-norm (`BlockView.q_norm` / `k_norm`) on per-head vectors given heads
    first, (n_heads, ..., d_head), key heads repeated for the query heads that share them (as
    in `AttentionWeights`). `heads` is how many distinct heads the norm sees (query heads, or
    key/value heads); `span` "head": it normalises each head's d_head alone (gain (d_head,),
    or one row per head (heads, d_head): Cohere); "all": the concatenation of the `heads`
    heads (OLMo-2). `joined` lays vectors out as the norm's input, `split` undoes it."""

    form: NormForm
    span: str
    heads: int

    def joined(self, per_head: Tensor) -> Tensor:
        """(n_heads, ..., d_head) -> (..., heads, d_head) ("head") or (..., heads·d_head) ("all")."""
        distinct = per_head[:: per_head.shape[0] // self.heads].movedim(0, -2)
        return distinct.flatten(-2) if self.span == "all" else distinct

    def split(self, joined: Tensor, n_heads: int) -> Tensor:
        """`joined`'s layout back to (n_heads, ..., d_head), key heads repeated."""
        if self.span == "all":
            joined = joined.unflatten(-1, (self.heads, -1))
        return repeat_heads(joined.movedim(-2, 0), n_heads)


def head_norm(block: BlockView, which: str) -> HeadNorm | None:
    """The block's query (`which` "q") or key ("k") norm as a `HeadNorm`; None without one."""
    module = block.q_norm if which == "q" else block.k_norm
    if module is None:
        return None
    n_heads, d_head = int(block.W_O.shape[0]), int(block.W_O.shape[1])
    form = norm_form(module)
    if block.qk_norm_span == "all":
        width = math.prod(_probe_like(module)[0])
        return HeadNorm(form, "all", width // d_head)
    rows = form.gain.shape[0] if form.gain is not None and form.gain.ndim == 2 else n_heads
    return HeadNorm(form, "head", int(rows))


__all__ = ["FORM_TOLERANCE", "FrozenNorm", "HeadNorm", "NormForm", "head_norm", "norm_form"]
