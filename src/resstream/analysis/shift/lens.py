"""Decoding trajectories: what each layer's residual state decodes to, position by position.

For every scored position i and every depth l = 0..L, the top-k token ids of the decoder's
scores of h_l(i) (`resstream.analysis.decoding.decoder`: the logit lens or the embedding decoder),
exact and ordered by score with ties broken by the lower id, and the exact ranks of the input
token t_i and of the next token t_{i+1} — the ranks `shift` counts, so a rank below k here is
a top-k hit there. Each of these tokens also gets its probability: the softmax of the same
decoder's scores (`Decoder.logits`, soft-capping included), so at the last layer the logit
lens gives the model's own next-token probabilities. Consecutive layers whose top-1
decoding is the same token are merged into ranges, e.g. "0–6: ' the'", "7–11: ' cat'". A
range is marked when its token is the input token t_i or the next token t_{i+1}.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from resstream.analysis.decoding.decoder import ExactScorer, NonFiniteInputs
from resstream.display import Displayable
from resstream.reprs import summary

#: The columns of `LensResult.to_pandas()`.
LENS_COLUMNS = (
    "position",
    "input_token",
    "next_token",
    "layer",
    "rank",
    "token_id",
    "token",
    "probability",
    "input_rank",
    "input_probability",
    "next_rank",
    "next_probability",
)


@dataclass(frozen=True)
class LayerRange:
    """Layers `first`..`last` (inclusive) whose top-1 decoding is `token_id`."""

    first: int
    last: int
    token_id: int

    @property
    def label(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}–{self.last}"


@dataclass(frozen=True)
class PositionTrajectory:
    """One position's decodings across depth."""

    position: int
    input_id: int
    next_id: int | None  # None at the last position of the text
    top_ids: tuple[tuple[int, ...], ...]  # [layer][rank], rank 0 = top-1
    input_ranks: tuple[int, ...] = ()  # [layer]: entries scoring strictly above t_i
    next_ranks: tuple[int, ...] | None = None  # [layer]: the same for t_{i+1}; None at the end
    top_probs: tuple[tuple[float, ...], ...] = ()  # [layer][rank]: probability of top_ids
    input_probs: tuple[float, ...] = ()  # [layer]: probability of t_i
    next_probs: tuple[float, ...] | None = None  # [layer]: probability of t_{i+1}; None at the end

    @property
    def top1(self) -> tuple[int, ...]:
        return tuple(ids[0] for ids in self.top_ids)

    def ranges(self) -> tuple[LayerRange, ...]:
        """Consecutive layers with the same top-1 decoding, merged."""
        return merge_ranges(self.top1)

    def first_layer_of(self, token_id: int | None) -> int | None:
        """The first layer whose top-1 decoding is `token_id` (None if never)."""
        if token_id is None:
            return None
        return next((layer for layer, tok in enumerate(self.top1) if tok == token_id), None)


@dataclass(frozen=True)
class LensResult(Displayable, renderer="resstream.reporting.lens"):
    """Decoding trajectories of a text (or a position range of it), with the text of every
    token they mention, so the result renders itself (`token_text`).

    `to_pandas()` columns (`LENS_COLUMNS`), one row per position, layer and top-k decoding:
    position — the token position in the text; input_token — the token there (t_i);
    next_token — the token after it (t_{i+1}; missing at the text's last position); layer —
    0..L (0 = the embedding output); rank — 0..top_k − 1, the decoding's place in the layer's
    top-k (0 = top-1, as every rank in resstream; ties ordered by the lower id); token_id,
    token — the decoded token's id and text; probability — its probability under the softmax
    of the decoder's scores; input_rank, next_rank — the exact rank of t_i and of t_{i+1} at
    that layer as lens.json counts it: the number of tokens scoring strictly higher (0 = top-1);
    input_probability, next_probability — their probabilities. The last four repeat over a
    layer's top-k rows, and are missing where the result lacks them (t_{i+1} at the text's
    last position, an old lens.json). In a notebook the result shows the table of lens.html
    and the figure of lens.png.
    """

    model: str
    decoder: str
    top_k: int
    num_layers: int
    trajectories: tuple[PositionTrajectory, ...]
    decoding: str = ""  # what the decoder applies, in words
    texts: tuple[tuple[int, str], ...] = ()  # (token id, its text) of every token mentioned

    def __repr__(self) -> str:
        positions = [t.position for t in self.trajectories]
        span = f"{positions[0]}–{positions[-1]}" if positions else "none"
        scored = [t for t in self.trajectories if t.next_id is not None]
        found = sum(t.top1[-1] == t.next_id for t in scored if t.top_ids)
        return summary(
            self,
            f"model={self.model!r}, positions {span} ({len(positions)}), layers 0–{self.num_layers}, "
            f"decoder {self.decoder!r}, top_k={self.top_k}",
            f"layer {self.num_layers} decodes the next token at {found} of {len(scored)} positions"
            if scored
            else "",
        )

    def token_text(self, token_id: int) -> str:
        """The decoded text of a token the result mentions (its id in brackets if unknown)."""
        return self._text_of.get(token_id, f"<{token_id}>")

    @cached_property
    def _text_of(self) -> dict[int, str]:
        return dict(self.texts)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for lens.json, with the decoded strings."""

        def text(tok: int | None) -> str | None:
            return None if tok is None else self.token_text(tok)

        return {
            "model": self.model,
            "decoder": self.decoder,
            "top_k": self.top_k,
            "num_layers": self.num_layers,
            "decoding": self.decoding,
            "positions": [
                {
                    "position": t.position,
                    "input_id": t.input_id,
                    "input": text(t.input_id),
                    "next_id": t.next_id,
                    "next": text(t.next_id),
                    "top_ids": [list(ids) for ids in t.top_ids],
                    "input_ranks": list(t.input_ranks),
                    "next_ranks": None if t.next_ranks is None else list(t.next_ranks),
                    "top_probs": [list(probs) for probs in t.top_probs],
                    "input_probs": list(t.input_probs),
                    "next_probs": None if t.next_probs is None else list(t.next_probs),
                    "ranges": [
                        {
                            "layers": r.label,
                            "token_id": r.token_id,
                            "token": text(r.token_id),
                            "is_input": r.token_id == t.input_id,
                            "is_next": r.token_id == t.next_id,
                        }
                        for r in t.ranges()
                    ],
                }
                for t in self.trajectories
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LensResult:
        """Inverse of `to_dict` (lens.json). The texts are those lens.json names: the input
        and next token of each position and the top-1 token of each range (a top-k token
        below the top-1 is shown by its id)."""
        positions = data["positions"]
        return cls(
            model=data["model"],
            decoder=data["decoder"],
            top_k=int(data["top_k"]),
            num_layers=int(data["num_layers"]),
            trajectories=tuple(_trajectory_from_dict(p) for p in positions),
            decoding=data.get("decoding") or "",
            texts=tuple(_texts_from_dict(positions).items()),
        )


def _nested(rows: Sequence[Sequence[Any]]) -> tuple[tuple[Any, ...], ...]:
    return tuple(tuple(row) for row in rows)


def _optional(values: Sequence[Any] | None) -> tuple[Any, ...] | None:
    return None if values is None else tuple(values)


def _trajectory_from_dict(p: dict[str, Any]) -> PositionTrajectory:
    """One lens.json position as a `PositionTrajectory`."""
    return PositionTrajectory(
        position=int(p["position"]),
        input_id=int(p["input_id"]),
        next_id=p.get("next_id"),
        top_ids=_nested(p["top_ids"]),
        input_ranks=tuple(p.get("input_ranks") or ()),
        next_ranks=_optional(p.get("next_ranks")),
        top_probs=_nested(p.get("top_probs") or ()),
        input_probs=tuple(p.get("input_probs") or ()),
        next_probs=_optional(p.get("next_probs")),
    )


def _texts_from_dict(positions: Sequence[dict[str, Any]]) -> dict[int, str]:
    """Token id → text of every token lens.json positions name."""
    texts: dict[int, str] = {}
    for p in positions:
        texts[int(p["input_id"])] = p["input"]
        if p.get("next_id") is not None:
            texts[int(p["next_id"])] = p["next"]
        for r in p.get("ranges") or ():
            texts[int(r["token_id"])] = r["token"]
    return texts


def merge_ranges(top1: Sequence[int]) -> tuple[LayerRange, ...]:
    """Run-length encode a per-layer sequence of token ids into layer ranges."""
    ranges: list[LayerRange] = []
    for layer, token in enumerate(top1):
        if ranges and ranges[-1].token_id == token:
            ranges[-1] = LayerRange(ranges[-1].first, layer, token)
        else:
            ranges.append(LayerRange(layer, layer, token))
    return tuple(ranges)


def trajectories(
    states: Tensor,
    token_ids: Tensor,
    scorer: ExactScorer,
    *,
    top_k: int = 1,
    positions: range | None = None,
    model: str = "model",
    token_text: Callable[[int], str] | None = None,
    ranks: bool = True,
    probabilities: bool = True,
) -> LensResult:
    """Exact top-k decodings and input/next-token ranks of every layer at each position.

    states: (L+1, T, d) residual states of one sequence; token_ids: (T,); `scorer` the exact
    evaluation of the decoder (`Decoder.exact()`; one with a bf16 screen is rebuilt in fp32,
    whose scores are the logits the probabilities need); `token_text` decodes one token id
    (the result keeps the text of every token it mentions). Each layer screens the vocabulary
    once for its top-k lists, ranks and probabilities (`ExactScorer.decode`); `ranks` and
    `probabilities` False leave those out of the result (empty, as in an old lens.json) and
    out of the work: with both off a layer costs one matmul and a top-k.
    """
    if states.dim() != 3 or states.shape[1] != token_ids.shape[0]:
        raise ValueError(
            f"states must be (L+1, T, d) with T = {token_ids.shape[0]}, got {tuple(states.shape)}"
        )
    length = token_ids.shape[0]
    chosen = positions if positions is not None else range(length)
    if len(chosen) == 0 or chosen.start < 0 or chosen.stop > length:
        raise ValueError(f"positions {chosen.start}:{chosen.stop} are outside the text's 0:{length}")
    vocab = scorer.decoder.vocab_size
    if not 1 <= top_k <= vocab:
        raise ValueError(f"top_k {top_k} is outside [1, {vocab}]")
    if scorer.engine.dtype != torch.float32:  # the probabilities read the screen's scores
        scorer = scorer.decoder.exact(low_precision=None)
    ids = token_ids.tolist()
    depth = states.shape[0]
    _check_finite(states)
    index = torch.tensor(list(chosen), dtype=torch.long)
    targets = _targets(ids, chosen) if ranks else torch.zeros(len(chosen), 0, dtype=torch.long)
    with torch.inference_mode():
        per_layer = [
            scorer.at(layer).decode(states[layer, index], targets, top_k, probabilities=probabilities)
            for layer in range(depth)
        ]
    top = torch.stack([found.top_ids for found in per_layer]).cpu()
    found_ranks = torch.stack([found.ranks for found in per_layer]).cpu()
    probs = torch.stack([found.probabilities() for found in per_layer]).cpu() if probabilities else None
    result = tuple(
        _trajectory(ids, pos, j, top, found_ranks if ranks else None, probs, top_k)
        for j, pos in enumerate(chosen)
    )
    texts = _texts(result, token_text)
    decoder = scorer.decoder
    return LensResult(model, decoder.kind, top_k, depth - 1, result, decoder.description, texts)


def _trajectory(
    ids: list[int], pos: int, j: int, top: Tensor, ranks: Tensor | None, probs: Tensor | None, top_k: int
) -> PositionTrajectory:
    """Position `pos` (column j of the per-layer tensors: top (L+1, P, k), ranks (L+1, P, 2),
    probs (L+1, P, k + 2), or None where not computed) as a `PositionTrajectory`."""
    has_next = pos + 1 < len(ids)
    depth = top.shape[0]
    return PositionTrajectory(
        position=pos,
        input_id=ids[pos],
        next_id=ids[pos + 1] if has_next else None,
        top_ids=tuple(tuple(top[layer, j].tolist()) for layer in range(depth)),
        input_ranks=() if ranks is None else tuple(ranks[:, j, 0].tolist()),
        next_ranks=tuple(ranks[:, j, 1].tolist()) if ranks is not None and has_next else None,
        top_probs=()
        if probs is None
        else tuple(tuple(probs[layer, j, :top_k].tolist()) for layer in range(depth)),
        input_probs=tuple(probs[:, j, top_k].tolist()) if probs is not None and ranks is not None else (),
        next_probs=tuple(probs[:, j, top_k + 1].tolist())
        if probs is not None and ranks is not None and has_next
        else None,
    )


def _check_finite(states: Tensor) -> None:
    """Refuse states holding inf or nan, naming the first such layer (no ranks exist there)."""
    finite = torch.isfinite(states.flatten(1)).all(1)
    if not bool(finite.all()):
        layer = int((~finite).nonzero()[0])
        raise NonFiniteInputs(
            f"non-finite values in the residual state of layer {layer}: {NonFiniteInputs.HINT}"
        )


def _targets(ids: list[int], chosen: range) -> Tensor:
    """The (input, next) token ids (P, 2) of the chosen positions (the last position of the
    text has no next token: its input token stands in, and is ignored)."""
    pairs = [(ids[p], ids[p + 1] if p + 1 < len(ids) else ids[p]) for p in chosen]
    return torch.tensor(pairs, dtype=torch.long)


def _texts(
    trajectories: Sequence[PositionTrajectory], token_text: Callable[[int], str] | None
) -> tuple[tuple[int, str], ...]:
    """(id, text) of every token the trajectories mention, by id (none without a decoder)."""
    if token_text is None:
        return ()
    mentioned = set()
    for t in trajectories:
        mentioned.add(t.input_id)
        if t.next_id is not None:
            mentioned.add(t.next_id)
        for ids in t.top_ids:
            mentioned.update(ids)
    return tuple((tok, token_text(tok)) for tok in sorted(mentioned))
