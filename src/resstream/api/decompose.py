"""`resstream.decompose(...)`: the residual state at one position as named components."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Unpack

from torch import Tensor

from resstream.analysis.attribution.decomposition import Decomposition, point_count, point_name
from resstream.analysis.attribution.decomposition import decompose as decompose_state
from resstream.api.inputs import one_model, takes_load_args
from resstream.api.prediction import PositionArgs, TextRequest
from resstream.api.state_memory import check_text_fits
from resstream.api.texts import TextLike
from resstream.capture import block_internals
from resstream.display import Displayable
from resstream.errors import UsageError
from resstream.models import ModelLike
from resstream.reporting.notebook import (
    SHOWN_ROWS,
    NotebookView,
    frame_table,
    long_frame,
    notebook_view,
    tidy_frame,
)
from resstream.reprs import summary

if TYPE_CHECKING:
    import pandas
    from transformers import PreTrainedTokenizerBase

#: The columns of `DecomposeResult.to_pandas()` (documented there).
DECOMPOSE_COLUMNS = ("component", "kind", "layer", "head", "source", "neuron", "norm", "share")


@dataclass(frozen=True)
class Component:
    """One component of a decomposed state: its name (`label`, `analysis.names`: emb, L1.H3, L1.H3.S5,
    L1.attn_bias, L2.mlp, L2.N712, L2.mlp_bias, L2.norm_bias), `kind` (embed, head, source,
    attn, attn_bias, neuron, mlp, mlp_bias, norm_bias), where it is (None where it does not
    apply), its norm ‖v‖ and its `share` ⟨v, h⟩ / ‖h‖² of the state h (the shares of all
    components sum to 1 within the decomposition's residual)."""

    label: str
    kind: str
    layer: int | None
    head: int | None
    source: int | None  # the source position of a head's source term
    neuron: int | None
    norm: float
    share: float


@dataclass(frozen=True, eq=False)
class DecomposeResult(Displayable):
    """The state at residual point `point` of token `position` as components: `vectors[c]`
    is component `components[c]` (its label `labels[c]`: emb, L1.H3, L1.H3.S5,
    L1.attn_bias, L2.mlp, L2.N712, ...); they sum to `state` within `residual` (max |Σ − h|;
    `relative`: over ‖h‖).

    `to_pandas()` columns (`DECOMPOSE_COLUMNS`), one row per component in stream order, empty
    where a column does not apply: component — its label; kind — embed, head, source, attn,
    attn_bias, neuron, mlp, mlp_bias or norm_bias; layer — its block (from 0); head — the
    attention head (head and source); source — the position a source term comes from;
    neuron — the FFN neuron; norm — ‖v‖; share — ⟨v, h⟩ / ‖h‖², its part of the state along
    the state's own direction (the shares sum to 1 within the residual). The same values as
    `to_dict()["components"]`. In a notebook the result shows the components with the largest
    norm.
    """

    model: str
    tokens: tuple[str, ...]
    position: int
    point: str
    components: tuple[Component, ...]
    vectors: Tensor  # (C, d_model)
    state: Tensor  # (d_model,)
    residual: float
    relative: float

    @property
    def labels(self) -> tuple[str, ...]:
        """Every component's name, in the order of `vectors`."""
        return tuple(component.label for component in self.components)

    def __repr__(self) -> str:
        token = self.tokens[self.position] if 0 <= self.position < len(self.tokens) else ""
        top = self.largest(1)
        largest = f", largest ‖v‖ {top[0][0]} {top[0][1]:.3g}" if top else ""
        return summary(
            self,
            f"{self.model}: {self.point} at position {self.position} {token!r}",
            f"{len(self.components)} components, max |Σ − h| {self.residual:.1e}{largest}",
        )

    def largest(self, n: int = 10) -> list[tuple[str, float]]:
        """The `n` components with the largest norm, as (label, norm)."""
        ranked = sorted(self.components, key=lambda component: -component.norm)[:n]
        return [(component.label, component.norm) for component in ranked]

    def to_dict(self) -> dict[str, Any]:
        """The components (label, kind, place, norm, share) and the check (the vectors
        themselves stay tensors)."""
        return {
            "model": self.model,
            "tokens": list(self.tokens),
            "position": self.position,
            "point": self.point,
            "residual": self.residual,
            "relative": self.relative,
            "components": [asdict(component) for component in self.components],
        }


@tidy_frame.register(DecomposeResult)
def decompose_frame(result: DecomposeResult) -> pandas.DataFrame:
    """`result`'s components as a long frame (`DECOMPOSE_COLUMNS`), in stream order."""
    rows = [
        (c.label, c.kind, c.layer, c.head, c.source, c.neuron, c.norm, c.share) for c in result.components
    ]
    return long_frame(
        DECOMPOSE_COLUMNS, rows, integers=("layer", "head", "source", "neuron"), floats=("norm",)
    )


@notebook_view.register(DecomposeResult)
def decompose_view(result: DecomposeResult) -> NotebookView:
    """The components with the largest norm, as a table (`resstream decompose` has no command
    and draws no figure)."""
    frame = decompose_frame(result)
    shown = frame.sort_values("norm", ascending=False, kind="stable").head(SHOWN_ROWS)
    title = f"the {len(shown)} components with the largest norm, of {len(frame):,}"
    return NotebookView(tables=[frame_table(title, shown)])


def _optional(value: int) -> int | None:
    """A place index of `Decomposition` (−1 where it does not apply) as an int or None."""
    return None if value < 0 else value


def components_of(parts: Decomposition, state: Tensor) -> tuple[Component, ...]:
    """Every component of `parts` at its first position, with its norm and its share of
    `state` (nan shares for a zero state)."""
    vectors = parts.vectors[:, 0].double()
    norms = vectors.norm(dim=-1).tolist()
    h = state.double()
    squared = float(h @ h)
    shares = (vectors @ h / squared).tolist() if squared > 0 else [float("nan")] * len(norms)
    layers, heads, sources, neurons = (
        [_optional(v) for v in index.tolist()]
        for index in (parts.layers, parts.heads, parts.sources, parts.neurons)
    )
    return tuple(
        Component(
            parts.label(i), parts.kind(i), layers[i], heads[i], sources[i], neurons[i], norms[i], shares[i]
        )
        for i in range(len(parts))
    )


@takes_load_args
def decompose(
    text: TextLike | None = None,
    *,
    model: ModelLike = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    point: int | str | None = None,
    sources: bool = False,
    neurons: bool = False,
    progress: bool = False,
    **given: Unpack[PositionArgs],
) -> DecomposeResult:
    """The residual state of token `position` (default the last; negative from the end) of a
    text at residual `point` — an index 0..2L or a name L_in_0, L_res_<l>, L_out_<l> (default:
    the last block's output) — as the embedding, every head (with `sources`, every head's
    attention source) and every MLP (with `neurons`, every neuron and the MLP bias). `text`: a
    string, or token ids (a 1-D integer tensor, a (1, T) tensor or a list of ints, used exactly
    as given; a model object then needs no `tokenizer`). `model` as for `resstream.lens`."""
    asked = TextRequest.of(text, given)
    options = asked.load_options(given, tokenizer=tokenizer, progress=progress, reads_blocks=True)
    with one_model(model, options) as loaded:
        view, encoded = loaded.view, asked.encoded(loaded)
        ids, where = encoded.ids, encoded.position
        chosen = _point(point, view.n_layers)
        check_text_fits(view, ids.shape[1], 1 if sources else 0)
        internals = block_internals(view, ids, attention=[where] if sources else False)
        parts = decompose_state(view, internals, [where], point=chosen, sources=sources, neurons=neurons)
        absolute, relative = parts.residual()
        return DecomposeResult(
            model=loaded.name,
            tokens=encoded.tokens(),
            position=where,
            point=point_name(chosen),
            components=components_of(parts, parts.state[0].detach()),
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


__all__ = [
    "DECOMPOSE_COLUMNS",
    "Component",
    "DecomposeResult",
    "components_of",
    "decompose",
    "decompose_frame",
    "decompose_view",
]
