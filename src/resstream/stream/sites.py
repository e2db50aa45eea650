"""The names `trace` reads and `edited` edits: the component grammar, opened to every position.

=================  =====================================================================
``emb``            h_0, the embedding output (the input of block 0)
``L6.resid``       h_6, the residual state at the input of block 6 (``L{n_layers}.resid``:
                   the final state h_L, before the final norm)
``L4.attn``        block 4's attention output as the module returns it (before any post-norm)
``L4.mlp``         block 4's MLP output (before any post-norm)
``L3.H2``          head 2 of block 3: its z (d_head), the output projection's input slice
``L3.H*``          every head of block 3: z (heads, d_head)
``L5.N1031``       neuron 1031 of block 5: its coefficient m_k (a number per position)
``L5.N*``          every neuron of block 5: m (d_ff)
``L5.E3``          expert 3 of block 5: its neurons' coefficients (mixtures of experts)
``L3.H2.pattern``  head 2's attention probabilities (query, key); ``L3.H*.pattern`` every
                   head's (heads, query, key) — read only
``logits``         the model's own output logits (vocab) — read only
=================  =====================================================================

Every name takes ``@p`` for one position (``L6.resid@5``); without it, every position.
``L*.`` stands for every layer (one name per layer: ``L*.resid`` is h_0..h_L). Indices are
0-based and checked against the model, with the valid range in the message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from resstream.analysis.interventions.components import Component, ComponentSpace, parse_component
from resstream.errors import UsageError
from resstream.models.adapters.base import ModelView

#: The spellings, for error messages.
SITE_GRAMMAR = (
    "emb, L<l>.resid, L<l>.attn, L<l>.mlp, L<l>.H<h>, L<l>.H*, L<l>.N<k>, L<l>.N*, L<l>.E<e>, "
    "L<l>.H<h>.pattern, logits; each with an optional @<position>; L*. for every layer"
)

SiteKind = Literal["activation", "pattern", "logits"]

_WHOLE = re.compile(r"^L(?P<layer>\d+)\.(?P<what>resid|H\*|N\*)$")


@dataclass(frozen=True)
class Site:
    """One named activation: `name` as the grammar spells it; `kind` "activation" (of
    `component`), "pattern" (of `component`, a head or every head of a block: index −1) or
    "logits" (no component); `position` the one position asked with ``@p`` (None: all).
    A component whose index is −1 is the whole block of heads (z) or neurons (m); a residual
    state's `layer` is the index l of h_l."""

    name: str
    kind: SiteKind
    component: Component | None = None
    position: int | None = None

    @property
    def writable(self) -> bool:
        """Whether an edit may act on the site (patterns and logits are read only)."""
        return self.kind == "activation"


def space_of(view: ModelView) -> ComponentSpace:
    """The valid indices of a model, positions unchecked (a stream has no fixed length)."""
    d_ff = tuple(block.d_ff for block in view.blocks)
    experts = next((b.experts.n_experts for b in view.blocks if b.experts is not None), 0)
    return ComponentSpace(view.n_layers, view.n_heads, d_ff, None, experts)


def parse_sites(names: str | list[str] | tuple[str, ...], space: ComponentSpace) -> list[Site]:
    """Every site the names spell (``L*.`` expanded), in order; UsageError for a name the
    grammar does not spell, an index out of range, or a name given twice."""
    listed = [names] if isinstance(names, str) else list(names)
    if not listed:
        raise UsageError(f"`names` is empty; allowed: {SITE_GRAMMAR}")
    sites = [parse_site(each, space) for name in listed for each in _layers(name, space)]
    seen: set[str] = set()
    for site in sites:
        if site.name in seen:
            raise UsageError(f"`names`: {site.name} is given twice")
        seen.add(site.name)
    return sites


def _layers(name: str, space: ComponentSpace) -> list[str]:
    """A name with ``L*.`` as one name per layer (h_0..h_L for a residual state)."""
    if not isinstance(name, str):
        raise UsageError(f"`names`: {name!r} is not a name; allowed: {SITE_GRAMMAR}")
    name = name.strip()
    if not name.startswith("L*."):
        return [name]
    rest = name[3:]
    count = space.n_layers + (1 if rest.split("@")[0] == "resid" else 0)
    return [f"L{layer}.{rest}" for layer in range(count)]


def parse_site(name: str, space: ComponentSpace) -> Site:
    """The `Site` one name spells (module docstring), its indices checked against `space`."""
    base, position = _position(name)
    if base == "logits":
        return Site(name, "logits", position=position)
    if base.endswith(".pattern"):
        head = _component(base[: -len(".pattern")], space, name)
        if head.kind != "head":
            raise UsageError(
                f"`names`: {name!r}: a pattern is a head's (L<l>.H<h>.pattern or L<l>.H*.pattern)"
            )
        return Site(name, "pattern", head, position)
    return Site(name, "activation", _component(base, space, name), position)


def _position(name: str) -> tuple[str, int | None]:
    if "@" not in name:
        return name, None
    base, at = name.rsplit("@", 1)
    if not at.isdigit():
        raise UsageError(f"`names`: {name!r}: the position after @ must be a number (0-based)")
    return base, int(at)


def _component(base: str, space: ComponentSpace, name: str) -> Component:
    """The component of a name without its position: the grammar of `components`, plus a
    whole residual state, every head and every neuron of a block."""
    whole = _WHOLE.match(base)
    try:
        if whole is None:
            component = parse_component(base, space)
            if component.kind == "source":
                raise UsageError(
                    f"`names`: {name!r}: an attention source is read and edited by `resstream patch`, "
                    f"not here; allowed: {SITE_GRAMMAR}"
                )
            return component
        layer, what = int(whole["layer"]), whole["what"]
        count = space.n_layers + (1 if what == "resid" else 0)
        if not 0 <= layer < count:
            raise UsageError(
                f"`names` {name!r}: layer {layer} is out of range; allowed: 0..{count - 1} (0-based)"
            )
        return Component(layer, {"resid": "resid", "H*": "head", "N*": "neuron"}[what])  # type: ignore[arg-type]
    except UsageError as error:
        message = str(error)
        if message.startswith("`names`"):
            raise
        if "is not a component name" in message:
            raise UsageError(f"`names`: {name!r} is not a site name; allowed: {SITE_GRAMMAR}") from None
        raise UsageError(
            message.replace("`component`", "`names`", 1).replace(repr(base), repr(name), 1)
        ) from None


__all__ = ["SITE_GRAMMAR", "Site", "SiteKind", "parse_site", "parse_sites", "space_of"]
