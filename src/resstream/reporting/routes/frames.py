"""The long-format frames of `routes`' results: each class's `to_pandas()` and routes.csv
(`routes_frame`, `corpus_frame`), and the tables the page and the notebook views cut from a
result (`flow_frame`, `shares_frame`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resstream.analysis.names import head_name, sublayer_name
from resstream.analysis.routes.results import CorpusRoutes, RoutesResult
from resstream.reporting.notebook import long_frame
from resstream.reporting.routes.common import TABLE_SHOWN

if TYPE_CHECKING:
    import pandas

__all__ = ["CORPUS_COLUMNS", "EDGE_COLUMNS", "corpus_frame", "flow_frame", "routes_frame", "shares_frame"]

#: `RoutesResult.to_pandas()`, one row per edge (routes.csv).
EDGE_COLUMNS = (
    "kind",
    "layer",
    "head",
    "label",
    "source",
    "target",
    "source_token",
    "target_token",
    "from_point",
    "to_point",
    "importance",
)
#: `CorpusRoutes.to_pandas()`, one row per head and MLP (routes.csv in corpus mode).
CORPUS_COLUMNS = ("component", "layer", "head", "on_route", "low", "high", "flow")


def routes_frame(result: RoutesResult) -> pandas.DataFrame:
    """`RoutesResult.to_pandas()` and routes.csv: one row per edge (`EDGE_COLUMNS`)."""
    rows = [
        (
            edge.kind,
            edge.layer,
            edge.head,
            edge.label,
            edge.source,
            edge.target,
            result.tokens[edge.source],
            result.tokens[edge.target],
            edge.from_point,
            edge.to_point,
            edge.importance,
        )
        for edge in result.edges
    ]
    integers = ("layer", "head", "source", "target", "from_point", "to_point")
    return long_frame(EDGE_COLUMNS, rows, integers=integers, floats=("importance",))


def corpus_frame(result: CorpusRoutes) -> pandas.DataFrame:
    """`CorpusRoutes.to_pandas()` and routes.csv in corpus mode: per layer each head, then the
    MLP (`CORPUS_COLUMNS`)."""
    rows: list[tuple[object, ...]] = []
    for layer in range(result.n_layers):
        for head, rate in enumerate(result.head_on_route[layer]):
            flow = result.head_flow[layer][head]
            rows.append((head_name(layer, head), layer, head, rate.value, rate.low, rate.high, flow))
        mlp = result.mlp_on_route[layer]
        rows.append(
            (sublayer_name(layer, "mlp"), layer, None, mlp.value, mlp.low, mlp.high, result.mlp_flow[layer])
        )
    floats = ("on_route", "low", "high", "flow")
    return long_frame(CORPUS_COLUMNS, rows, integers=("layer", "head"), floats=floats)


def flow_frame(result: RoutesResult) -> pandas.DataFrame:
    """The heads and MLPs with the largest flow, largest first."""
    named = [(sublayer_name(layer, "mlp"), flow) for layer, flow in enumerate(result.mlp_flow)]
    named += result.top_heads(len(result.head_flow) * result.n_heads)
    named.sort(key=lambda item: -item[1])
    return long_frame(("component", "flow"), named[:TABLE_SHOWN], floats=("flow",))


def shares_frame(result: CorpusRoutes) -> pandas.DataFrame:
    """Where route head edges read from (`CorpusRoutes.edge_shares`), one row per share."""
    rows = [(name, rate.value, rate.low, rate.high) for name, rate in result.edge_shares.items()]
    return long_frame(("edges from", "share", "low", "high"), rows, floats=("share", "low", "high"))
