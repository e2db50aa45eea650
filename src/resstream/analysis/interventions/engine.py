"""Running interventions: many at once, each restarting from the first block it changes.

An `Intervention` is a set of `Edit`s applied together in one forward (one edit per
component: "set this component to these values at these positions"). `run_interventions`
sorts interventions by the first block they change, and runs each group as one batch: the
batch starts from that block's recorded input in the base run (`runs.Run`), each batch row
carrying its own edits, and calls the remaining blocks with the arguments the model called
them with. Edits are applied by hooks on the modules that produce or read each component:

* a head (and an attention source): the output projection's input z, its head's slice;
* a neuron: the MLP output projection's input m, its coefficient;
* an attention or MLP block: the module's output (before any post-norm);
* a residual state (and the embedding): the block input itself.

Everything downstream — post-norms included — is the model's own computation. The final
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
from torch import Tensor, nn

from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.runs import Run, Values, neuron_columns
from resstream.capture.hooks import first_tensor

#: Interventions run together in one batch, at most.
DEFAULT_BATCH = 32


@dataclass(frozen=True, eq=False)
class Edit:
    """Set `component` to `value` at `positions` (P,): `value` (P, ...) in the component's
    activation shape (`runs` module docstring), for an attention source the change of z_h."""

    component: Component
    positions: Tensor
    value: Tensor


Intervention = tuple[Edit, ...]


def edits(components: Sequence[Component], values: Values, positions: Tensor) -> Intervention:
    """One intervention setting every component in `components` from `values`, at `positions`
    (a residual state at its own position only)."""
    return tuple(Edit(c, _where(c, positions), values(c, _where(c, positions))) for c in components)


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
    """A batch's edits, by the module hook that applies them (module docstring)."""

    def __init__(self, view: Any, batch: list[Intervention]) -> None:
        self.view = view
        self.by_kind: dict[tuple[str, int], list[tuple[int, Edit]]] = defaultdict(list)
        for row, intervention in enumerate(batch):
            for edit in intervention:
                c = edit.component
                key = ("state", c.start) if c.kind in ("emb", "resid") else (_HOOKED[c.kind], c.layer)
                self.by_kind[key].append((row, edit))

    def set_states(self, layer: int, h: Tensor) -> Tensor:
        """h with the residual-state edits of block input `layer` applied."""
        found = self.by_kind.get(("state", layer))
        if not found:
            return h
        h = h.clone()
        for row, edit in found:
            h[row, edit.positions.to(h.device)] = edit.value.to(h.device, h.dtype)
        return h

    @contextmanager
    def hooks(self) -> Iterator[None]:
        handles = []
        try:
            for (where, layer), found in self.by_kind.items():
                if where == "state":
                    continue
                block = self.view.blocks[layer]
                if where == "z":
                    hook = _input_hook(_set_heads(found, block.W_O.shape[0]))
                    handles.append(block.out_proj.register_forward_pre_hook(hook))
                elif where == "m":
                    handles += block.hook_coefficients(_set_neurons(found, self.view))
                else:
                    module = block.attn if where == "attn" else block.mlp
                    handles.append(module.register_forward_hook(_output_hook(_set_rows(found))))
            yield
        finally:
            for handle in handles:
                handle.remove()


#: Which hook applies each kind of edit: z (the output projection's input), m (the MLP output
#: projection's input), or a module's output.
_HOOKED = {"head": "z", "source": "z", "neuron": "m", "expert": "m", "attn": "attn", "mlp": "mlp"}


def _set_heads(found: list[tuple[int, Edit]], n_heads: int) -> Callable[[Tensor], Tensor]:
    def apply(z: Tensor) -> Tensor:
        split = z.clone().unflatten(-1, (n_heads, -1))
        for row, edit in found:
            pos, head = edit.positions.to(z.device), edit.component.index
            value = edit.value.to(z.device, z.dtype)
            if edit.component.kind == "source":
                split[row, pos, head] += value
            else:
                split[row, pos, head] = value
        return split.flatten(-2)

    return apply


def _set_neurons(found: list[tuple[int, Edit]], view: Any) -> Callable[[Tensor], Tensor]:
    columns = [neuron_columns(view, edit.component) for _, edit in found]

    def apply(m: Tensor) -> Tensor:
        m = m.clone()
        for (row, edit), column in zip(found, columns, strict=True):
            m[row, edit.positions.to(m.device), column] = edit.value.to(m.device, m.dtype)
        return m

    return apply


def _set_rows(found: list[tuple[int, Edit]]) -> Callable[[Tensor], Tensor]:
    def apply(out: Tensor) -> Tensor:
        out = out.clone()
        for row, edit in found:
            out[row, edit.positions.to(out.device)] = edit.value.to(out.device, out.dtype)
        return out

    return apply


def _input_hook(apply: Callable[[Tensor], Tensor]) -> Callable[..., tuple[Any, ...]]:
    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (apply(args[0]), *args[1:])

    return hook


def _output_hook(apply: Callable[[Tensor], Tensor]) -> Callable[..., Any]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if isinstance(output, Tensor):
            return apply(output)
        if isinstance(output, tuple):
            return (apply(output[0]), *output[1:])
        raise TypeError(f"cannot edit a {type(output).__name__} module output")

    return hook


__all__ = ["DEFAULT_BATCH", "Edit", "Intervention", "edits", "run_interventions", "start_of"]
