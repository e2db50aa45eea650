"""The frozen results of `attribute`: who wrote the target token into the stream.

One text, one position (`AttributeResult`) or a corpus, every position's next token
(`CorpusAttribution`). Every score is defined in docs/attribution.md:

* `contribution` (C): log p(w | x + v) − log p(w | x), p the softmax of the logit lens
  (soft-capping included), w the target token, v what a component writes, x the stream it
  writes into (a block's input for attention and heads and sources, the stream after
  attention for the MLP and its neurons). For a whole sub-layer it is the change of log p(w)
  between the residual points around it.
* `dla`: the direct logit attribution, the component's share of the target's logit (or of the
  target − foil difference) through the final norm frozen at the actual final state.

`to_dict()` gives the content of attribute.json (schema in docs/attribution.md); `to_pandas()`
the same scores as one long-format frame (`ATTRIBUTE_COLUMNS`, `CORPUS_ATTRIBUTION_COLUMNS`,
drawn by `resstream.reporting.attribute`, whose CSVs are slices of it), and in a notebook a
result shows the tables and figures of attribute.html.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from resstream.analysis.names import head_name, neuron_name, sublayer_name
from resstream.display import Displayable
from resstream.errors import UsageError
from resstream.reprs import summary
from resstream.simulation.intervals import Estimate

#: What `attribute` ranks layers, heads, sources and neurons by: "dla" (the default; the
#: direct logit attribution, which is exactly minus the zero-ablation direct effect) or "c"
#: (the log-probability contribution C, an additive log-probability share: the seed paper's
#: order). docs/causal.md ("Measured faithfulness") measures which predicts ablation better.
RankBy = Literal["dla", "c"]
RANKINGS: tuple[RankBy, ...] = ("dla", "c")
#: The field of a score record that holds each ranking's score.
SCORE_FIELDS: dict[str, str] = {"dla": "dla", "c": "contribution"}
#: Each ranking's score as the outputs name it.
SCORE_NAMES: dict[str, str] = {"dla": "DLA", "c": "C"}


def check_rank_by(rank_by: str) -> RankBy:
    """`rank_by` itself when it is a ranking (`RANKINGS`); UsageError naming the allowed ones."""
    if rank_by not in RANKINGS:
        raise UsageError(f"`rank_by` {rank_by!r} is not allowed; allowed: {', '.join(RANKINGS)}")
    return rank_by


def other_ranking(rank_by: RankBy) -> RankBy:
    """The score shown beside the ranking's: C beside DLA, DLA beside C."""
    return "c" if rank_by == "dla" else "dla"


def ranked_score(entry: Any, rank_by: str, prefix: str = "") -> Any:
    """The score of `entry` (a head, source, neuron or layer record) that ranking `rank_by`
    reads; `prefix` "attn_" or "mlp_" picks a layer record's sub-layer."""
    return getattr(entry, prefix + SCORE_FIELDS[rank_by])


#: The columns of `AttributeResult.to_pandas()` (documented there).
ATTRIBUTE_COLUMNS = (
    "level",
    "layer",
    "part",
    "head",
    "neuron",
    "source",
    "source_token",
    "C",
    "DLA",
    "bias_DLA",
    "coefficient",
    "promoted",
)
#: The columns of `CorpusAttribution.to_pandas()` (documented there).
CORPUS_ATTRIBUTION_COLUMNS = (
    "level",
    "layer",
    "part",
    "head",
    "neuron",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "mean_coefficient",
    "promoted",
)


@dataclass(frozen=True)
class LayerAttribution:
    """One block's attention and MLP: contribution C and direct logit attribution. The DLA
    of a sub-layer is its heads' (neurons') DLA plus its output bias's: attn_dla = Σ heads +
    attn_bias_dla, mlp_dla = Σ neurons + mlp_bias_dla."""

    layer: int
    attn_contribution: float
    mlp_contribution: float
    attn_dla: float
    mlp_dla: float
    attn_bias_dla: float = 0.0  # b_O's share of attn_dla
    mlp_bias_dla: float = 0.0  # b_out's share of mlp_dla


@dataclass(frozen=True)
class HeadAttribution:
    """One attention head (its bias share is in the layer's attention, not here).
    `sink_share`: for a model with attention sinks (GPT-OSS), the attention mass the head's
    sink took at the position, 1 − Σ_j α_{t,j} (the sink writes nothing); None otherwise or
    without recorded probabilities."""

    layer: int
    head: int
    contribution: float
    dla: float
    sink_share: float | None = None


@dataclass(frozen=True)
class ExpertAttribution:
    """One routed expert of a mixture-of-experts MLP at the position: its router `weight`, and
    C and DLA of what it wrote (its neurons' sum, the weight included). The experts a token is
    routed to are the ones that wrote its prediction; the others wrote nothing."""

    layer: int
    expert: int
    weight: float
    contribution: float
    dla: float


@dataclass(frozen=True)
class SourceAttribution:
    """What one head moved from one source position: α_{t,j}·v_j·W_O[h]."""

    layer: int
    head: int
    source_position: int
    source_token: str
    contribution: float
    dla: float


@dataclass(frozen=True)
class NeuronAttribution:
    """One FFN neuron: its coefficient m_k, its value vector's C and DLA, the tokens its
    value vector promotes most (through the final norm's gain). In a mixture of experts
    `neuron` is the flat index and `expert` (expert, its neuron) says whose it is."""

    layer: int
    neuron: int
    coefficient: float
    contribution: float
    dla: float
    promoted: tuple[str, ...] = ()
    expert: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        """L<layer>.N<neuron>, with the expert's own naming after it (L0.N49 = E1.N24)."""
        name = neuron_name(self.layer, self.neuron)
        return name if self.expert is None else f"{name} = E{self.expert[0]}.N{self.expert[1]}"


@dataclass(frozen=True)
class TrajectoryPoint:
    """The target at one residual point: `point` is L_in_<l>, L_res_<l> or L_out_<l>
    (L_out_<l> is L_in_<l+1>, listed once)."""

    point: str
    layer: int
    stage: str  # "in", "res" or "out"
    probability: float
    rank: int  # tokens scoring strictly above the target (0 = top-1)
    logprob: float


@dataclass(frozen=True)
class QueryShare:
    """One lower component's share of an upper neuron's pre-activation."""

    component: str  # its name (`analysis.names`): "emb", "L1.H3", "L1.H3.S5", "L0.N712", "L2.attn_bias"
    layer: int | None
    kind: str  # embed | head | source | attn_bias | mlp | neuron | mlp_bias | norm_bias
    share: float


@dataclass(frozen=True)
class QueryContribution:
    """Which lower vectors switch neuron `neuron` of `layer` on: the pre-activation of its
    `projection` ("key" for a plain MLP; "gate" or "up" for a gated one) is exactly
    Σ shares + constant, with the MLP's input norm frozen at the actual stream."""

    layer: int
    neuron: int
    projection: str
    preactivation: float
    constant: float
    shares: tuple[QueryShare, ...]  # the largest |share| first (top N)
    residual: float  # |Σ all shares + constant − preactivation|


@dataclass(frozen=True)
class LinearityCheck:
    """One layer's neurons ranked by C: C of their cumulative sum against the sum of their C."""

    layer: int
    counts: tuple[int, ...]  # n = 1, 2, ...
    cumulative: tuple[float, ...]  # C(v_1 + ... + v_n)
    summed: tuple[float, ...]  # C(v_1) + ... + C(v_n)
    correlation: float  # Pearson r between the two
    ceiling: float | None = None  # −log p(target | L_res): no C at this state can exceed it


@dataclass(frozen=True)
class AttributionCheck:
    """Measured exactness: the decomposition's and the DLA's residuals."""

    decomposition_max_abs: float  # max |Σ components − state| over all residual points
    decomposition_relative: float  # the same / ‖state‖
    dla_residual: float  # |Σ DLA + norm bias term − actual logit (difference)|


@dataclass(frozen=True, repr=False)
class AttributeResult(Displayable, renderer="resstream.reporting.attribute.notebook"):
    """Attribution of one prediction: `target` at `position` of a text.

    `to_pandas()` columns (`ATTRIBUTE_COLUMNS`), one row per scored component, empty where a
    column does not apply: level — embedding, layer, head, source, neuron or final_bias;
    layer — the block (from 0); part — the sub-layer, attn or mlp (a head or source is attn, a
    neuron mlp); head — the attention head; neuron — the FFN neuron; source — the position a
    head moved from; source_token — its token; C — the log-probability contribution (none for
    embedding and final_bias); DLA — the direct logit attribution (to the logit difference
    with a foil); bias_DLA — the sub-layer's output bias's share of its DLA (level layer);
    coefficient — the neuron's m; promoted — the tokens its value vector promotes most,
    strongest first, as a JSON list of strings. Level layer has two rows per block, attn then
    mlp; embedding is the embedding's DLA (`embed_dla`), final_bias the final norm's and the
    unembedding's bias term (`bias_dla`): the DLA of embedding, layer and final_bias rows sums
    to the logit (difference) within `check.dla_residual`. sources and neurons are the top N
    by `rank_by` (|DLA| by default, |C| with "c"). layers.csv, heads.csv, sources.csv and
    neurons.csv are the rows of one level with the columns it uses (docs/attribution.md). In a
    notebook the result shows the tables and figures of attribute.html.
    """

    model: str
    decoder: str
    tokens: tuple[str, ...]  # the text's tokens as text
    position: int
    target_id: int
    target: str
    logit: float  # before soft-capping
    logprob: float
    probability: float
    rank: int
    layers: tuple[LayerAttribution, ...]
    heads: tuple[HeadAttribution, ...]
    sources: tuple[SourceAttribution, ...]  # top N by |DLA| (`rank_by` "c": by |C|)
    neurons: tuple[NeuronAttribution, ...]  # top N as sources (experts: flat index e·width + j)
    trajectory: tuple[TrajectoryPoint, ...]
    query_contributions: tuple[QueryContribution, ...]
    linearity: LinearityCheck | None
    check: AttributionCheck
    embed_dla: float
    bias_dla: float  # the final norm's bias (and b_U) term of the logit (difference)
    foil_id: int | None = None
    foil: str | None = None
    logit_difference: float | None = None  # target − foil, when a foil is given
    notes: tuple[str, ...] = field(default_factory=tuple)
    logit_softcap: float | None = None  # c of the model's logits tanh(x / c)·c (Gemma-2); None: none
    # The target at each block boundary (L_in_0, L_out_0 .. L_out_{L-1}) through a tuned lens,
    # when one was given (`decoding` says which); every other score is the logit lens's.
    tuned_trajectory: tuple[TrajectoryPoint, ...] = ()
    tuned_decoding: str | None = None
    # Mixtures of experts (with the neuron level): every routed expert of every layer.
    experts: tuple[ExpertAttribution, ...] = ()
    rank_by: RankBy = "dla"  # what sources and neurons were chosen and the outputs are led by
    computed: str = ""  # which scores of which levels were computed, in words (`Levels.describe`)

    def to_dict(self) -> dict[str, Any]:
        """The content of attribute.json."""
        return {"kind": "attribute", **asdict(self)}

    def __repr__(self) -> str:
        foil = "" if self.foil is None else f", foil {self.foil!r} (id {self.foil_id})"
        return summary(
            self,
            f"model {self.model!r}, decoder {self.decoder}",
            f"target {self.target!r} (id {self.target_id}) at position {self.position} "
            f"{self.tokens[self.position]!r}{foil}",
            f"p {self.probability:.4g}, log p {self.logprob:.4g}, rank {self.rank}",
            _largest_text(self),
            _check_text(self.check),
        )


@dataclass(frozen=True)
class LayerSummary:
    """Corpus mode: one block's mean scores over sequences, each with a 95% interval."""

    layer: int
    attn_contribution: Estimate
    mlp_contribution: Estimate
    attn_dla: Estimate
    mlp_dla: Estimate


@dataclass(frozen=True)
class HeadSummary:
    """Corpus mode: one head's mean C and DLA, each with a 95% interval over sequences."""

    layer: int
    head: int
    contribution: Estimate
    dla: Estimate


@dataclass(frozen=True)
class NeuronSummary:
    """Corpus mode: one neuron's mean C and DLA over every scored position (95% intervals)."""

    layer: int
    neuron: int
    contribution: Estimate
    dla: Estimate
    mean_coefficient: float
    promoted: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """L<layer>.N<neuron> (flat in a mixture of experts)."""
        return neuron_name(self.layer, self.neuron)


@dataclass(frozen=True, repr=False)
class CorpusAttribution(Displayable, renderer="resstream.reporting.attribute.notebook"):
    """Corpus mode: every position's next token is the target; means over sequences.

    `to_pandas()` columns (`CORPUS_ATTRIBUTION_COLUMNS`), one row per component and metric,
    empty where a column does not apply: level — layer, head or neuron; layer — the block;
    part — attn or mlp (a head is attn, a neuron mlp); head — the attention head; neuron —
    the FFN neuron; metric — C (the log-probability contribution) or DLA; value — its mean
    over sequences; ci_low — the low end of its 95% interval over sequences, ci_high — the
    high end (both missing with one sequence); mean_coefficient — the neuron's mean m over the
    scored positions; promoted — the tokens its value vector promotes most, as a JSON list of
    strings. Level layer has four rows per block (attn C, attn DLA, mlp C, mlp DLA), head and
    neuron two (C, DLA). layers.csv, heads.csv and neurons.csv are the rows of one level with
    the columns it uses. In a notebook the result shows the tables and figures of
    attribute.html.
    """

    model: str
    decoder: str
    dataset: str
    num_seqs: int
    seq_len: int
    positions: int  # scored positions in all
    layers: tuple[LayerSummary, ...]
    heads: tuple[HeadSummary, ...]
    neurons: tuple[NeuronSummary, ...]  # the largest mean |DLA| first (`rank_by` "c": |C|; top N)
    neuron_rule: str  # how the scored neurons were chosen, in words
    check: AttributionCheck
    notes: tuple[str, ...] = field(default_factory=tuple)
    sample: str | None = None  # how the windows were drawn
    dataset_fingerprint: str | None = None
    rank_by: RankBy = "dla"  # what the neurons were chosen and the outputs are led by

    def to_dict(self) -> dict[str, Any]:
        """The content of attribute.json in corpus mode."""
        return {"kind": "attribute-corpus", **asdict(self)}

    def __repr__(self) -> str:
        return summary(
            self,
            f"model {self.model!r}, decoder {self.decoder}",
            f"{self.num_seqs} × {self.seq_len} tokens of {self.dataset!r}, {self.positions:,} positions",
            _largest_text(self),
            _check_text(self.check),
        )


def _largest_text(result: AttributeResult | CorpusAttribution) -> str:
    """ "largest |DLA|: sub-layer L2.mlp +1.2, head L1.H3 +0.5, neuron L2.N712 +0.3" for a repr
    (by |C| with `rank_by` "c"; a corpus's means over sequences)."""
    rank = result.rank_by
    sub_layers = [
        (sublayer_name(e.layer, part), ranked_score(e, rank, f"{part}_"))
        for part in ("attn", "mlp")
        for e in result.layers
    ]
    heads = [(head_name(h.layer, h.head), ranked_score(h, rank)) for h in result.heads]
    neurons = [(n.name, ranked_score(n, rank)) for n in result.neurons]
    found = [
        f"{kind} {_top(entries)}"
        for kind, entries in (("sub-layer", sub_layers), ("head", heads), ("neuron", neurons))
        if entries
    ]
    return f"largest |{SCORE_NAMES[rank]}|: " + (", ".join(found) or "none")


def _top(entries: Sequence[tuple[str, float | Estimate]]) -> str:
    """The entry with the largest |score| (the first of equals), as "name +0.123"."""
    name, score = max(entries, key=lambda entry: abs(_value(entry[1])))
    return f"{name} {_value(score):+.3g}"


def _value(score: float | Estimate) -> float:
    """A score's value: the float itself, or an Estimate's mean."""
    return score.value if isinstance(score, Estimate) else score


def _check_text(check: AttributionCheck) -> str:
    return (
        f"exact: max |Σ − h| {check.decomposition_max_abs:.1e} "
        f"(relative {check.decomposition_relative:.1e}), DLA residual {check.dla_residual:.1e}"
    )


__all__ = [
    "ATTRIBUTE_COLUMNS",
    "CORPUS_ATTRIBUTION_COLUMNS",
    "RANKINGS",
    "SCORE_FIELDS",
    "SCORE_NAMES",
    "AttributeResult",
    "AttributionCheck",
    "CorpusAttribution",
    "HeadAttribution",
    "HeadSummary",
    "LayerAttribution",
    "LayerSummary",
    "LinearityCheck",
    "NeuronAttribution",
    "NeuronSummary",
    "QueryContribution",
    "QueryShare",
    "RankBy",
    "SourceAttribution",
    "TrajectoryPoint",
    "check_rank_by",
    "other_ranking",
    "ranked_score",
]
