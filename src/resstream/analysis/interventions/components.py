"""The names of everything an intervention can act on: one grammar for the command line and JSON.

Every component the decomposition names (`analysis.attribution.decomposition`) has one
0-based spelling:

=============  ==========================================================================
``emb``        the embedding output h_0 (the input of block 0)
``L3.attn``    block 3's attention output as the module returns it (before any post-norm)
``L4.mlp``     block 4's MLP output (before any post-norm)
``L3.H2``      head 2 of block 3: its z_h, its slice of the output projection's input
``L5.N1031``   neuron 1031 of block 5's MLP: its coefficient m_k (mixtures of experts: the
               flat index e·width + j of expert e's neuron j)
``L5.E3``      expert 3 of block 5's mixture of experts: all its neurons' coefficients (its
               router weight included), so it writes what the expert adds for the token
``L3.H2.S7``   head 2 of block 3's contribution from source position 7: α_{t,7}·v_7
``L2.resid@5`` the residual state at the input of block 2 (h_2 in `shift`'s indexing) at
               position 5; ``L{n_layers}.resid@p`` is the final state h_L
=============  ==========================================================================

Receivers of path patching (`paths`) name one input of a later component: ``L5.H3.q``,
``L5.H3.k``, ``L5.H3.v`` (head 3's query, key or value input) and ``L5.mlp`` (the MLP's
input). `parse_component` checks every index against the model and says the valid range.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from resstream.analysis.names import component_name
from resstream.errors import UsageError

ComponentKind = Literal["emb", "attn", "mlp", "head", "neuron", "expert", "source", "resid"]
#: The spellings, for error messages.
GRAMMAR = "emb, L<l>.attn, L<l>.mlp, L<l>.H<h>, L<l>.N<k>, L<l>.E<e>, L<l>.H<h>.S<j>, L<l>.resid@<p>"

_PATTERN = re.compile(
    r"^(?:(?P<emb>emb)"
    r"|L(?P<layer>\d+)\.(?:(?P<sub>attn|mlp)"
    r"|H(?P<head>\d+)(?:\.S(?P<source>\d+))?"
    r"|N(?P<neuron>\d+)"
    r"|E(?P<expert>\d+)"
    r"|resid@(?P<position>\d+)))$"
)


@dataclass(frozen=True, order=True)
class Component:
    """One component (module docstring). `layer` is −1 for the embedding; `index` is the head
    or neuron (−1 where none); `source` the source position of an attention edge and
    `position` the position of a residual state (−1 where none)."""

    layer: int
    kind: ComponentKind
    index: int = -1
    source: int = -1
    position: int = -1

    @property
    def name(self) -> str:
        """The component's spelling in the grammar (module docstring; `analysis.names`)."""
        return component_name(self.layer, self.kind, self.index, self.source, self.position)

    @property
    def start(self) -> int:
        """The first block whose computation the component changes: a run that intervenes on
        it may restart from this block's clean input (the embedding and h_0: block 0)."""
        return max(self.layer, 0)

    @property
    def sublayer(self) -> str:
        """Where the component writes: "embed" (the embedding and residual states), "attn"
        (heads, sources, the attention output) or "mlp" (neurons, the MLP output)."""
        if self.kind in ("emb", "resid"):
            return "embed"
        return "attn" if self.kind in ("attn", "head", "source") else "mlp"

    @property
    def coefficients(self) -> bool:
        """Whether the component is MLP coefficients (a neuron or an expert's neurons)."""
        return self.kind in ("neuron", "expert")

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class ComponentSpace:
    """The valid indices of a model: `n_layers` blocks, `n_heads` heads, `d_ff` neurons per
    MLP (one number, or one per block where they differ: a mixture of experts with dense
    blocks), `seq_len` positions of the text (None: positions are not checked) and
    `n_experts` experts per MLP (0: the model has no mixture of experts)."""

    n_layers: int
    n_heads: int
    d_ff: int | tuple[int, ...]
    seq_len: int | None = None
    n_experts: int = 0

    def neurons_of(self, layer: int) -> int:
        """How many neurons block `layer`'s MLP has."""
        return self.d_ff if isinstance(self.d_ff, int) else self.d_ff[layer]

    def heads(self) -> list[Component]:
        """Every head of every block, layer by layer."""
        return [Component(layer, "head", h) for layer in range(self.n_layers) for h in range(self.n_heads)]

    def sublayers(self) -> list[Component]:
        """Every block's attention and MLP output, layer by layer."""
        return [Component(layer, kind) for layer in range(self.n_layers) for kind in ("attn", "mlp")]

    def neurons(self, layer: int | None = None) -> list[Component]:
        """Every neuron of one block (or of every block)."""
        layers = range(self.n_layers) if layer is None else [layer]
        return [Component(each, "neuron", k) for each in layers for k in range(self.neurons_of(each))]

    def residuals(self, position: int) -> list[Component]:
        """The residual state at `position` at every block input, h_0..h_L."""
        return [Component(layer, "resid", position=position) for layer in range(self.n_layers + 1)]


def parse_component(name: str, space: ComponentSpace) -> Component:
    """The `Component` a name spells, its indices checked against `space`; UsageError naming
    the grammar for a name it does not spell, or the valid range for an index outside it."""
    match = _PATTERN.match(name.strip())
    if match is None:
        raise UsageError(f"`component` {name!r} is not a component name; allowed: {GRAMMAR} (0-based)")
    if match["emb"]:
        return Component(-1, "emb")
    layer = _checked(name, "layer", int(match["layer"]), space.n_layers + (1 if match["position"] else 0))
    if match["sub"]:
        return Component(layer, match["sub"])  # type: ignore[arg-type]
    if match["neuron"] is not None:
        neurons = space.neurons_of(layer)
        return Component(layer, "neuron", _checked(name, "neuron", int(match["neuron"]), neurons))
    if match["expert"] is not None:
        if space.n_experts == 0:
            raise UsageError(f"`component` {name!r}: this model's MLPs have no experts; allowed: {GRAMMAR}")
        return Component(layer, "expert", _checked(name, "expert", int(match["expert"]), space.n_experts))
    if match["position"] is not None:
        return Component(layer, "resid", position=_position(name, int(match["position"]), space))
    head = _checked(name, "head", int(match["head"]), space.n_heads)
    if match["source"] is None:
        return Component(layer, "head", head)
    return Component(layer, "source", head, source=_position(name, int(match["source"]), space))


def parse_components(names: Sequence[str], space: ComponentSpace) -> list[Component]:
    """`parse_component` of every name, a `*` in place of an index standing for every valid
    index there (`L*.H*`: every head, `L*.resid@*`: every residual state); duplicates refused."""
    components = [parse_component(each, space) for name in names for each in expand(name, space)]
    seen: set[Component] = set()
    for component in components:
        if component in seen:
            raise UsageError(f"`component` {component.name} is given twice")
        seen.add(component)
    return components


def expand(name: str, space: ComponentSpace) -> list[str]:
    """The names a pattern with `*` wildcards stands for (module docstring), in index order; a
    name without one is itself."""
    if "*" not in name:
        return [name]
    pieces = re.split(r"(\*)", name.strip())
    choices: list[list[str]] = []
    for i, piece in enumerate(pieces):
        if piece != "*":
            choices.append([piece])
            continue
        field = pieces[i - 1][-1:] if i > 0 else ""
        choices.append([str(v) for v in range(_wildcard_count(name, field, space))])
    return ["".join(parts) for parts in itertools.product(*choices)]


def _wildcard_count(name: str, field: str, space: ComponentSpace) -> int:
    """How many indices a `*` after `field` (L, H, N, S or @) stands for."""
    if field == "L":
        return space.n_layers + (1 if "resid@" in name else 0)
    if field == "H":
        return space.n_heads
    if field == "N":
        return _neuron_count(name, space)
    if field == "E" and space.n_experts:
        return space.n_experts
    if field in ("S", "@") and space.seq_len is not None:
        return space.seq_len
    raise UsageError(
        f"`component` {name!r}: a * cannot stand after {field or 'nothing'!r}; allowed: {GRAMMAR}"
    )


def _neuron_count(name: str, space: ComponentSpace) -> int:
    """How many neurons an `N*` stands for: those of the block the name gives, or of every
    block when they all have as many."""
    layer = re.match(r"^L(\d+)\.", name.strip())
    if layer is not None and int(layer[1]) < space.n_layers:
        return space.neurons_of(int(layer[1]))
    widths = {space.neurons_of(each) for each in range(space.n_layers)}
    if len(widths) > 1:
        raise UsageError(
            f"`component` {name!r}: the blocks' MLPs have {', '.join(map(str, sorted(widths)))} neurons; "
            "name one block (L<l>.N*)"
        )
    return widths.pop()


def _checked(name: str, what: str, value: int, count: int) -> int:
    if not 0 <= value < count:
        raise UsageError(
            f"`component` {name!r}: {what} {value} is out of range; allowed: 0..{count - 1} (0-based)"
        )
    return value


def _position(name: str, value: int, space: ComponentSpace) -> int:
    if space.seq_len is None:
        return value
    return _checked(name, "position", value, space.seq_len)


__all__ = [
    "GRAMMAR",
    "Component",
    "ComponentKind",
    "ComponentSpace",
    "expand",
    "parse_component",
    "parse_components",
]
