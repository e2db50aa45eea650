"""FFN neurons as key -> value memories (Geva et al. 2021): what a neuron writes, and when.

An MLP writes Σ_k m_k · w_k + b_out, where w_k = W_out[k] is neuron k's **value** vector and its
coefficient m_k = act(x · W_in[:, k] + b_in[k]) (× the up projection for gated MLPs) is how
strongly the block input x matches its **key** (`resstream.models.adapters.MLPWeights`).

Value side. Neuron k's direct effect on the scores is read through the final norm as it
acts on a direction: scores(w_k) = W_U · (g ⊙ centre(w_k)), with g the final norm's gain and
centre(w) = w − mean(w) for LayerNorm (w itself for RMSNorm; the identity for models without
a final norm). The rest of the norm only rescales or shifts these scores by the same amount
for every token: 1/s(u), fixed at whatever state u the vector is added to, multiplies all of
them by one positive number (the ranking of tokens is unchanged), and the norm's bias b and the
unembedding bias b_U add the same vector W_U · b + b_U whatever the neuron. Soft-capping is
monotone and left out for the same reason. `value_logits` gives these scores,
`promoted_tokens` the tokens each value vector raises and lowers most. This is a direct
effect through the final norm only: what later layers do with w_k is not counted.

Key side. Over a corpus, the positions where m_k is largest are the contexts the key
matches. `TopActivations` keeps, per neuron, the `keep` largest (m_k, sequence, position)
while the batches stream by (never all positions at once); `top_activations` runs it over
(ids, coefficients) batches and cuts each winner's text window. When the user asks for the
top N neurons of a layer instead of naming them, neurons are ranked by their largest
activation over the corpus (ties: the lower index first): a neuron whose key some context
matches strongly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from resstream.analysis.decoding.decoder import Decoder
from resstream.analysis.names import neuron_name
from resstream.analysis.norms import NormForm, norm_form
from resstream.display import Displayable
from resstream.errors import RunError
from resstream.models.adapters.base import ModelView
from resstream.reprs import summary

#: Bytes of one block of value scores (chunk of neurons × vocabulary, float32) in
#: `promoted_tokens`: a GPT-2-small layer (3072 × 50257) is scored 300-odd neurons at a time.
DEFAULT_CHUNK_BYTES = 64 << 20

#: Tokens shown before the activating token in a context window.
DEFAULT_WINDOW = 12

#: How neurons are chosen when the user asks for the top N of a layer.
RANK_RULE = "the layer's neurons ranked by their largest activation over the corpus (ties: lower index)"

VALUE_RULE = (
    "W_U · (g ⊙ centre(w_k)): the value vector w_k as it reaches the final norm (W_out[k]; Gemma-2: "
    "times the post-feed-forward gain; post-norm blocks: through each later stream norm's centring "
    "and gain), through the final norm's gain (and centring for LayerNorm); the norms' 1/s and the "
    "biases are the same for every neuron and left out"
)


# --------------------------------------------------------------------------- value side


def added_values(view: ModelView, layer: int, neurons: Tensor | None = None) -> Tensor:
    """The value vectors of `layer`'s neurons (all, or the ids `neurons`) as they reach the
    final norm, up to positive per-position scales: W_out[k], times Gemma-2's
    post-feed-forward gain, and in post-norm blocks passed through every later stream norm's
    centring and gain (this block's ln2, then each later block's ln1 and ln2). (d_ff or n, d)."""
    W_out = view.blocks[layer].read_mlp_weights().W_out.detach()
    rows = W_out if neurons is None else W_out[neurons.to(W_out.device)]
    rows = rows.float()
    block = view.blocks[layer]
    if block.post_mlp_norm is not None:
        rows = _through_gain(norm_form(block.post_mlp_norm), rows)
    if block.norm_position == "post":
        later = [block.ln2] + [norm for b in view.blocks[layer + 1 :] for norm in (b.ln1, b.ln2)]
        for module in later:
            rows = _through_gain(norm_form(module), rows)
    return rows


def _through_gain(form: NormForm, rows: Tensor) -> Tensor:
    """centre(rows) ⊙ gain: a norm's linear part without its (positive) 1/s."""
    rows = form.centred(rows)
    return rows if form.gain is None else rows * form.gain.detach().to(rows.device, torch.float32)


def value_directions(decoder: Decoder, W_out_rows: Tensor) -> Tensor:
    """g ⊙ centre(w) of each value vector `W_out_rows` (n, d_model), float32, on the decoder's
    device: what the final norm makes of a direction, up to its positive scale 1/s."""
    form = norm_form(decoder.norm if isinstance(decoder.norm, torch.nn.Module) else None)
    rows = W_out_rows.detach().to(decoder.matrix.device, torch.float32)
    directions = form.centred(rows)
    if form.gain is not None and not form.identity:
        directions = directions * form.gain.detach().to(directions.device, torch.float32)
    return directions


def value_logits(decoder: Decoder, W_out_rows: Tensor) -> Tensor:
    """Scores (n, vocab) of each value vector: W_U · (g ⊙ centre(w_k)) (module docstring: no
    1/s, no bias, no soft-capping, which change every neuron's scores alike)."""
    return value_directions(decoder, W_out_rows) @ decoder.matrix.detach().float().T


@dataclass(frozen=True)
class ValueTokens:
    """Per neuron (in the order given), the `top` token ids its value vector promotes most
    (highest `value_logits` first) and suppresses most (lowest first), with their scores."""

    promoted_ids: tuple[tuple[int, ...], ...]
    promoted_scores: tuple[tuple[float, ...], ...]
    suppressed_ids: tuple[tuple[int, ...], ...]
    suppressed_scores: tuple[tuple[float, ...], ...]

    def __len__(self) -> int:
        return len(self.promoted_ids)


def promoted_tokens(
    decoder: Decoder, W_out_rows: Tensor, top: int, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> ValueTokens:
    """The `top` tokens each value vector `W_out_rows` (n, d_model) promotes and suppresses most
    (`value_logits`), scored a chunk of neurons at a time so that at most `chunk_bytes` of
    scores exist at once. Raises ValueError unless 1 <= top <= vocabulary."""
    vocab = decoder.vocab_size
    if not 1 <= top <= vocab:
        raise ValueError(f"top {top} is outside [1, {vocab}] (the vocabulary)")
    chunk = max(1, chunk_bytes // (4 * vocab))
    lists: list[list[tuple[Any, ...]]] = [[], [], [], []]  # rows of ids or scores (`tolist`)
    for start in range(0, W_out_rows.shape[0], chunk):
        scores = value_logits(decoder, W_out_rows[start : start + chunk])
        high = scores.topk(top, dim=-1)
        low = scores.topk(top, dim=-1, largest=False)
        for target, tensor in zip(lists, (high.indices, high.values, low.indices, low.values), strict=True):
            target.extend(tuple(row) for row in tensor.tolist())
    return ValueTokens(*(tuple(entries) for entries in lists))


# --------------------------------------------------------------------------- key side


@dataclass(frozen=True)
class Activation:
    """One coefficient m_k at `position` of sequence `sequence` (0-based, in corpus order)."""

    value: float
    sequence: int
    position: int


@dataclass(frozen=True)
class BatchTop:
    """One batch's candidates for `TopActivations` (its `measure`): per neuron, the batch's
    `keep` largest coefficients, largest first, with their rows in the batch and positions."""

    values: Tensor
    rows: Tensor
    positions: Tensor


class TopActivations:
    """Streaming top-`keep` of each of `num_neurons` neurons' coefficients (module docstring).

    `update(m, first_sequence)` takes one batch's coefficients m (batch, seq, num_neurons),
    whose row r is sequence `first_sequence + r`; memory is O(num_neurons · keep) whatever
    the corpus size. Equal coefficients keep corpus order (earlier sequence, then position).
    """

    def __init__(self, num_neurons: int, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep {keep} must be >= 1")
        self.keep = keep
        self.values = torch.full((num_neurons, keep), float("-inf"))
        self.sequences = torch.full((num_neurons, keep), -1, dtype=torch.long)
        self.positions = torch.full((num_neurons, keep), -1, dtype=torch.long)

    @property
    def num_neurons(self) -> int:
        return int(self.values.shape[0])

    def update(self, m: Tensor, first_sequence: int) -> None:
        """Merge one batch's coefficients (batch, seq, num_neurons) into the running top lists."""
        self.add(self.measure(m), first_sequence)

    def measure(self, m: Tensor) -> BatchTop:
        """One batch's candidates (`update`'s coefficients), not yet merged."""
        batch, seq, neurons = m.shape
        if neurons != self.num_neurons:
            raise ValueError(f"expected {self.num_neurons} neurons, got {neurons}")
        flat = m.detach().float().reshape(batch * seq, neurons).T.contiguous()  # (neurons, positions)
        best = _stable_top(flat, self.keep)  # on m's device: only the winners move
        best_values = flat.gather(1, best).cpu()
        if not bool(torch.isfinite(best_values).all()):  # nan and inf always reach the top
            raise RunError(
                "non-finite neuron coefficients (a float16/bfloat16 model overflowing? try `dtype` float32)"
            )
        best = best.cpu()
        return BatchTop(best_values, torch.div(best, seq, rounding_mode="floor"), best % seq)

    def add(self, part: BatchTop, first_sequence: int) -> None:
        """Merge one batch's `measure`, whose row r is sequence `first_sequence + r`: batches
        merged in the same order give the same lists, whichever process measured them."""
        values = torch.cat([self.values, part.values], dim=1)
        order = _stable_top(values, self.keep)
        self.values = values.gather(1, order)
        candidates_seq = first_sequence + part.rows
        self.sequences = torch.cat([self.sequences, candidates_seq], dim=1).gather(1, order)
        self.positions = torch.cat([self.positions, part.positions], dim=1).gather(1, order)

    def maxima(self) -> Tensor:
        """Each neuron's largest coefficient so far (num_neurons,); -inf before any update."""
        return self.values[:, 0].clone()

    def best(self, index: int) -> tuple[Activation, ...]:
        """Neuron `index`'s largest coefficients, largest first (at most `keep`)."""
        return tuple(
            Activation(float(v), int(s), int(p))
            for v, s, p in zip(self.values[index], self.sequences[index], self.positions[index], strict=True)
            if s >= 0
        )


def _stable_top(values: Tensor, k: int) -> Tensor:
    """Indices of the k largest entries of each row (at most the row's length), largest first,
    equal values in the order they appear (earlier entries: earlier positions). `topk` finds
    them; only when more entries equal a row's k-th value than there are places left (ReLU
    zeros, say) are the earliest of them chosen explicitly. (A full sort would give the same,
    several times slower on a layer's neurons × positions.)"""
    k = min(k, values.shape[1])
    best = values.topk(k, dim=1)
    kth = best.values[:, -1:]
    if bool(((values >= kth).sum(dim=1) > k).any()):
        above, tied = values > kth, values == kth
        room = k - above.sum(dim=1, keepdim=True)
        chosen = above | (tied & (tied.cumsum(dim=1) <= room))
        indices = chosen.nonzero()[:, 1].view(-1, k)  # k per row, in column order
    else:
        indices = best.indices.sort(dim=1).values
    order = torch.sort(values.gather(1, indices), dim=1, descending=True, stable=True).indices
    return indices.gather(1, order)


def rank_neurons(maxima: Tensor, top: int) -> list[int]:
    """The `top` neurons with the largest `maxima` (RANK_RULE), best first."""
    order = torch.sort(maxima.float().cpu(), descending=True, stable=True).indices
    return [int(k) for k in order[:top]]


@dataclass(frozen=True)
class Context:
    """A context that switches a neuron on: its coefficient `activation` at `position` of
    sequence `sequence`, and the window of token ids ending with the activating token."""

    activation: float
    sequence: int
    position: int
    window: tuple[int, ...]

    @property
    def token_id(self) -> int:
        """The token at `position` (the last of the window)."""
        return self.window[-1]


@dataclass(frozen=True)
class KeySide:
    """The key side of the chosen neurons of one layer over a corpus: per neuron its largest
    coefficient and top contexts, and how many positions were seen."""

    neurons: tuple[int, ...]
    maxima: tuple[float, ...]
    contexts: tuple[tuple[Context, ...], ...]
    num_positions: int


def top_activations(
    batches: Iterable[tuple[Tensor, Tensor]],
    *,
    neurons: Sequence[int] | None = None,
    top: int | None = None,
    keep: int = 10,
    window: int = DEFAULT_WINDOW,
) -> KeySide:
    """The `keep` largest coefficients of the chosen neurons over a corpus, with their windows.

    `batches` yields (ids (batch, seq), m (batch, seq, d_ff)): a batch's token ids and the
    coefficients of all the layer's neurons there (recorded at the MLP's output projection),
    sequences numbered in the order they come. Give the `neurons` (indices into d_ff) or
    `top`: the `top` neurons by RANK_RULE, which tracks every neuron of the layer. Each
    context's window holds up to `window` tokens before the activating one, and it.
    """
    accumulator = KeySideAccumulator(neurons=neurons, top=top, keep=keep, window=window)
    for ids, m in batches:
        accumulator.add(accumulator.measure(ids, m))
    return accumulator.result()


@dataclass(frozen=True)
class KeyPart:
    """One batch's contribution to a `KeySideAccumulator`: its token ids (on the CPU) and its
    candidates."""

    ids: Tensor
    top: BatchTop


class KeySideAccumulator:
    """`top_activations` batch by batch: `add(measure(ids, m))` per batch, in corpus order
    (a batch's `measure` may run in another process), then `result()`."""

    def __init__(
        self, *, neurons: Sequence[int] | None, top: int | None, keep: int, window: int = DEFAULT_WINDOW
    ) -> None:
        if (neurons is None) == (top is None):
            raise ValueError("give exactly one of neurons or top")
        self.neurons, self.top, self.keep, self.window = neurons, top, keep, window
        self.chosen = None if neurons is None else torch.tensor(list(neurons), dtype=torch.long)
        self.rows: list[Tensor] = []
        self.positions = 0
        self.tracker: TopActivations | None = None

    def measure(self, ids: Tensor, m: Tensor) -> KeyPart:
        """One batch's part: ids (batch, seq) and the layer's coefficients m (batch, seq, d_ff)."""
        if self.chosen is not None:
            m = m[..., self.chosen.to(m.device)]
        return KeyPart(ids.detach().cpu(), TopActivations(m.shape[-1], self.keep).measure(m))

    def add(self, part: KeyPart) -> None:
        """Merge one batch's `measure`, its sequences numbered after those added before."""
        if self.tracker is None:
            self.tracker = TopActivations(part.top.values.shape[0], self.keep)
        self.tracker.add(part.top, len(self.rows))
        self.rows.extend(part.ids)
        self.positions += part.ids.numel()

    def result(self) -> KeySide:
        """The key side of the chosen (or top) neurons over every batch added."""
        tracker = self.tracker
        if tracker is None:
            raise ValueError("no batches: the corpus gave no sequences")
        if self.neurons is not None:
            slots, names = list(range(len(self.neurons))), [int(n) for n in self.neurons]
        else:
            assert self.top is not None  # exactly one of neurons and top (checked above)
            slots = names = rank_neurons(tracker.maxima(), self.top)
        maxima = tracker.maxima()
        return KeySide(
            neurons=tuple(names),
            maxima=tuple(float(maxima[i]) for i in slots),
            contexts=tuple(
                tuple(_context(a, self.rows, self.window) for a in tracker.best(i)) for i in slots
            ),
            num_positions=self.positions,
        )


def _context(activation: Activation, rows: Sequence[Tensor], window: int) -> Context:
    """The context of one activation: its window of up to `window` tokens before it, and it."""
    row = rows[activation.sequence]
    start = max(0, activation.position - window)
    ids = tuple(int(t) for t in row[start : activation.position + 1])
    return Context(activation.value, activation.sequence, activation.position, ids)


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class NeuronReport:
    """One neuron: its largest coefficient over the corpus, the tokens its value vector
    promotes and suppresses (id, score), and its top contexts."""

    neuron: int
    max_activation: float
    promoted: tuple[tuple[int, float], ...]
    suppressed: tuple[tuple[int, float], ...]
    contexts: tuple[Context, ...]


#: Neurons a `NeuronsResult`'s repr lists by number.
REPR_NEURONS = 10

#: The columns of `NeuronsResult.to_pandas()` (and of neurons.csv), in order.
NEURONS_COLUMNS = (
    "layer",
    "neuron",
    "kind",
    "rank",
    "token_id",
    "token",
    "value",
    "sequence",
    "position",
    "context",
)


@dataclass(frozen=True)
class NeuronsResult(Displayable, renderer="resstream.reporting.neurons"):
    """Neurons of one layer as key -> value memories (module docstring), with the text of every
    token the result mentions (`token_text`), so it renders itself.

    `to_pandas()` columns (`NEURONS_COLUMNS`; one row per listed item, the frame neurons.csv
    is written from): layer — the block (0-based); neuron — its index in the layer; kind —
    "promoted" or "suppressed" (a value token) or "context" (a top activating context); rank —
    0 for the first of its kind; token_id, token — the token (for a context, the activating
    one), its text with spaces kept, a newline as '↵' and other control characters escaped
    (`to_dict()` has the exact texts); value — the value score W_U·(g ⊙ w_k) of the token, or
    for a context the coefficient m_k there; sequence, position — where the context is in the
    sample (NA for value tokens); context — the window, the activating token in ⟦ ⟧ (NA for
    value tokens).
    """

    model: str
    layer: int
    num_layers: int
    d_ff: int
    gated: bool
    selection: str
    value_rule: str
    dataset: str
    sample: str
    dataset_fingerprint: str | None
    num_seqs: int
    num_positions: int
    neurons: tuple[NeuronReport, ...]
    texts: tuple[tuple[int, str], ...] = ()

    def token_text(self, token_id: int) -> str:
        """The decoded text of a token the result mentions (its id in brackets if unknown)."""
        return dict(self.texts).get(token_id, f"<{token_id}>")

    def __repr__(self) -> str:
        shown = ", ".join(str(n.neuron) for n in self.neurons[:REPR_NEURONS])
        ids = shown if len(self.neurons) <= REPR_NEURONS else f"{shown}, … ({len(self.neurons)} in all)"
        top = max(self.neurons, key=lambda n: n.max_activation, default=None)
        largest = (
            ""
            if top is None
            else f"largest m {top.max_activation:.3g} ({neuron_name(self.layer, top.neuron)})"
        )
        where = f"{self.model}: layer {self.layer}, neurons {ids}"
        return summary(self, where, largest, f"{self.num_positions:,} positions")

    def to_dict(self) -> dict[str, Any]:
        """Plain data for neurons.json, with the decoded strings."""
        text = dict(self.texts)

        def tokens(pairs: Sequence[tuple[int, float]]) -> list[dict[str, Any]]:
            return [{"token_id": t, "token": text.get(t), "score": s} for t, s in pairs]

        return {
            "model": self.model,
            "layer": self.layer,
            "num_layers": self.num_layers,
            "d_ff": self.d_ff,
            "gated": self.gated,
            "selection": self.selection,
            "value_rule": self.value_rule,
            "dataset": self.dataset,
            "sample": self.sample,
            "dataset_fingerprint": self.dataset_fingerprint,
            "num_seqs": self.num_seqs,
            "num_positions": self.num_positions,
            "neurons": [
                {
                    "neuron": n.neuron,
                    "max_activation": n.max_activation,
                    "promoted": tokens(n.promoted),
                    "suppressed": tokens(n.suppressed),
                    "contexts": [
                        {
                            "activation": c.activation,
                            "sequence": c.sequence,
                            "position": c.position,
                            "token_id": c.token_id,
                            "token": text.get(c.token_id),
                            "window_ids": list(c.window),
                            "window": [text.get(t) for t in c.window],
                        }
                        for c in n.contexts
                    ],
                }
                for n in self.neurons
            ],
        }


def neuron_reports(key: KeySide, values: ValueTokens) -> tuple[NeuronReport, ...]:
    """The key side and the value side (same neurons, same order) joined per neuron."""
    if len(values) != len(key.neurons):
        raise ValueError(f"{len(values)} value lists for {len(key.neurons)} neurons")
    return tuple(
        NeuronReport(
            neuron=neuron,
            max_activation=key.maxima[i],
            promoted=tuple(zip(values.promoted_ids[i], values.promoted_scores[i], strict=True)),
            suppressed=tuple(zip(values.suppressed_ids[i], values.suppressed_scores[i], strict=True)),
            contexts=key.contexts[i],
        )
        for i, neuron in enumerate(key.neurons)
    )


def mentioned_tokens(
    reports: Sequence[NeuronReport], token_text: Callable[[int], str]
) -> tuple[tuple[int, str], ...]:
    """(id, text) of every token the reports mention, by id."""
    ids: set[int] = set()
    for report in reports:
        ids.update(t for t, _ in report.promoted + report.suppressed)
        for context in report.contexts:
            ids.update(context.window)
    return tuple((t, token_text(t)) for t in sorted(ids))


__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_WINDOW",
    "NEURONS_COLUMNS",
    "RANK_RULE",
    "VALUE_RULE",
    "Activation",
    "BatchTop",
    "Context",
    "KeyPart",
    "KeySide",
    "KeySideAccumulator",
    "NeuronReport",
    "NeuronsResult",
    "TopActivations",
    "ValueTokens",
    "mentioned_tokens",
    "neuron_reports",
    "promoted_tokens",
    "rank_neurons",
    "top_activations",
    "value_directions",
    "value_logits",
]
