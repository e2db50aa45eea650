"""`attribute`'s terminal summary: a few lines with the prediction (or the corpus), which score
leads (DLA by default, C with `rank_by="c"`) and where its faithfulness is measured, the
sub-layers, heads and neurons with the largest |score| (the other score beside each; a
corpus's means with their 95% intervals), any notes and the check residuals."""

from __future__ import annotations

import math
from collections.abc import Sequence

from resstream.analysis.attribution.results import (
    SCORE_NAMES,
    AttributeResult,
    AttributionCheck,
    CorpusAttribution,
    other_ranking,
    ranked_score,
)
from resstream.analysis.names import head_name, sublayer_name
from resstream.reporting.attribute.captions import ranking_line
from resstream.reporting.attribute.common import Result, residual_text, score_value
from resstream.reporting.text import probability_text, show_token
from resstream.simulation.intervals import Estimate

__all__ = ["terminal_summary"]

TOP = 5  # entries per line of the terminal summary
#: One listed entry: its name, the leading score and the score shown beside it.
Entry = tuple[str, float | Estimate, float | Estimate]


def _signed(score: float | Estimate) -> str:
    """+0.123, or for an Estimate +0.123 [+0.1, +0.15] (no brackets for a nan interval)."""
    text = f"{score_value(score):+.3g}"
    if isinstance(score, Estimate) and not (math.isnan(score.low) or math.isnan(score.high)):
        text += f" [{score.low:+.3g}, {score.high:+.3g}]"
    return text


def _ranked(entries: Sequence[Entry]) -> list[Entry]:
    """The TOP entries with the largest |leading score| (ties in list order)."""
    return sorted(entries, key=lambda entry: -abs(score_value(entry[1])))[:TOP]


def _entry_text(entry: Entry, result: Result) -> str:
    """ "L0.mlp +1.2 (C +3.4)": the name, the leading score, the other one's value beside it."""
    name, lead, beside = entry
    other = score_value(beside)
    if math.isnan(other):  # not computed (`contributions=False`)
        return f"{name} {_signed(lead)}"
    return f"{name} {_signed(lead)} ({SCORE_NAMES[other_ranking(result.rank_by)]} {other:+.3g})"


def _largest(entries: Sequence[Entry], result: Result) -> str:
    return ", ".join(_entry_text(entry, result) for entry in _ranked(entries)) or "none"


def _entry(name: str, record: object, result: Result, prefix: str = "") -> Entry:
    """`record`'s leading score and the other one, under `name`."""
    rank = result.rank_by
    return (name, ranked_score(record, rank, prefix), ranked_score(record, other_ranking(rank), prefix))


def _sub_layers(result: Result) -> list[Entry]:
    return [
        _entry(sublayer_name(layer.layer, part), layer, result, f"{part}_")
        for layer in result.layers
        for part in ("attn", "mlp")
    ]


def _neuron_lines(result: Result) -> list[str]:
    """The TOP neurons by the leading score, one line each with their first three promoted tokens."""
    promoted = {n.name: " ".join(show_token(t) for t in n.promoted[:3]) for n in result.neurons}
    ranked = _ranked([_entry(n.name, n, result) for n in result.neurons])
    return [f"  {_entry_text(entry, result)} → {promoted[entry[0]]}" for entry in ranked]


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
    """A few lines for the terminal: the prediction (or the corpus), the ranking line, the 5
    sub-layers (attention or MLP of a block) and heads with the largest |DLA| (|C| with
    `rank_by="c"`) with the other score beside each, then the 5 neurons so ranked one per
    line with their top promoted tokens, any notes and the check."""
    if isinstance(result, CorpusAttribution):
        lines = [_corpus_line(result)]
    else:
        lines = [_head_line(result)]
        if result.foil is not None:
            difference = (
                "" if result.logit_difference is None else f": logit difference {result.logit_difference:.4g}"
            )
            lines.append(f"foil {show_token(result.foil)!r} (id {result.foil_id}){difference}")
    by = f"by |{SCORE_NAMES[result.rank_by]}|"
    lines.append(ranking_line(result))
    lines.append(f"top layers {by}: {_largest(_sub_layers(result), result)}")
    heads = [_entry(head_name(h.layer, h.head), h, result) for h in result.heads]
    lines.append(f"top heads {by}: {_largest(heads, result)}")
    neurons = _neuron_lines(result)
    lines.append(f"top neurons {by} (→ promoted tokens):" + ("" if neurons else " none"))
    lines += neurons
    lines += [f"note: {note}" for note in result.notes]
    lines.append(_check_line(result.check))
    return lines
