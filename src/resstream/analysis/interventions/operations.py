"""What an edit does to a component's activation: the operations every edit goes through.

An operation maps a component's activation at some positions to its edited value. It is
called with the activation `x` (..., P, *width) — P positions, the component's own width
last: d_model for a residual state or a block output, d_head for a head's z, nothing for a
single neuron's coefficient — and those positions' indices in the sequence (P,):

=============  ===================================================================
`Replace`      x ← value (broadcast): zero/mean/resample ablation, patching, clamping
`Shift`        x ← x + delta, delta per position: an attention source's change of z_h
`AddVector`    x ← x + coef · vector: activation addition, steering
`ScaleBy`      x ← alpha · x: on a residual state, the identity-path attenuation
`ProjectOut`   x ← x − B^T B x (or only B^T B x, `keep`): directional ablation
`UserFunction` x ← fn(x, positions): anything else
=============  ===================================================================

`change(current, positions)` is what the edit adds to the activation (the write that path
patching and direct effects carry along the stream); `Replace` and `Shift` give theirs
exactly (value − x, delta), the others as edited − x. Every operation computes in the
activation's dtype; `write` puts its result back into the hooked tensor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor


class Operation(Protocol):
    """An edit's operation (module docstring)."""

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor: ...

    def change(self, current: Callable[[], Tensor], positions: Tensor) -> Tensor: ...


class _ByDifference(ABC):
    """`change` as the edited activation minus the current one."""

    @abstractmethod
    def __call__(self, x: Tensor, positions: Tensor) -> Tensor: ...

    def change(self, current: Callable[[], Tensor], positions: Tensor) -> Tensor:
        x = current()
        return self(x, positions) - x


@dataclass(frozen=True, eq=False)
class Replace:
    """x ← `value`, broadcast to x's shape (a value per position, or one for all)."""

    value: Tensor

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.value.to(x.device, x.dtype).expand_as(x)

    def change(self, current: Callable[[], Tensor], positions: Tensor) -> Tensor:
        return self.value - current()


@dataclass(frozen=True, eq=False)
class Shift:
    """x ← x + `delta` (the same shape as x, or broadcast)."""

    delta: Tensor

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.delta.to(x.device, x.dtype)

    def change(self, current: Callable[[], Tensor], positions: Tensor) -> Tensor:
        return self.delta


@dataclass(frozen=True, eq=False)
class AddVector(_ByDifference):
    """x ← x + `coef` · `vector` (vector: the component's width, or a scalar for a neuron)."""

    vector: Tensor
    coef: float = 1.0

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.coef * self.vector.to(x.device, x.dtype)


@dataclass(frozen=True, eq=False)
class ScaleBy(_ByDifference):
    """x ← `alpha` · x."""

    alpha: float

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        return x * self.alpha


@dataclass(frozen=True, eq=False)
class ProjectOut(_ByDifference):
    """x ← x − x B^T B, the part of x outside the span of `basis`'s orthonormal rows (k, width);
    with `keep`, x B^T B, only the part inside it."""

    basis: Tensor
    keep: bool = False

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        basis = self.basis.to(x.device, x.dtype)
        inside = (x @ basis.T) @ basis
        return inside if self.keep else x - inside


@dataclass(frozen=True, eq=False)
class UserFunction(_ByDifference):
    """x ← `fn`(x, positions); the result must have x's shape."""

    fn: Callable[[Tensor, Tensor], Tensor]
    name: str = "fn"

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        out = self.fn(x, positions)
        if not isinstance(out, Tensor) or out.shape != x.shape:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"{self.name} returned {got} for an activation of shape {tuple(x.shape)}")
        return out


def orthonormal(directions: Tensor) -> Tensor:
    """Orthonormal rows (k, width) spanning `directions` (width,) or (k, width), in float64 and
    back to their dtype; ValueError for a zero direction or rows that are not independent."""
    rows = directions.reshape(-1, directions.shape[-1]).double()
    q, r = torch.linalg.qr(rows.T)
    if bool((r.diagonal().abs() <= 1e-12 * rows.norm(dim=1).max().clamp_min(1e-300)).any()):
        raise ValueError("the directions are zero or not linearly independent")
    return q.T.to(directions.dtype)


def write(target: Tensor, index: tuple[Any, ...], operation: Operation, positions: Tensor) -> None:
    """target[index] ← operation(target[index], positions), in place (on a tensor the caller
    owns: a clone of the hooked one)."""
    target[index] = operation(target[index], positions).to(target.dtype)


__all__ = [
    "AddVector",
    "Operation",
    "ProjectOut",
    "Replace",
    "ScaleBy",
    "Shift",
    "UserFunction",
    "orthonormal",
    "write",
]
