"""Where does a hidden state stop being "about" its input token and start predicting the next?

Implements the metric definitions of docs/metrics.md as streaming accumulation: a corpus is
fed batch by batch (`AlignmentAccumulator.update`), each batch layer by layer and in chunks of
positions, so the layers × batch × positions × vocab logits tensor is never built and no
softmax is computed. For positions i = 0..T−2 of every sequence (t_{i+1} is the target):

* scores_l(i): the decoder's scores of h_l(i) (`resstream.analysis.decoding.decoder`: the logit lens
  W_U · final_norm(h) (+ b_U), or the embedding decoder W_E · h), evaluated exactly.
* rank of a token t = the number of vocabulary entries whose score is *strictly* greater than
  the score of t; t ∈ top-k  ⇔  rank < k (ties are therefore inclusive; exact ranks come from
  `resstream.analysis.decoding.ranks`).
  ``in_match_l = mean 1[t_i ∈ top-k]``, ``out_match_l = mean 1[t_{i+1} ∈ top-k]``.
* ``cos_in_l = mean cos(h_l(i), W_E[t_i])``, ``cos_out_l = mean cos(h_l(i), W_U[t_{i+1}])``
  (on the raw state, before any norm; a zero vector has cosine 0).
* ``projection_l = mean ⟨ĥ − a, b − a⟩ / ‖b − a‖²`` with a = W_E[t_i], b = W_U[t_{i+1}] and
  ĥ = h·‖a‖/‖h‖: the hidden state is mapped into the embedding scale by rescaling it to the
  norm of the input embedding (a zero state maps to 0). 0 means "at the input embedding",
  1 "at the output embedding"; a model whose h_0 is exactly W_E[t_i] gives exactly 0.
  Positions with t_i = t_{i+1} (or with a = b) are skipped for the projection only.
* ``shift_layer``: first depth, linearly interpolated between layers, where
  out_match − in_match becomes positive (0.0 if it already is at layer 0, None if never).
* per-token shift depth: the first layer whose score of t_{i+1} is strictly greater than its
  score of t_i (positions with t_i = t_{i+1} can never shift and count as never shifted).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Unpack

import torch
from torch import Tensor

from resstream.analysis.decoding.decoder import Decoder, NonFiniteInputs
from resstream.analysis.decoding.ranks import ScreenOptions, check_ids, check_matrix
from resstream.analysis.stats import cluster_ratio, cluster_ratio_ci
from resstream.display import Displayable
from resstream.io import jsonable
from resstream.reprs import summary

__all__ = [
    "SHIFT_COLUMNS",
    "SHIFT_METRICS",
    "AlignmentAccumulator",
    "AlignmentPart",
    "AlignmentResult",
    "shift_layer_from_rates",
]


# --------------------------------------------------------------------------- results


#: The columns of `AlignmentResult.to_pandas()` (and of `ShiftReport.to_pandas()` and shift.csv).
SHIFT_COLUMNS = ("model", "decoder", "layer", "depth", "metric", "value", "ci_low", "ci_high", "n")
#: The metrics of those frames, in the order of their rows at each layer.
SHIFT_METRICS = ("in_match", "out_match", "cos_in", "cos_out", "projection", "shift_depth")


@dataclass(frozen=True)
class AlignmentResult(Displayable, renderer="resstream.reporting.shift"):
    """Per-layer input/output alignment of one model over a corpus (module docstring).

    Every per-layer tuple is indexed by layer 0..L (0 = the embedding output h_0). The match
    CIs are 95% cluster intervals over sequences (`resstream.analysis.stats`): (nan, nan) with
    a single sequence, zero width when every sequence has the same rate; clipped to [0, 1].
    `shift_depths[l]` counts positions whose per-token shift depth is l; `never_shifted` the
    rest, so sum(shift_depths) + never_shifted = num_tokens.

    `to_pandas()` columns (`SHIFT_COLUMNS`), one row per layer and metric: model — the
    model's name; decoder — "logit-lens", "embedding" or "tuned"; layer — 0..L (0 = the
    embedding output); depth — layer / L; metric — one of `SHIFT_METRICS`: in_match and
    out_match (the top-k match rates), cos_in, cos_out, projection, and shift_depth (the
    share of the scored positions whose per-token shift depth is this layer:
    shift_depths[l] / num_tokens; the rest never shift); value — the metric's value;
    ci_low, ci_high — the 95% interval of in_match and out_match (missing with a single
    sequence, and for the other metrics); n — the positions the value is a mean or share over
    (num_tokens; num_projection_tokens for projection, missing where unrecorded), so value × n
    of the shift_depth rows gives back the counts. In a notebook the result shows these values per
    layer and the figures `resstream shift` writes.
    """

    model: str
    num_layers: int
    layers: tuple[int, ...]
    in_match: tuple[float, ...]
    out_match: tuple[float, ...]
    in_match_ci: tuple[tuple[float, float], ...]
    out_match_ci: tuple[tuple[float, float], ...]
    cos_in: tuple[float, ...]
    cos_out: tuple[float, ...]
    projection: tuple[float, ...]
    shift_layer: float | None
    shift_depths: tuple[int, ...]
    never_shifted: int
    num_tokens: int
    num_sequences: int
    top_k: int
    decoder: str
    num_projection_tokens: int = 0
    tied: bool | None = None  # whether the model's W_U is its W_E
    decoding: str = ""  # what the decoder applies, in words (`Decoder.description`)
    sample: str = ""  # how the scored sequences were chosen, in words

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists instead of tuples, None instead of nan)."""
        return jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AlignmentResult:
        """Inverse of `to_dict` (a shift.json "models" entry): lists become tuples and the
        None that stood for nan is nan again; fields the entry lacks keep their defaults."""
        known = {f.name for f in fields(cls)}
        values = {key: _restored(value) for key, value in data.items() if key in known}
        return cls(**values)

    @property
    def shift_text(self) -> str:
        """The shift layer in words, as every output says it: ``shift layer 0.78 of 6``, or
        the sentence that says the shift never happens in this model's layers."""
        if self.shift_layer is None:
            return (
                f"the next token never overtakes the input token in its {self.num_layers} layers, "
                f"so there is no shift layer"
            )
        return f"shift layer {self.shift_layer:.2f} of {self.num_layers}"

    def __repr__(self) -> str:
        return summary(
            self,
            f"{self.model!r}: {self.shift_text}",
            f"top-{self.top_k} {self.decoder}",
            f"{self.num_tokens:,} positions in {self.num_sequences} sequences",
            ".to_dict() has every field",
        )


def _restored(value: Any) -> Any:
    """A JSON value of `AlignmentResult.to_dict` as the field held it: lists as tuples, None
    inside a list as nan (a top-level None, e.g. a shift layer never reached, stays None)."""
    if isinstance(value, list):
        return tuple(math.nan if v is None else _restored(v) for v in value)
    return value


def shift_layer_from_rates(in_match: Sequence[float], out_match: Sequence[float]) -> float | None:
    """First depth where out_match − in_match turns positive, interpolated linearly.

    0.0 if the difference is already positive at layer 0; otherwise the zero crossing between
    the last non-positive layer l−1 and the first positive layer l:
    (l − 1) + d_{l−1} / (d_{l−1} − d_l); None if it never turns positive (or rates are nan).
    """
    diffs = [o - i for i, o in zip(in_match, out_match, strict=True)]
    for layer, diff in enumerate(diffs):
        if diff > 0:
            if layer == 0:
                return 0.0
            prev = diffs[layer - 1]
            return (layer - 1) + (0.0 - prev) / (diff - prev)
    return None


# --------------------------------------------------------------------------- accumulation


@dataclass
class _SequenceStats:
    """Per-sequence sums of one batch, (B, L+1) each (fp64 for means, int64 for counts)."""

    positions: Tensor
    in_hits: Tensor
    out_hits: Tensor
    cos_in: Tensor
    cos_out: Tensor
    projection: Tensor
    projection_count: Tensor


@dataclass
class AlignmentPart:
    """One batch's contribution to an `AlignmentAccumulator` (`measure`, then `add`): its
    per-sequence sums and its count of positions per shift depth (last slot: never)."""

    sequences: _SequenceStats
    depth_counts: Tensor


class AlignmentAccumulator:
    """Streams batches of residual states into the alignment metrics (module docstring).

    `update(states, tokens)` takes states (L+1, B, T, d) — h_0..h_L, before the final norm —
    and tokens (B, T); positions 0..T−2 are scored. Batches may have different B and T.
    `W_E` and `W_U` give the input / output token vectors of the cosine and projection
    metrics; `decoder` gives the scores of the match rates, evaluated exactly
    (`Decoder.exact`; `screen`, the rank engine's `low_precision`, `chunk_bytes` and
    `sync_free` (`ScreenOptions`), tune that evaluation and change no result).
    """

    def __init__(
        self,
        *,
        num_layers: int,
        top_k: int,
        decoder: Decoder,
        W_E: Tensor,
        W_U: Tensor,
        **screen: Unpack[ScreenOptions],
    ) -> None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0:
            raise ValueError(f"num_layers = {num_layers!r}; allowed: an integer >= 0")
        if not isinstance(decoder, Decoder):
            raise TypeError(f"decoder must be a Decoder, got {type(decoder).__name__}")
        check_matrix("W_E", W_E)
        check_matrix("W_U", W_U)
        vocab, d = decoder.matrix.shape
        for name, mat in (("W_E", W_E), ("W_U", W_U)):
            if tuple(mat.shape) != (vocab, d):
                raise ValueError(
                    f"{name} has shape {tuple(mat.shape)} but the decoder matrix has {(vocab, d)}"
                )
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= vocab:
            raise ValueError(f"top_k = {top_k!r}; allowed: an integer from 1 to the vocabulary size {vocab}")
        self.num_layers = num_layers
        self.top_k = top_k
        self.decoder = decoder
        self.vocab, self.d_model = vocab, d
        self.W_E, self.W_U = W_E, W_U
        self.scorer = decoder.exact(**screen)
        self._batches: list[_SequenceStats] = []
        self._depth_counts = torch.zeros(num_layers + 2, dtype=torch.int64)  # last slot: never

    # ----------------------------------------------------------------- update

    def update(self, states: Tensor, tokens: Tensor) -> None:
        """Add one batch: states (L+1, B, T, d) before the final norm, tokens (B, T) integer."""
        self.add(self.measure(states, tokens))

    def add(self, part: AlignmentPart) -> None:
        """Add one batch's `measure`: batches added in the same order give the same result,
        whichever process measured them (`resstream.distributed.run_sharded`)."""
        self._depth_counts += part.depth_counts
        self._batches.append(part.sequences)

    def measure(self, states: Tensor, tokens: Tensor) -> AlignmentPart:
        """One batch's contribution (`update`'s arguments), not yet added."""
        self._check_batch(states, tokens)
        batch, length = tokens.shape
        dev = self.scorer.engine.device
        inp = tokens[:, :-1].reshape(-1).to(dev)
        out = tokens[:, 1:].reshape(-1).to(dev)
        targets = torch.stack([inp, out], dim=1)
        a = self.W_E[inp.to(self.W_E.device)].to(dev, torch.float64)
        b = self.W_U[out.to(self.W_U.device)].to(dev, torch.float64)
        skip = (inp == out) | (a == b).all(1)
        ranks: list[Tensor] = []
        geometry: list[tuple[Tensor, ...]] = []
        depth = torch.full((inp.numel(),), self.num_layers + 1, dtype=torch.int64, device=dev)
        with torch.no_grad(), self._deferred():  # one host synchronisation per batch, at its end
            for layer in range(self.num_layers + 1):
                h = states[layer][:, :-1]
                layer_ranks, shifted = self._layer_ranks(h, targets, layer)
                depth = torch.where((depth > self.num_layers) & shifted, layer, depth)
                ranks.append(layer_ranks)
                geometry.append(_geometry(h.reshape(-1, self.d_model).to(dev, torch.float64), a, b, skip))
        hits = [r < self.top_k for r in ranks]  # the ranks are final once the block has ended
        per_layer = [(hit[:, 0], hit[:, 1], *geo) for hit, geo in zip(hits, geometry, strict=True)]
        return AlignmentPart(
            self._per_sequence(per_layer, skip, batch, length - 1),
            torch.bincount(depth.cpu(), minlength=self.num_layers + 2),
        )

    def _check_batch(self, states: Tensor, tokens: Tensor) -> None:
        if not isinstance(states, Tensor) or states.dim() != 4:
            shape = tuple(states.shape) if isinstance(states, Tensor) else type(states).__name__
            raise ValueError(f"states must be (L+1, batch, positions, d_model), got {shape}")
        if not isinstance(tokens, Tensor) or tokens.dim() != 2:
            shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be (batch, positions), got {shape}")
        want = (self.num_layers + 1, *tokens.shape, self.d_model)
        if tuple(states.shape) != want:
            raise ValueError(
                f"states have shape {tuple(states.shape)}, expected {want} "
                f"(layers 0..{self.num_layers}, tokens {tuple(tokens.shape)}, d_model {self.d_model})"
            )
        if tokens.shape[1] < 2:
            raise ValueError(
                f"sequences of {tokens.shape[1]} token(s); need at least 2 to score a next token"
            )
        if not states.is_floating_point():
            raise ValueError(f"states must be floating point, got {states.dtype}")
        check_ids("tokens", tokens, tuple(tokens.shape), self.vocab)

    @contextlib.contextmanager
    def _deferred(self) -> Iterator[None]:
        """The scorer's deferred block over the layers of a batch (one `ranks` call per layer,
        so a call's index is its layer): inf or nan refused naming the first such layer."""
        try:
            with self.scorer.deferred():
                yield
        except NonFiniteInputs as found:
            raise NonFiniteInputs(
                f"non-finite values in the decoder inputs of layer {found.call}: {NonFiniteInputs.HINT}"
            ) from None

    def _layer_ranks(self, h: Tensor, targets: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        """min(rank, top_k) of both targets (n, 2), final once the deferred block has ended,
        and 'next token above input token' (n,) for one layer."""
        h = h.reshape(-1, self.d_model)
        scorer = self.scorer.at(layer)
        if self.top_k >= self.vocab:  # every token is in the top-vocab: only scores needed
            try:  # checked here, synchronously: a rare query
                scores = scorer.scores(h, targets)
            except NonFiniteInputs:
                raise NonFiniteInputs(NonFiniteInputs.HINT, call=layer) from None
            return torch.zeros_like(targets), scores[:, 1] > scores[:, 0]
        ranks, scores = scorer.ranks(h, targets, self.top_k, ids_checked=True)
        return ranks, scores[:, 1] > scores[:, 0]

    def _per_sequence(
        self, per_layer: list[tuple[Tensor, ...]], skip: Tensor, batch: int, n_pos: int
    ) -> _SequenceStats:
        def stack(i: int, dtype: torch.dtype) -> Tensor:
            cols = [vals[i].reshape(batch, n_pos).to(dtype).sum(1) for vals in per_layer]
            return torch.stack(cols, dim=1).cpu()

        proj_count = (~skip).reshape(batch, n_pos).sum(1, keepdim=True).expand(batch, len(per_layer))
        return _SequenceStats(
            positions=torch.full((batch,), n_pos, dtype=torch.int64),
            in_hits=stack(0, torch.int64),
            out_hits=stack(1, torch.int64),
            cos_in=stack(2, torch.float64),
            cos_out=stack(3, torch.float64),
            projection=stack(4, torch.float64),
            projection_count=proj_count.cpu().clone(),
        )

    # ----------------------------------------------------------------- result

    def result(self, model: str, *, sample: str = "") -> AlignmentResult:
        """The metrics over every batch added so far, labelled with the `model`'s name and
        the description of its `sample`; the decoder describes itself."""
        if not self._batches:
            raise ValueError("no batches were added: call update() with at least one batch first")
        cat = {
            name: torch.cat([getattr(s, name) for s in self._batches])
            for name in _SequenceStats.__dataclass_fields__
        }
        n_seq = cat["positions"].numel()
        layers = tuple(range(self.num_layers + 1))
        pos = cat["positions"].tolist()
        in_match = _rates(cat["in_hits"], pos)
        out_match = _rates(cat["out_hits"], pos)
        counts = self._depth_counts.tolist()
        proj_counts = cat["projection_count"][:, 0].tolist()
        return AlignmentResult(
            model=model,
            num_layers=self.num_layers,
            layers=layers,
            in_match=in_match,
            out_match=out_match,
            in_match_ci=_cis(cat["in_hits"], pos),
            out_match_ci=_cis(cat["out_hits"], pos),
            cos_in=_rates(cat["cos_in"], pos),
            cos_out=_rates(cat["cos_out"], pos),
            projection=_rates(cat["projection"], proj_counts),
            shift_layer=shift_layer_from_rates(in_match, out_match),
            shift_depths=tuple(counts[:-1]),
            never_shifted=counts[-1],
            num_tokens=int(sum(pos)),
            num_sequences=n_seq,
            top_k=self.top_k,
            decoder=self.decoder.kind,
            num_projection_tokens=int(sum(proj_counts)),
            tied=self.decoder.tied,
            decoding=self.decoder.description,
            sample=sample,
        )


def _rates(sums: Tensor, counts: list[int]) -> tuple[float, ...]:
    """Per-layer Σ_sequences sums / Σ counts (sums: (S, L+1))."""
    return tuple(cluster_ratio(sums[:, layer].tolist(), counts) for layer in range(sums.shape[1]))


def _cis(sums: Tensor, counts: list[int]) -> tuple[tuple[float, float], ...]:
    return tuple(cluster_ratio_ci(sums[:, layer].tolist(), counts) for layer in range(sums.shape[1]))


def _geometry(h: Tensor, a: Tensor, b: Tensor, skip: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-position cos(h, a), cos(h, b) and projection on a → b (0 where skipped), in fp64."""
    hh, aa, bb = h.square().sum(1), a.square().sum(1), b.square().sum(1)
    cos_in = _safe_div((h * a).sum(1), (hh * aa).sqrt())
    cos_out = _safe_div((h * b).sum(1), (hh * bb).sqrt())
    h_hat = h * _safe_div(aa.sqrt(), hh.sqrt())[:, None]
    axis = b - a
    proj = _safe_div(((h_hat - a) * axis).sum(1), axis.square().sum(1))
    return cos_in, cos_out, torch.where(skip, torch.zeros_like(proj), proj)


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den, 0 where den is 0."""
    return torch.where(
        den > 0,
        num / torch.where(den > 0, den, torch.ones_like(den)),
        torch.zeros_like(num),
    )
