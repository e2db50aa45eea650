"""`attribute`'s terminal summary: a few lines with the prediction (or the corpus), the
sub-layers, heads and neurons with the largest |C| (a corpus's means with their 95%
intervals), any notes and the check residuals."""

from __future__ import annotations

import math
from collections.abc import Sequence

from resstream.analysis.attribution.results import AttributeResult, AttributionCheck, CorpusAttribution
from resstream.reporting.attribute.common import Result, residual_text, score_value
from resstream.reporting.text import probability_text, show_token
from resstream.simulation.intervals import Estimate

__all__ = ["terminal_summary"]

TOP = 5  # entries per line of the terminal summary


def _signed(score: float | Estimate) -> str:
    """+0.123, or for an Estimate +0.123 [+0.1, +0.15] (no brackets for a nan interval)."""
    text = f"{score_value(score):+.3g}"
    if isinstance(score, Estimate) and not (math.isnan(score.low) or math.isnan(score.high)):
        text += f" [{score.low:+.3g}, {score.high:+.3g}]"
    return text


def _largest(entries: Sequence[tuple[str, float | Estimate]]) -> str:
    """The TOP entries with the largest |score|, as "name +0.12, ..." (ties in list order)."""
    ranked = sorted(entries, key=lambda entry: -abs(score_value(entry[1])))[:TOP]
    return ", ".join(f"{name} {_signed(score)}" for name, score in ranked) or "none"


def _sub_layers(result: Result) -> list[tuple[str, float | Estimate]]:
    entries: list[tuple[str, float | Estimate]] = []
    for entry in result.layers:
        entries += [
            (f"L{entry.layer} attn", entry.attn_contribution),
            (f"L{entry.layer} MLP", entry.mlp_contribution),
        ]
    return entries


def _neuron_entries(result: Result) -> list[tuple[str, float | Estimate, str]]:
    """The TOP neurons by |C|: name, C and their first three promoted tokens."""
    entries = []
    for n in result.neurons:
        promoted = " ".join(show_token(t) for t in n.promoted[:3])
        entries.append((n.name, n.contribution, promoted))
    return sorted(entries, key=lambda entry: -abs(score_value(entry[1])))[:TOP]


def _check_line(check: AttributionCheck) -> str:
    return (
        f"check: decomposition max |Σ − h| {residual_text(check.decomposition_max_abs)} "
        f"(relative {residual_text(check.decomposition_relative)}), "
        f"DLA residual {residual_text(check.dla_residual)}"
    )


def _head_line(result: AttributeResult) -> str:
    after = show_token(result.tokens[result.position])
    return (
        f"{result.model}: target {show_token(result.target)!r} (id {result.target_id}) after position "
        f"{result.position} {after!r}: p {probability_text(result.probability)}, "
        f"log p {result.logprob:.3g}, logit {result.logit:.4g}, rank {result.rank}"
    )


def _corpus_line(result: CorpusAttribution) -> str:
    sequences = f"{result.num_seqs} sequence{'s' if result.num_seqs != 1 else ''}"
    how = "mean over sequences, 95% interval" if result.num_seqs >= 2 else "no interval: 1 sequence"
    return (
        f"{result.model} on {result.dataset}: {sequences} × {result.seq_len} tokens, "
        f"{result.positions:,} positions ({how})"
    )


def terminal_summary(result: Result) -> list[str]:
    """A few lines for the terminal: the prediction (or the corpus), the 5 sub-layers
    (attention or MLP of a block) and heads with the largest |C|, then the 5 neurons with the
    largest |C| one per line with their top promoted tokens, any notes and the check."""
    if isinstance(result, CorpusAttribution):
        lines = [_corpus_line(result)]
    else:
        lines = [_head_line(result)]
        if result.foil is not None:
            difference = (
                "" if result.logit_difference is None else f": logit difference {result.logit_difference:.4g}"
            )
            lines.append(f"foil {show_token(result.foil)!r} (id {result.foil_id}){difference}")
    lines.append(f"top layers by |C|: {_largest(_sub_layers(result))}")
    heads = [(f"L{h.layer}.H{h.head}", h.contribution) for h in result.heads]
    lines.append(f"top heads by |C|: {_largest(heads)}")
    neurons = _neuron_entries(result)
    lines.append("top neurons by |C| (→ promoted tokens):" + ("" if neurons else " none"))
    lines += [f"  {name} {_signed(score)} → {promoted}" for name, score, promoted in neurons]
    lines += [f"note: {note}" for note in result.notes]
    lines.append(_check_line(result.check))
    return lines
