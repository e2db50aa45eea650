"""The lines `resstream routes` prints (`routes_lines`)."""

from __future__ import annotations

import math

from resstream.analysis.names import head_name, sublayer_name
from resstream.analysis.routes.results import CorpusRoutes, Rate, RoutesResult
from resstream.reporting.routes.common import TOP_SHOWN, heads_through, interval_note, mlps_through
from resstream.reporting.text import probability_text, show_token

__all__ = ["routes_lines"]


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0%}"


def _rate_text(rate: Rate) -> str:
    """ "47% [20%, 71%]", the interval left out where it is nan."""
    if math.isnan(rate.low) or math.isnan(rate.high):
        return _percent(rate.value)
    return f"{_percent(rate.value)} [{_percent(rate.low)}, {_percent(rate.high)}]"


def _single_lines(result: RoutesResult) -> list[str]:
    residual = len(result.edges) - heads_through(result) - mlps_through(result)
    heads = ", ".join(f"{name} {flow:.3f}" for name, flow in result.top_heads(TOP_SHOWN))
    mlps = sorted(enumerate(result.mlp_flow), key=lambda item: -item[1])[:TOP_SHOWN]
    lines = [
        f"{result.model}: route of {show_token(result.prediction)!r} "
        f"(p {probability_text(result.probability)}) "
        f"predicted at position {result.position} {show_token(result.tokens[result.position])!r}, "
        f"τ = {result.threshold:g}",
        f"  {len(result.nodes)} nodes, {len(result.edges)} edges: {residual} residual, "
        f"{heads_through(result)} through heads, {mlps_through(result)} through MLPs",
        f"  heads with the largest flow: {heads}",
        "  MLPs with the largest flow: "
        + ", ".join(f"{sublayer_name(layer, 'mlp')} {flow:.3f}" for layer, flow in mlps),
    ]
    strongest = sorted((e for e in result.edges if e.kind == "head"), key=lambda e: -e.importance)[:TOP_SHOWN]
    if strongest:
        shown = ", ".join(
            f"{e.label} {show_token(result.tokens[e.source])!r}→{show_token(result.tokens[e.target])!r} "
            f"{e.importance:.3f}"
            for e in strongest
        )
        lines.append(f"  strongest head edges: {shown}")
    if result.degenerate:
        lines.append(f"  {result.degenerate} degenerate nodes (every term had proximity 0)")
    return lines


def _corpus_lines(result: CorpusRoutes) -> list[str]:
    heads = ", ".join(f"{name} {_rate_text(rate)}" for name, rate in result.top_heads(TOP_SHOWN))
    named = [
        (head_name(layer, head), flow)
        for layer, row in enumerate(result.head_flow)
        for head, flow in enumerate(row)
    ]
    flows = ", ".join(
        f"{name} {flow:.3f}" for name, flow in sorted(named, key=lambda item: -item[1])[:TOP_SHOWN]
    )
    shares = ", ".join(f"{name} {_rate_text(rate)}" for name, rate in result.edge_shares.items())
    profile = " ".join(
        f"L{layer} {_percent(attention.value)}/{_percent(mlp.value)}"
        for layer, (attention, mlp) in enumerate(
            zip(result.attention_on_route, result.mlp_on_route, strict=True)
        )
    )
    return [
        f"{result.model} on {result.dataset}: routes of {result.positions:,} next-token predictions "
        f"({result.num_seqs} × {result.seq_len} tokens), τ = {result.threshold:g}; {interval_note(result)}",
        f"  heads most often on the route: {heads}",
        f"  heads with the largest mean flow: {flows}",
        f"  on the route per layer (attention/MLP): {profile}",
        f"  route head edges read from: {shares} (they overlap at positions 0 and 1)",
    ]


def routes_lines(result: RoutesResult | CorpusRoutes) -> list[str]:
    """The command's lines: for one prediction what it is, the route's size, the heads and MLPs
    with the largest flow and the strongest head edges; for a corpus the heads most often on the
    route and with the largest flow, the per-layer rates and where route head edges read from."""
    return _corpus_lines(result) if isinstance(result, CorpusRoutes) else _single_lines(result)
