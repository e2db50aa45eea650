"""Edits as the user writes them: an operation on a named site, at chosen positions.

=====================================  ===============================================
``Set(name, value)``                   the activation ← value (a number, or a tensor of
                                       the site's width)
``Add(name, vector, coef=1.0)``        activation ← activation + coef · vector
``Scale(name, alpha)``                 activation ← alpha · activation; on a residual
                                       state ``L{l}.resid`` (l ≥ 1) that is the
                                       identity-path attenuation x_{l} = α·x_{l−1}' …
                                       of a trained model, read at block l's input
``Project(name, direction, keep=False)``  remove the component along a direction (width,)
                                       or a subspace (k, width); `keep`: only it
``Clamp(name, value)``                 a neuron's coefficient (or every neuron of
                                       ``L5.N*``, an expert's) ← value
``Apply(name, fn)``                    activation ← fn(activation, positions), the user's
                                       own function
=====================================  ===============================================

`name` is a site of `sites` (``L6.resid``, ``L3.H2``, ``L5.N1031``, ``L4.mlp``; ``@p`` for
one position); `positions` (None: every position; an int or a sequence of ints, 0-based
positions of the sequence the model runs — with a KV cache, the positions of the whole
sequence so far) cannot be given beside an ``@p``. The activation has the site's width last
(`sites` docstring); vectors and values broadcast over the batch and the positions.
`resolve(edits, view)` checks every edit against a model and gives the engine's operations;
every bad input is a one-line UsageError naming the edit.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.operations import (
    AddVector,
    Operation,
    ProjectOut,
    Replace,
    ScaleBy,
    UserFunction,
    orthonormal,
)
from resstream.errors import UsageError
from resstream.models.adapters.base import ModelView
from resstream.stream.sites import Site, parse_site, space_of

#: Positions as the user gives them: None (all), one, or several.
Positions = int | Sequence[int] | None


@dataclass(frozen=True, eq=False)
class StreamEdit(ABC):
    """What every edit has: the site's `name` and the `positions` it acts at."""

    name: str

    @abstractmethod
    def operation(self, site: Site, width: tuple[int, ...]) -> Operation:
        """The engine's operation for an activation of trailing shape `width`, every input
        checked (UsageError naming the edit)."""

    def label(self) -> str:
        """How messages name the edit: ``Add('L6.resid')``."""
        return f"{type(self).__name__}({self.name!r})"

    def _tensor(self, value: Any, what: str) -> Tensor:
        """`value` as a finite float tensor; UsageError otherwise."""
        try:
            tensor = torch.as_tensor(value).detach()
        except (TypeError, ValueError, RuntimeError):
            raise UsageError(
                f"{self.label()}: `{what}` is a {type(value).__name__}, not a number or tensor"
            ) from None
        if not (tensor.is_floating_point() or tensor.dtype in (torch.int32, torch.int64)):
            raise UsageError(f"{self.label()}: `{what}` has dtype {tensor.dtype}; allowed: a float tensor")
        tensor = tensor.double() if not tensor.is_floating_point() else tensor
        if not bool(torch.isfinite(tensor).all()):
            raise UsageError(f"{self.label()}: `{what}` is not finite; allowed: finite numbers")
        return tensor

    def _number(self, value: Any, what: str) -> float:
        """`value` as a finite float; UsageError otherwise."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"{self.label()}: `{what}` {value!r} is not a number") from None
        if not math.isfinite(number):
            raise UsageError(f"{self.label()}: `{what}` {value!r} is not finite; allowed: a finite number")
        return number

    def _shaped(self, value: Any, what: str, width: tuple[int, ...], *, scalar: bool) -> Tensor:
        """A tensor of the site's width (or a number where `scalar`), checked."""
        tensor = self._tensor(value, what)
        if scalar and tensor.ndim == 0:
            return tensor
        allowed = _widths(width)
        if tuple(tensor.shape) not in allowed:
            shapes = " or ".join(str(shape) for shape in allowed)
            raise UsageError(
                f"{self.label()}: `{what}` has shape {tuple(tensor.shape)}; allowed: {shapes} "
                f"(the width of {self.name.split('@')[0]}){' or a number' if scalar else ''}"
            )
        return tensor


def _widths(width: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The shapes a vector for an activation of trailing shape `width` may have: the width,
    or its last dimension (the same vector for every head of ``L3.H*``)."""
    return [width] if len(width) < 2 else [width, width[-1:]]


@dataclass(frozen=True, eq=False)
class Set(StreamEdit):
    """The activation ← `value` (a number, or a tensor of the site's width)."""

    value: Any = 0.0
    positions: Positions = None

    def operation(self, site: Site, width: tuple[int, ...]) -> Operation:
        """`Replace` by the value, checked against the site's width."""
        return Replace(self._shaped(self.value, "value", width, scalar=True))


@dataclass(frozen=True, eq=False)
class Add(StreamEdit):
    """activation ← activation + `coef` · `vector` (steering, activation addition)."""

    vector: Any = None
    coef: float = 1.0
    positions: Positions = None

    def operation(self, site: Site, width: tuple[int, ...]) -> Operation:
        """`AddVector` of coef · vector, both checked (a vector of the site's width, a finite coef)."""
        if self.vector is None:
            raise UsageError(f"{self.label()}: give the `vector` to add")
        vector = self._shaped(self.vector, "vector", width, scalar=width == ())
        return AddVector(vector, self._number(self.coef, "coef"))


@dataclass(frozen=True, eq=False)
class Scale(StreamEdit):
    """activation ← `alpha` · activation."""

    alpha: float = 1.0
    positions: Positions = None

    def operation(self, site: Site, width: tuple[int, ...]) -> Operation:
        """`ScaleBy` α (a finite number); on a residual state `stream.hooks` makes it the
        identity-path attenuation."""
        return ScaleBy(self._number(self.alpha, "alpha"))


@dataclass(frozen=True, eq=False)
class Project(StreamEdit):
    """Remove the activation's component along `direction` (width,) or a subspace (k, width)
    (directional ablation); with `keep`, keep only that component."""

    direction: Any = None
    keep: bool = False
    positions: Positions = None

    def operation(self, site: Site, width: tuple[int, ...]) -> Operation:
        """`ProjectOut` of the orthonormal basis of the direction(s), checked against the site's width."""
        if width == ():
            raise UsageError(
                f"{self.label()}: a single neuron's coefficient has no direction; use Set or Clamp"
            )
        if self.direction is None:
            raise UsageError(f"{self.label()}: give the `direction` to project on")
        direction = self._tensor(self.direction, "direction")
        rows = direction if direction.ndim == 2 else direction.unsqueeze(0)
        if direction.ndim not in (1, 2) or rows.shape[-1] != width[-1]:
            raise UsageError(
                f"{self.label()}: `direction` has shape {tuple(direction.shape)}; allowed: "
                f"({width[-1]},) or (k, {width[-1]}) (the width of {self.name.split('@')[0]})"
            )
        try:
            basis = orthonormal(rows.double())
        except ValueError as error:
            raise UsageError(f"{self.label()}: `direction`: {error}") from None
        return ProjectOut(basis, bool(self.keep))


@dataclass(frozen=True, eq=False)
class Clamp(StreamEdit):
    """A neuron's coefficient (every neuron of ``L5.N*``, an expert's neurons) ← `value`."""

    value: float = 0.0
    positions: Positions = None

    def operation(self, site: Site, width: tuple[int, ...]) -> Operation:
        """`Replace` of a neuron's coefficient(s) by the value; refused on a site that is not neurons."""
        if site.component is None or site.component.kind not in ("neuron", "expert"):
            raise UsageError(
                f"{self.label()}: Clamp acts on neurons (L<l>.N<k>, L<l>.N*, L<l>.E<e>); use Set"
            )
        return Replace(torch.tensor(self._number(self.value, "value"), dtype=torch.float64))


@dataclass(frozen=True, eq=False)
class Apply(StreamEdit):
    """activation ← `fn`(activation, positions): the user's own function, returning a tensor
    of the activation's shape ((batch, P, *width); positions (P,) 0-based)."""

    fn: Callable[[Tensor, Tensor], Tensor] | None = None
    positions: Positions = None

    def operation(self, site: Site, width: tuple[int, ...]) -> Operation:
        """`UserFunction` of `fn` (its result's shape is checked at every forward)."""
        if not callable(self.fn):
            raise UsageError(f"{self.label()}: `fn` must be a function of (activation, positions)")
        return UserFunction(self.fn, name=f"{self.label()}'s fn")


@dataclass(frozen=True, eq=False)
class Resolved:
    """An edit checked against a model: its `site`, the `positions` it acts at (None: all)
    and the engine's `operation`."""

    edit: StreamEdit
    site: Site
    positions: tuple[int, ...] | None
    operation: Operation

    @property
    def component(self) -> Component:
        """The component the edit acts on (every writable site has one)."""
        assert self.site.component is not None
        return self.site.component


def resolve(edits: StreamEdit | Sequence[StreamEdit], view: ModelView) -> list[Resolved]:
    """Every edit checked against the model (`view`): its name, positions and values
    (module docstring); UsageError naming the first bad one."""
    listed = [edits] if isinstance(edits, StreamEdit) else list(edits)
    space = space_of(view)
    resolved = []
    for edit in listed:
        if not isinstance(edit, StreamEdit):
            raise UsageError(
                f"`edits`: {type(edit).__name__} is not an edit; "
                "allowed: Set, Add, Scale, Project, Clamp, Apply"
            )
        site = _site(edit, space)
        positions = _positions(edit, site)
        resolved.append(Resolved(edit, site, positions, edit.operation(site, site_width(view, site))))
    return resolved


def _site(edit: StreamEdit, space: Any) -> Site:
    try:
        site = parse_site(edit.name, space)
    except UsageError as error:
        raise UsageError(f"{edit.label()}: {error}".replace("`names`", "`name`")) from None
    if not site.writable:
        raise UsageError(
            f"{edit.label()}: {site.name} is read only (trace reads it); edits act on activations"
        )
    return site


def _positions(edit: StreamEdit, site: Site) -> tuple[int, ...] | None:
    given: Positions = getattr(edit, "positions", None)
    if given is not None and site.position is not None:
        raise UsageError(f"{edit.label()}: give the position by @ or by `positions`, not both")
    if site.position is not None:
        return (site.position,)
    if given is None:
        return None
    listed = [given] if isinstance(given, int) else list(given)
    if not listed or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in listed):
        raise UsageError(
            f"{edit.label()}: `positions` {given!r}; allowed: None, or 0-based positions (ints >= 0)"
        )
    return tuple(sorted(set(listed)))


def site_width(view: ModelView, site: Site) -> tuple[int, ...]:
    """The trailing shape of a site's activation (`sites` docstring)."""
    component = site.component
    if site.kind == "logits" or component is None:
        return (int(view.W_U.shape[0]),)
    block = view.blocks[max(component.layer, 0)] if component.kind not in ("emb", "resid") else None
    if component.kind == "head":
        d_head = view.d_head
        return (d_head,) if component.index >= 0 else (view.n_heads, d_head)
    if component.kind == "neuron":
        return () if component.index >= 0 else (block.d_ff,) if block is not None else ()
    if component.kind == "expert" and block is not None and block.experts is not None:
        return (block.experts.width,)
    return (view.d_model,)


__all__ = [
    "Add",
    "Apply",
    "Clamp",
    "Positions",
    "Project",
    "Resolved",
    "Scale",
    "Set",
    "StreamEdit",
    "resolve",
    "site_width",
]
