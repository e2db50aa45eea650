"""Decoding trajectories: what each layer's residual state decodes to, position by position.

For every scored position i and every depth l = 0..L, the top-k token ids of
`decode(h_l(i))` (the logit lens: W_U · final_norm(h) + b, or the embedding decoder W_E · h).
Consecutive layers whose top-1 decoding is the same token are merged into ranges, e.g.
"0–6: ' the'", "7–11: ' cat'". A cell is marked when it equals the input token t_i or the
next token t_{i+1}.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


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
class LensResult:
    """Decoding trajectories of a text (or a position range of it)."""

    model: str
    decoder: str
    top_k: int
    num_layers: int
    trajectories: tuple[PositionTrajectory, ...]
    decoding: str = ""  # what the decoder applies, in words

    def to_dict(self, token_text: Callable[[int], str] | None = None) -> dict:
        """Plain data for lens.json; `token_text` adds the decoded strings."""

        def text(tok: int | None) -> str | None:
            return None if tok is None or token_text is None else token_text(tok)

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
    decode: Callable[[Tensor], Tensor],
    *,
    top_k: int = 1,
    positions: range | None = None,
    model: str = "model",
    decoder: str = "logit-lens",
) -> LensResult:
    """Top-k decodings of every layer's state at each position of one text.

    states: (L+1, T, d) residual states of one sequence; token_ids: (T,);
    decode: maps (n, d) states to (n, vocab) scores (fp32 recommended).
    """
    if states.dim() != 3 or states.shape[1] != token_ids.shape[0]:
        raise ValueError(
            f"states must be (L+1, T, d) with T = {token_ids.shape[0]}, got {tuple(states.shape)}"
        )
    length = token_ids.shape[0]
    chosen = positions if positions is not None else range(length)
    if len(chosen) == 0 or chosen.start < 0 or chosen.stop > length:
        raise ValueError(f"positions {chosen.start}:{chosen.stop} are outside the text's 0:{length}")
    index = torch.tensor(list(chosen), dtype=torch.long)
    with torch.inference_mode():
        picked = states[:, index]  # (L+1, P, d)
        scores = decode(picked.reshape(-1, picked.shape[-1]))
        if not 1 <= top_k <= scores.shape[-1]:
            raise ValueError(f"top_k {top_k} is outside [1, {scores.shape[-1]}]")
        top = scores.topk(top_k, dim=-1).indices.reshape(picked.shape[0], picked.shape[1], top_k)
    ids = token_ids.tolist()
    result = tuple(
        PositionTrajectory(
            position=pos,
            input_id=ids[pos],
            next_id=ids[pos + 1] if pos + 1 < length else None,
            top_ids=tuple(tuple(top[layer, j].tolist()) for layer in range(top.shape[0])),
        )
        for j, pos in enumerate(chosen)
    )
    return LensResult(model, decoder, top_k, states.shape[0] - 1, result)
