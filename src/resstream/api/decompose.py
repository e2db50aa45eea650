"""`resstream.decompose(...)`: the residual state at one position as named components."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

from torch import Tensor

from resstream.analysis.attribution.decomposition import decompose as decompose_state
from resstream.analysis.attribution.decomposition import point_count, point_name
from resstream.api.attribute import position_in
from resstream.api.inputs import LoadOptions, encode_text, one_model, takes_load_args, text_of
from resstream.api.tokenizers import tokenizer_of
from resstream.capture import block_internals
from resstream.data.tokenizer import token_text
from resstream.errors import UsageError
from resstream.models import LoadArgs, ModelLike
from resstream.reprs import summary

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True, eq=False)
class DecomposeResult:
    """The state at residual point `point` of token `position` as components: `vectors[c]`
    is component `labels[c]` (embed, L1.H3, L1.H3<-5, L1.attn_bias, L2.mlp, L2.N712, ...);
    they sum to `state` within `residual` (max |Σ − h|; `relative`: over ‖h‖)."""

    model: str
    tokens: tuple[str, ...]
    position: int
    point: str
    labels: tuple[str, ...]
    vectors: Tensor  # (C, d_model)
    state: Tensor  # (d_model,)
    residual: float
    relative: float

    def __repr__(self) -> str:
        return summary(
            self,
            f"{self.model}: {self.point} at position {self.position}",
            f"{len(self.labels)} components, max |Σ − h| {self.residual:.1e}",
        )

    def largest(self, n: int = 10) -> list[tuple[str, float]]:
        """The `n` components with the largest norm, as (label, norm)."""
        norms = self.vectors.double().norm(dim=-1)
        order = norms.argsort(descending=True)[:n].tolist()
        return [(self.labels[i], float(norms[i])) for i in order]

    def to_dict(self) -> dict[str, Any]:
        """Labels, norms and the check (the vectors themselves stay tensors)."""
        norms = self.vectors.double().norm(dim=-1).tolist()
        return {
            "model": self.model,
            "tokens": list(self.tokens),
            "position": self.position,
            "point": self.point,
            "residual": self.residual,
            "relative": self.relative,
            "components": [
                {"label": label, "norm": norm} for label, norm in zip(self.labels, norms, strict=True)
            ],
        }


@takes_load_args
def decompose(
    text: str | None = None,
    *,
    text_file: str | os.PathLike[str] | None = None,
    model: ModelLike = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    position: int | None = None,
    point: int | str | None = None,
    sources: bool = False,
    neurons: bool = False,
    progress: bool = False,
    **load: Unpack[LoadArgs],
) -> DecomposeResult:
    """The residual state of token `position` (default the last; negative from the end) of a
    text at residual `point` — an index 0..2L or a name L_in_0, L_res_<l>, L_out_<l> (default:
    the last block's output) — as the embedding, every head (with `sources`, every head's
    attention source) and every MLP (with `neurons`, every neuron and the MLP bias). `model`
    as for `resstream.lens`."""
    text = text_of(text, text_file)
    options = LoadOptions.of(load, tokenizer=tokenizer, progress=progress)
    with one_model(model, options) as loaded:
        view, tokenizer = loaded.view, tokenizer_of(loaded)
        ids = encode_text(tokenizer, text, view)
        where = position_in(position, ids.shape[1])
        chosen = _point(point, view.n_layers)
        internals = block_internals(view, ids, attention=[where] if sources else False)
        parts = decompose_state(view, internals, [where], point=chosen, sources=sources, neurons=neurons)
        absolute, relative = parts.residual()
        return DecomposeResult(
            model=loaded.name,
            tokens=tuple(token_text(tokenizer, int(t)) for t in ids[0].tolist()),
            position=where,
            point=point_name(chosen),
            labels=tuple(parts.label(i) for i in range(len(parts))),
            vectors=parts.vectors[:, 0].detach(),
            state=parts.state[0].detach(),
            residual=absolute,
            relative=relative,
        )


def _point(point: int | str | None, n_layers: int) -> int:
    """A residual point as its index; UsageError naming the allowed ones."""
    count = point_count(n_layers)
    names = {point_name(i): i for i in range(count)}
    names.update({f"L_in_{layer}": 2 * layer for layer in range(n_layers)})
    if point is None:
        return count - 1
    if isinstance(point, str) and point in names:
        return names[point]
    if isinstance(point, int) and not isinstance(point, bool) and 0 <= point < count:
        return point
    raise UsageError(
        f"`point` {point!r} is not a residual point; allowed: 0..{count - 1} or L_in_0..L_in_{n_layers - 1}, "
        f"L_res_0..L_res_{n_layers - 1}, L_out_0..L_out_{n_layers - 1}"
    )


__all__ = ["DecomposeResult", "decompose"]
