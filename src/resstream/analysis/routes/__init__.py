"""Information-flow routes of a prediction (Ferrando & Voita 2024): edge importances by
proximity (`importance`), the graph kept above a threshold and the flow through each head
(`graph`), corpus statistics (`corpus`) and the result types (`results`)."""

from resstream.analysis.routes.corpus import EDGE_CATEGORIES, CorpusTally, SequenceCounts, sequence_counts
from resstream.analysis.routes.graph import (
    DEFAULT_THRESHOLD,
    EDGE_KINDS,
    Edges,
    check_threshold,
    head_traffic,
    mlp_traffic,
    propagate,
    route_edges,
)
from resstream.analysis.routes.importance import (
    DEFAULT_MEMORY_BUDGET,
    FlowImportances,
    attention_terms,
    flow_importances,
    proximity,
)
from resstream.analysis.routes.results import CorpusRoutes, Rate, RouteEdge, RouteNode, RoutesResult, Scored

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_THRESHOLD",
    "EDGE_CATEGORIES",
    "EDGE_KINDS",
    "CorpusRoutes",
    "CorpusTally",
    "Edges",
    "FlowImportances",
    "Rate",
    "RouteEdge",
    "RouteNode",
    "RoutesResult",
    "Scored",
    "SequenceCounts",
    "attention_terms",
    "check_threshold",
    "flow_importances",
    "head_traffic",
    "mlp_traffic",
    "propagate",
    "proximity",
    "route_edges",
    "sequence_counts",
]
