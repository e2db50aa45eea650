"""Running interventions: many at once, each restarting from the first block it changes.

An `Intervention` is a set of `Edit`s applied together in one forward (one edit per
component: "set this component to these values at these positions"). `run_interventions`
sorts interventions by the first block they change, and runs each group as one batch: the
batch starts from that block's recorded input in the base run (`runs.Run`), each batch row
carrying its own edits, and calls the remaining blocks with the arguments the model called
them with. Edits are applied by hooks on the modules that produce or read each component
(`points`):

* a head (and an attention source): the output projection's input z, its head's slice;
* a neuron: the MLP output projection's input m, its coefficient;
* an attention or MLP block: the module's output (before any post-norm);
* a residual state (and the embedding): the block input itself.

An edit is an operation on its component's activation (`operations`: set, shift, add,
scale, project, a user's function), applied where `points` hooks each kind. Everything
downstream — post-norms included — is the model's own computation. The final
state at the prediction's position is returned (`final_states`); `metrics` turns it into
log-probabilities and logits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.operations import Operation, Replace, Shift, write
from resstream.analysis.interventions.points import hook_point, point_of, split_heads, trailing_index
from resstream.analysis.interventions.runs import Run, Values
from resstream.capture.hooks import first_tensor

#: Interventions run together in one batch, at most.
DEFAULT_BATCH = 32


@dataclass(frozen=True, eq=False)
class Edit:
    """`operation` on `component`'s activation at `positions` (P,) (`operations`; the shapes:
    `runs` module docstring). An attention source is edited through its head's z_h."""

    component: Component
    positions: Tensor
    operation: Operation

    def change(self, run: Run) -> Tensor:
        """What the edit adds to the component's activation (P, ...) in the base `run` (for
        an attention source, to its head's z_h)."""
        return self.operation.change(lambda: run.activation(self.component, self.positions), self.positions)


Intervention = tuple[Edit, ...]


def edits(components: Sequence[Component], values: Values, positions: Tensor) -> Intervention:
    """One intervention setting every component in `components` from `values`, at `positions`
    (a residual state at its own position only)."""
    return tuple(_set(c, _where(c, positions), values(c, _where(c, positions))) for c in components)


def _set(component: Component, positions: Tensor, value: Tensor) -> Edit:
    """The edit giving `component` `value` at `positions`: a source's value is the change of
    its head's z_h, added to it."""
    operation = Shift(value) if component.kind == "source" else Replace(value)
    return Edit(component, positions, operation)


def _where(component: Component, positions: Tensor) -> Tensor:
    if component.kind == "resid":
        return torch.tensor([component.position], dtype=torch.long)
    return positions


def start_of(intervention: Intervention) -> int:
    """The first block an intervention changes."""
    return min(edit.component.start for edit in intervention)


def run_interventions(
    run: Run,
    interventions: Sequence[Intervention],
    position: int,
    *,
    batch_size: int = DEFAULT_BATCH,
    progress: Callable[[int], None] | None = None,
) -> Tensor:
    """The final state h_L at `position` (N, d) of the base `run` under each intervention (in
    the order given), batched by the block each starts from (module docstring)."""
    if not interventions:
        return run.block_input(run.view.n_layers)[position].new_zeros((0, run.view.d_model))
    out: list[Tensor | None] = [None] * len(interventions)
    order = sorted(range(len(interventions)), key=lambda i: start_of(interventions[i]))
    for chunk in _chunks(order, interventions, batch_size):
        finals = _run_batch(run, [interventions[i] for i in chunk], position)
        for row, index in enumerate(chunk):
            out[index] = finals[row]
        if progress is not None:
            progress(len(chunk))
    return torch.stack([t for t in out if t is not None])


def _chunks(order: list[int], interventions: Sequence[Intervention], size: int) -> Iterator[list[int]]:
    """Consecutive runs of `order` that share a start block, at most `size` long."""
    chunk: list[int] = []
    for index in order:
        if chunk and (
            len(chunk) == size or start_of(interventions[index]) != start_of(interventions[chunk[0]])
        ):
            yield chunk
            chunk = []
        chunk.append(index)
    if chunk:
        yield chunk


def _run_batch(run: Run, batch: list[Intervention], position: int) -> Tensor:
    """Blocks start..L−1 on a batch of rows, each row with its edits; h_L at `position`."""
    view = run.view
    start = start_of(batch[0])
    table = _EditTable(view, batch)
    h = run.block_input(start).unsqueeze(0).expand(len(batch), -1, -1).clone()
    with torch.no_grad(), table.hooks():
        for layer in range(start, view.n_layers):
            h = table.set_states(layer, h)
            args, kwargs = run.calls[layer].with_state(h)
            h = first_tensor(view.blocks[layer].module(*args, **kwargs))
        h = table.set_states(view.n_layers, h)
    return h[:, position]


class _EditTable:
    """A batch's edits, by the hook point that applies them (`points`)."""

    def __init__(self, view: Any, batch: list[Intervention]) -> None:
        self.view = view
        self.by_point: dict[tuple[str, int], list[tuple[int, Edit]]] = defaultdict(list)
        for row, intervention in enumerate(batch):
            for edit in intervention:
                self.by_point[point_of(edit.component)].append((row, edit))

    def set_states(self, layer: int, h: Tensor) -> Tensor:
        """h with the residual-state edits of block input `layer` applied."""
        found = self.by_point.get(("state", layer))
        if not found:
            return h
        h = h.clone()
        for row, edit in found:
            write(h, (row, edit.positions.to(h.device)), edit.operation, edit.positions)
        return h

    @contextmanager
    def hooks(self) -> Iterator[None]:
        handles = []
        try:
            for (where, layer), found in self.by_point.items():
                if where != "state":  # residual states: `set_states`, between the block calls
                    handles += hook_point(self.view, where, layer, _rewrite(where, layer, found, self.view))
            yield
        finally:
            for handle in handles:
                handle.remove()


def _rewrite(where: str, layer: int, found: list[tuple[int, Edit]], view: Any) -> Callable[[Tensor], Tensor]:
    """The rewrite of a hooked tensor (batch, seq, ...) applying each row's edits there."""
    columns = [trailing_index(view, edit.component) for _, edit in found]

    def apply(x: Tensor) -> Tensor:
        out = x.clone()
        target = split_heads(view, where, layer, out)
        for (row, edit), column in zip(found, columns, strict=True):
            index = (row, edit.positions.to(x.device), *(() if column is None else (column,)))
            write(target, index, edit.operation, edit.positions)
        return out

    return apply


__all__ = ["DEFAULT_BATCH", "Edit", "Intervention", "edits", "run_interventions", "start_of"]
