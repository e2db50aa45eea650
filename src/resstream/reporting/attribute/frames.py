"""`attribute`'s results as long-format DataFrames: `to_pandas()` and every CSV.

One text (`attribute_frame`, columns `ATTRIBUTE_COLUMNS`): one row per scored component —
the embedding, each block's attention and MLP, each head, source and neuron, the final bias
term — with its C and DLA. A corpus (`corpus_attribution_frame`, columns
`CORPUS_ATTRIBUTION_COLUMNS`): one row per component and metric (C or DLA) with its mean and
95% interval. Both are documented by their result classes.

layers.csv, heads.csv, sources.csv and neurons.csv are the rows of one `level` of that frame
with the columns that level uses (`SINGLE_LEVELS`, `CORPUS_LEVELS`). The lists that are not
components have a frame each, written the same way: trajectory.csv and tuned_trajectory.csv
(`trajectory_frame`), query_contributions.csv (`query_frame`, one row per share),
linearity.csv (`linearity_frame`), and for the families that have them experts.csv (every
routed expert of a mixture of experts, `experts_frame`) and sinks.csv (each head's attention
sink share, `sinks_frame`). `attribute_frames` gives every CSV's frame in the order of
the files; every CSV is `frame_csv` of its frame.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resstream.analysis.attribution.results import (
    ATTRIBUTE_COLUMNS,
    CORPUS_ATTRIBUTION_COLUMNS,
    AttributeResult,
    CorpusAttribution,
    ExpertAttribution,
    HeadAttribution,
    LinearityCheck,
    QueryShare,
    TrajectoryPoint,
)
from resstream.reporting.attribute.common import Result
from resstream.reporting.notebook import long_frame
from resstream.simulation.intervals import Estimate

if TYPE_CHECKING:
    import pandas

__all__ = [
    "CORPUS_LEVELS",
    "EXPERT_COLUMNS",
    "LINEARITY_COLUMNS",
    "QUERY_COLUMNS",
    "SINGLE_LEVELS",
    "SINK_COLUMNS",
    "TRAJECTORY_COLUMNS",
    "Level",
    "attribute_frame",
    "attribute_frames",
    "corpus_attribution_frame",
    "experts_frame",
    "level_frame",
    "linearity_frame",
    "promoted_text",
    "query_frame",
    "sinks_frame",
    "trajectory_frame",
]

#: The columns of trajectory.csv and tuned_trajectory.csv: one row per residual point.
TRAJECTORY_COLUMNS = ("point", "layer", "stage", "probability", "rank", "logprob")
#: The columns of query_contributions.csv: the neuron's, then one share's.
QUERY_COLUMNS = (
    "layer",
    "neuron",
    "projection",
    "preactivation",
    "constant",
    "residual",
    "component",
    "component_layer",
    "kind",
    "share",
)
#: The columns of linearity.csv: one row per n.
LINEARITY_COLUMNS = ("count", "cumulative", "summed")
#: The columns of experts.csv: one row per routed expert of each mixture-of-experts block.
EXPERT_COLUMNS = ("layer", "expert", "weight", "C", "DLA")
#: The columns of sinks.csv: one row per head of a model with attention sinks.
SINK_COLUMNS = ("layer", "head", "sink_share")

#: Columns of whole numbers, missing where they do not apply (pandas' nullable Int64, so a
#: layer reads 3, not 3.0, and a missing one is empty in the CSV).
_INTEGERS = ("layer", "head", "neuron", "source", "component_layer", "expert")
#: Columns of numbers, missing where they do not apply.
_FLOATS: tuple[str, ...] = ("C", "DLA", "bias_DLA", "coefficient", "value", "ci_low", "ci_high")
_FLOATS += ("mean_coefficient", "weight", "sink_share")


@dataclass(frozen=True)
class Level:
    """One CSV cut from a result's frame: its rows of `level`, the `columns` that level uses;
    `name` is the file stem (layers → layers.csv)."""

    name: str
    level: str
    columns: tuple[str, ...]


#: The CSVs of one text cut from `attribute_frame`, in the order of the files.
SINGLE_LEVELS = (
    Level("layers", "layer", ("layer", "part", "C", "DLA", "bias_DLA")),
    Level("heads", "head", ("layer", "head", "C", "DLA")),
    Level("sources", "source", ("layer", "head", "source", "source_token", "C", "DLA")),
    Level("neurons", "neuron", ("layer", "neuron", "coefficient", "C", "DLA", "promoted")),
)
_INTERVAL = ("metric", "value", "ci_low", "ci_high")
#: The CSVs of a corpus cut from `corpus_attribution_frame`, in the order of the files.
CORPUS_LEVELS = (
    Level("layers", "layer", ("layer", "part", *_INTERVAL)),
    Level("heads", "head", ("layer", "head", *_INTERVAL)),
    Level("neurons", "neuron", ("layer", "neuron", *_INTERVAL, "mean_coefficient", "promoted")),
)


def promoted_text(tokens: Sequence[str]) -> str:
    """A neuron's promoted tokens as one cell: a JSON list of strings (`json.loads` reads it
    back; every token's characters kept)."""
    return json.dumps(list(tokens), ensure_ascii=False)


def _frame(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> pandas.DataFrame:
    """A frame of `rows` (column → value; a column a row lacks is missing), its whole-number
    columns nullable integers and its score columns floats."""
    cells = [[row.get(column) for column in columns] for row in rows]
    return long_frame(columns, cells, integers=_INTEGERS, floats=_FLOATS)


def _single_rows(result: AttributeResult) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{"level": "embedding", "DLA": result.embed_dla}]
    for entry in result.layers:
        rows += [
            {
                "level": "layer",
                "layer": entry.layer,
                "part": part,
                "C": c,
                "DLA": dla,
                "bias_DLA": bias,
            }
            for part, c, dla, bias in (
                ("attn", entry.attn_contribution, entry.attn_dla, entry.attn_bias_dla),
                ("mlp", entry.mlp_contribution, entry.mlp_dla, entry.mlp_bias_dla),
            )
        ]
    rows += [_component_row("head", "attn", h, head=h.head) for h in result.heads]
    rows += [
        _component_row(
            "source", "attn", s, head=s.head, source=s.source_position, source_token=s.source_token
        )
        for s in result.sources
    ]
    rows += [
        _component_row(
            "neuron", "mlp", n, neuron=n.neuron, coefficient=n.coefficient, promoted=promoted_text(n.promoted)
        )
        for n in result.neurons
    ]
    rows.append({"level": "final_bias", "DLA": result.bias_dla})
    return rows


def _component_row(level: str, part: str, component: Any, **cells: Any) -> dict[str, Any]:
    """The row of one head, source or neuron (`component`): its level, block and part, its C and
    DLA, and the `cells` that place it within the block."""
    return {
        "level": level,
        "layer": component.layer,
        "part": part,
        "C": component.contribution,
        "DLA": component.dla,
        **cells,
    }


def attribute_frame(result: AttributeResult) -> pandas.DataFrame:
    """One text's scores as one long frame (`ATTRIBUTE_COLUMNS`, documented by
    `AttributeResult`): the embedding, two rows per block (attn, mlp), the heads, sources and
    neurons, the final bias term."""
    return _frame(ATTRIBUTE_COLUMNS, _single_rows(result))


def _estimates(place: dict[str, Any], c: Estimate, dla: Estimate) -> list[dict[str, Any]]:
    """Two rows of one component: its mean C and its mean DLA, each with its interval."""
    return [
        {**place, "metric": metric, "value": e.value, "ci_low": e.low, "ci_high": e.high}
        for metric, e in (("C", c), ("DLA", dla))
    ]


def _corpus_rows(result: CorpusAttribution) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for entry in result.layers:
        rows += _estimates(
            {"level": "layer", "layer": entry.layer, "part": "attn"}, entry.attn_contribution, entry.attn_dla
        )
        rows += _estimates(
            {"level": "layer", "layer": entry.layer, "part": "mlp"}, entry.mlp_contribution, entry.mlp_dla
        )
    for h in result.heads:
        rows += _estimates(
            {"level": "head", "layer": h.layer, "part": "attn", "head": h.head}, h.contribution, h.dla
        )
    for n in result.neurons:
        place = {
            "level": "neuron",
            "layer": n.layer,
            "part": "mlp",
            "neuron": n.neuron,
            "mean_coefficient": n.mean_coefficient,
            "promoted": promoted_text(n.promoted),
        }
        rows += _estimates(place, n.contribution, n.dla)
    return rows


def corpus_attribution_frame(result: CorpusAttribution) -> pandas.DataFrame:
    """A corpus's means as one long frame (`CORPUS_ATTRIBUTION_COLUMNS`, documented by
    `CorpusAttribution`): per block attn C, attn DLA, mlp C, mlp DLA; per head and per
    neuron C and DLA."""
    return _frame(CORPUS_ATTRIBUTION_COLUMNS, _corpus_rows(result))


def level_frame(frame: pandas.DataFrame, level: Level) -> pandas.DataFrame:
    """The rows of `level.level` in `frame`, with `level.columns` only (its CSV)."""
    return frame.loc[frame["level"] == level.level, list(level.columns)].reset_index(drop=True)


def trajectory_frame(points: Sequence[TrajectoryPoint]) -> pandas.DataFrame:
    """The target at each residual point (`TRAJECTORY_COLUMNS`): its name, block, stage (in,
    res, out), probability, rank (0 = top-1) and log-probability."""
    rows = [(p.point, p.layer, p.stage, p.probability, p.rank, p.logprob) for p in points]
    return long_frame(TRAJECTORY_COLUMNS, rows, integers=_INTEGERS, floats=_FLOATS)


def _share_cells(share: QueryShare) -> tuple[str, int | None, str, float]:
    return (share.component, share.layer, share.kind, share.share)


def query_frame(result: AttributeResult) -> pandas.DataFrame:
    """query_contributions (`QUERY_COLUMNS`): one row per share, after its neuron's layer,
    index, projection, pre-activation, constant and residual."""
    rows = [
        (q.layer, q.neuron, q.projection, q.preactivation, q.constant, q.residual, *_share_cells(share))
        for q in result.query_contributions
        for share in q.shares
    ]
    return long_frame(QUERY_COLUMNS, rows, integers=_INTEGERS, floats=_FLOATS)


def linearity_frame(check: LinearityCheck) -> pandas.DataFrame:
    """The linearity check (`LINEARITY_COLUMNS`): per n, C of the top n neurons' summed value
    vectors and the sum of their single C."""
    rows = list(zip(check.counts, check.cumulative, check.summed, strict=True))
    return long_frame(LINEARITY_COLUMNS, rows)


def experts_frame(experts: Sequence[ExpertAttribution]) -> pandas.DataFrame:
    """experts.csv (`EXPERT_COLUMNS`): every routed expert, its router weight, C and DLA."""
    rows = [(e.layer, e.expert, e.weight, e.contribution, e.dla) for e in experts]
    return long_frame(EXPERT_COLUMNS, rows, integers=_INTEGERS, floats=_FLOATS)


def sinks_frame(heads: Sequence[HeadAttribution]) -> pandas.DataFrame:
    """sinks.csv (`SINK_COLUMNS`): the attention mass each head's sink took at the position."""
    rows = [(h.layer, h.head, h.sink_share) for h in heads if h.sink_share is not None]
    return long_frame(SINK_COLUMNS, rows, integers=_INTEGERS, floats=_FLOATS)


def attribute_frames(result: Result) -> list[tuple[str, pandas.DataFrame]]:
    """Every CSV of `result` as (file stem, frame), in the order of the files: for one text
    layers, heads, sources, neurons (`SINGLE_LEVELS`), trajectory, query_contributions,
    linearity (with a linearity check), tuned_trajectory (with a tuned lens), experts (a
    mixture of experts with the neuron level) and sinks (attention sinks); for a corpus
    layers, heads, neurons (`CORPUS_LEVELS`)."""
    if isinstance(result, CorpusAttribution):
        corpus = corpus_attribution_frame(result)
        return [(level.name, level_frame(corpus, level)) for level in CORPUS_LEVELS]
    single = attribute_frame(result)
    frames = [(level.name, level_frame(single, level)) for level in SINGLE_LEVELS]
    frames += [
        ("trajectory", trajectory_frame(result.trajectory)),
        ("query_contributions", query_frame(result)),
    ]
    if result.linearity is not None:
        frames.append(("linearity", linearity_frame(result.linearity)))
    if result.tuned_trajectory:
        frames.append(("tuned_trajectory", trajectory_frame(result.tuned_trajectory)))
    if result.experts:
        frames.append(("experts", experts_frame(result.experts)))
    if any(h.sink_share is not None for h in result.heads):
        frames.append(("sinks", sinks_frame(result.heads)))
    return frames
