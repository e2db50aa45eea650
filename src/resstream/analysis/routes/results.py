"""What `resstream.routes` and `resstream.routes_corpus` return: frozen, typed results.

`RoutesResult`: the route of one prediction — its kept edges (`RouteEdge`), the nodes they
join with what each state holds (`RouteNode`), and every head's and MLP's flow. `CorpusRoutes`:
over a corpus sample, how often each head and MLP lies on the route of the next-token
prediction, which positions route edges come from, and a per-layer profile, each rate with a
95% interval over sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from resstream.analysis.attribution.decomposition import point_name
from resstream.analysis.names import head_name, source_name, sublayer_name
from resstream.display import Displayable
from resstream.reprs import summary
from resstream.simulation.intervals import Estimate

T = TypeVar("T")


@dataclass(frozen=True)
class RouteEdge:
    """One kept edge: `kind` ("residual", "head" or "mlp"), the block `layer`, the `head`
    (None unless a head), from node (`from_point`, `source`) to node (`to_point`, `target`)
    (positions; a head's source is the position it reads), and its `importance` in the
    target node's sum."""

    kind: str
    layer: int
    head: int | None
    source: int
    target: int
    from_point: int
    to_point: int
    importance: float

    @property
    def label(self) -> str:
        """The edge's term by its component name (`analysis.names`): L3.H5.S7 for head 5 of
        block 3 reading source position 7, L3.mlp for an MLP; "residual" for a residual edge
        (the node's own stream, no component)."""
        if self.kind == "head":
            return source_name(self.layer, int(self.head or 0), self.source)
        return sublayer_name(self.layer, "mlp") if self.kind == "mlp" else "residual"


@dataclass(frozen=True)
class Scored:
    """A name with a score: a token and its probability, or a component and its importance."""

    name: str
    score: float


@dataclass(frozen=True)
class RouteNode:
    """A residual state on the route: residual `point` (0 = L_in_0, 2l+1 = L_res_l,
    2l+2 = L_out_l) at `position`; `lens`: the logit lens's top tokens of the state with their
    probabilities; `top_terms`: the terms of the node's sum with the largest importances
    (heads by source as "L3.H5.S7", the MLP "L3.mlp", the output bias "L3.attn_bias", the
    node's own stream "residual"); `top_neurons`: an
    MLP node's neurons with the largest importance in the MLP's output (empty otherwise)."""

    point: int
    position: int
    lens: tuple[Scored, ...]
    top_terms: tuple[Scored, ...]
    top_neurons: tuple[Scored, ...]

    @property
    def name(self) -> str:
        """The point's name: L_in_0, L_res_3, L_out_3."""
        return point_name(self.point)


@dataclass(frozen=True, eq=False, repr=False)
class RoutesResult(Displayable, renderer="resstream.reporting.routes"):
    """The route of the prediction at `position` of one text (`analysis.routes`).

    `tokens`: the text's tokens as strings; `prediction` / `probability`: the model's top
    next token at the position; `edges`: every kept edge (importance ≥ `threshold`), `nodes`:
    every node they join; `head_flow[l][h]`: the share of the prediction's state that flows
    through head h of block l along all paths (no threshold), `mlp_flow[l]` the same for the
    MLP; `degenerate`: nodes whose terms all had proximity 0 (counted over the whole text).

    `to_pandas()` columns, one row per edge: kind, layer, head (empty unless a head), label,
    source, target (positions), source_token, target_token, from_point, to_point, importance.
    """

    model: str
    family: str
    tokens: tuple[str, ...]
    position: int
    threshold: float
    prediction: str
    probability: float
    n_layers: int
    n_heads: int
    edges: tuple[RouteEdge, ...]
    nodes: tuple[RouteNode, ...]
    head_flow: tuple[tuple[float, ...], ...]
    mlp_flow: tuple[float, ...]
    degenerate: int

    def top_heads(self, count: int = 5) -> list[tuple[str, float]]:
        """The heads with the largest flow, as ("L3.H5", flow), largest first."""
        return _largest_heads(self.head_flow, lambda flow: flow, count)

    def __repr__(self) -> str:
        heads = sum(1 for edge in self.edges if edge.kind == "head")
        top = ", ".join(f"{name} {flow:.2f}" for name, flow in self.top_heads(3))
        return summary(
            self,
            f"{self.model}: route of {self.prediction!r} at position {self.position} "
            f"({self.tokens[self.position]!r}), τ = {self.threshold:g}",
            f"{len(self.nodes)} nodes, {len(self.edges)} edges ({heads} through heads); top head flow: {top}",
        )

    def to_dict(self) -> dict[str, Any]:
        """Every figure (routes.json)."""
        return {
            "model": self.model,
            "family": self.family,
            "tokens": list(self.tokens),
            "position": self.position,
            "threshold": self.threshold,
            "prediction": {"token": self.prediction, "probability": self.probability},
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "nodes": [{**asdict(node), "name": node.name} for node in self.nodes],
            "edges": [{**asdict(edge), "label": edge.label} for edge in self.edges],
            "head_flow": [list(row) for row in self.head_flow],
            "mlp_flow": list(self.mlp_flow),
            "degenerate": self.degenerate,
        }


Rate = Estimate
"""A share over the corpus with its 95% interval over sequences (nan bounds when fewer than
two): an `Estimate` (value, low, high), as every interval of the package is."""


@dataclass(frozen=True, eq=False, repr=False)
class CorpusRoutes(Displayable, renderer="resstream.reporting.routes"):
    """How the routes of next-token predictions run over a corpus sample (`analysis.routes`).

    `head_on_route[l][h]`: the share of predictions whose route passes through head h of
    block l (at least one kept edge of the head into a node on the route); `mlp_on_route[l]`
    the same for the MLP; `attention_on_route[l]`: through any head of block l; `edge_shares`:
    of the head edges on routes, the share from the first token ("first"), from the previous
    position ("previous") and from the query's own position ("same") — they overlap at
    positions 0 and 1; `head_flow[l][h]`: the mean flow through the head (no threshold).
    `positions`: predictions counted; `num_seqs` × `seq_len` the sample.

    `to_pandas()` columns, one row per component: component ("L3.H5" or "L3.mlp"), layer,
    head (empty for an MLP), on_route, low, high, flow.
    """

    model: str
    family: str
    dataset: str
    dataset_fingerprint: str | None
    num_seqs: int
    seq_len: int
    positions: int
    threshold: float
    n_layers: int
    n_heads: int
    head_on_route: tuple[tuple[Rate, ...], ...]
    mlp_on_route: tuple[Rate, ...]
    attention_on_route: tuple[Rate, ...]
    edge_shares: dict[str, Rate]
    head_flow: tuple[tuple[float, ...], ...]
    mlp_flow: tuple[float, ...]

    def top_heads(self, count: int = 5) -> list[tuple[str, Rate]]:
        """The heads most often on the route, as ("L3.H5", rate), most often first."""
        return _largest_heads(self.head_on_route, lambda rate: rate.value, count)

    def __repr__(self) -> str:
        top = ", ".join(f"{name} {rate.value:.0%}" for name, rate in self.top_heads(3))
        shares = ", ".join(f"{name} {rate.value:.0%}" for name, rate in self.edge_shares.items())
        return summary(
            self,
            f"{self.model} on {self.dataset}: routes of {self.positions:,} predictions, "
            f"τ = {self.threshold:g}",
            f"heads most often on the route: {top}; head edges from {shares}",
        )

    def to_dict(self) -> dict[str, Any]:
        """Every figure (routes.json in corpus mode): the fields, each `Rate` as a dict."""
        return asdict(self)


def _largest_heads(
    table: Sequence[Sequence[T]], size: Callable[[T], float], count: int
) -> list[tuple[str, T]]:
    """The `count` entries of a (layer × head) table with the largest `size`, named "L3.H5"."""
    named = [
        (head_name(layer, head), value) for layer, row in enumerate(table) for head, value in enumerate(row)
    ]
    return sorted(named, key=lambda item: -size(item[1]))[:count]


__all__ = ["CorpusRoutes", "Rate", "RouteEdge", "RouteNode", "RoutesResult", "Scored"]
