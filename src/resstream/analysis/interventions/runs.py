"""The forward an intervention starts from, and the values it puts in.

`capture_run` runs the model's own forward once and keeps everything an intervention needs:
every block's reads and writes (`capture.block_internals`, attention probabilities included
for attention sources and path patching) and *how the model called each block* — the
arguments beside the hidden state (rotary tables, masks, a residual gate's α). A run that
intervenes at block b then restarts from block b's recorded input and calls blocks b..L−1
itself with those same arguments (`engine`), so nothing below b is recomputed.

Replacement values (`Values`): `zero_values` (zero ablation), `run_values` (the activation of
another run at the same positions: activation patching from a corrupted input, or resample
ablation from another corpus window) and `mean_values` (the mean activation over a corpus
sample, `Means`). A value is what the component is set to, in the shape of its activation at
each position: z_h (d_head) for a head, m_k (scalar) for a neuron, the module output (d_model)
for an attention or MLP block, the state (d_model) for a residual state; for an attention
source it is the change of z_h, α'_{t,j}·v'_j − α_{t,j}·v_j.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from resstream.analysis.attribution.decomposition import head_values
from resstream.analysis.interventions.components import Component
from resstream.capture import block_internals
from resstream.capture.hooks import _block_input
from resstream.errors import UsageError
from resstream.models.adapters.base import Internals, ModelView


@dataclass(frozen=True, eq=False)
class BlockCall:
    """How the model called one block: its positional and keyword arguments, the hidden state
    first (positional) or as `hidden_states`; `with_state(h)` gives them with h put in."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def with_state(self, h: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's arguments with the hidden state replaced by `h` (any batch size: the
        other arguments hold one sequence and broadcast)."""
        if self.args:
            return (h, *self.args[1:]), self.kwargs
        return self.args, {**self.kwargs, "hidden_states": h}


@dataclass(frozen=True, eq=False)
class Run:
    """One recorded forward of `internals.input_ids` (batch, seq) with each block's call."""

    view: ModelView
    internals: Internals
    calls: tuple[BlockCall, ...]

    @property
    def seq_len(self) -> int:
        return int(self.internals.input_ids.shape[1])

    def block_input(self, layer: int, sequence: int = 0) -> Tensor:
        """h_layer (seq, d): the input of block `layer`; layer L is the final state."""
        blocks = self.internals.blocks
        if layer == len(blocks):
            return blocks[-1].block_output[sequence]
        return blocks[layer].block_input[sequence]

    def activation(self, component: Component, positions: Tensor, sequence: int = 0) -> Tensor:
        """The component's activation at `positions` of one sequence (module docstring's
        shapes; for an attention source its term α_{t,j}·v_j, zero where t < j)."""
        if component.kind in ("emb", "resid"):
            return self.block_input(component.start, sequence)[positions]
        rec = self.internals.blocks[component.layer]
        if component.kind == "head":
            return rec.z[sequence, positions, component.index]
        if component.coefficients:
            return rec.coefficients[sequence, positions, neuron_columns(self.view, component)]
        if component.kind == "attn":
            return rec.attn_raw[sequence, positions]
        if component.kind == "mlp":
            return rec.mlp_raw[sequence, positions]
        return self._source_term(component, positions, sequence)

    def _source_term(self, component: Component, positions: Tensor, sequence: int) -> Tensor:
        block, rec = self.view.blocks[component.layer], self.internals.blocks[component.layer]
        j = component.source
        value = head_values(block, rec, sequence, j + 1)[component.index, j]  # (d_head,)
        probs = rec.probs_at(sequence, positions)[component.index, :, j].float()  # (P,)
        return (probs.unsqueeze(-1) * value).to(rec.z.dtype)


def capture_run(view: ModelView, input_ids: Tensor, *, attention: bool = True) -> Run:
    """Record one forward of `input_ids` (batch, seq): every block's internals (with attention
    probabilities of every query row when `attention`) and every block's call."""
    calls: list[BlockCall | None] = [None] * view.n_layers
    handles = [
        block.module.register_forward_pre_hook(_call_recorder(calls, index), with_kwargs=True)
        for index, block in enumerate(view.blocks)
    ]
    try:
        # The blocks are replayed from these calls under the model's own attention: record them
        # under it too (the probabilities from a second, eager forward), so that a replay of an
        # unchanged block gives back exactly the recorded state.
        internals = block_internals(view, input_ids, attention=attention, same_forward=False)
    finally:
        for handle in handles:
            handle.remove()
    missing = [i for i, call in enumerate(calls) if call is None]
    if missing:
        raise RuntimeError(f"the forward did not call blocks {missing}")
    return Run(view, internals, tuple(c for c in calls if c is not None))


def _call_recorder(calls: list[BlockCall | None], index: int) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        state = _block_input(args, kwargs)
        if args and args[0] is not state:
            raise RuntimeError(f"block {index} was called with its hidden state after other arguments")
        with torch.inference_mode(False):
            calls[index] = BlockCall(
                (None, *(_normal(a) for a in args[1:])) if args else (),
                {k: _normal(v) for k, v in kwargs.items() if v is not state},
            )

    return hook


def _normal(value: Any) -> Any:
    """A recorded argument as a normal tensor (inference tensors cannot enter autograd)."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, tuple):
        return tuple(_normal(v) for v in value)
    return value


class Values(Protocol):
    """What a component is set to at some positions (module docstring)."""

    def __call__(self, component: Component, positions: Tensor) -> Tensor: ...


def zero_values(base: Run) -> Values:
    """Zero ablation of components of the `base` run (an attention source's term removed)."""

    def values(component: Component, positions: Tensor) -> Tensor:
        current = base.activation(component, positions)
        return -current if component.kind == "source" else torch.zeros_like(current)

    return values


def run_values(base: Run, source: Run, sequence: int = 0) -> Values:
    """Each component's activation in sequence `sequence` of the `source` run, at the same
    positions (activation patching; resample ablation)."""
    if source.seq_len < base.seq_len:
        raise UsageError(
            f"the run values are taken from has {source.seq_len} tokens, fewer than the {base.seq_len} "
            "it patches"
        )

    def values(component: Component, positions: Tensor) -> Tensor:
        new = source.activation(component, positions, sequence)
        return new - base.activation(component, positions) if component.kind == "source" else new

    return values


@dataclass(frozen=True, eq=False)
class Means:
    """Mean activations over a corpus sample (every position of every window): per block the
    mean z (heads, d_head), neuron coefficients (d_ff), attention and MLP outputs (d), and the
    residual state at every block input h_0..h_L (L+1, d), in float64. `count` positions were
    averaged."""

    z: tuple[Tensor, ...]
    coefficients: tuple[Tensor, ...]
    attn: tuple[Tensor, ...]
    mlp: tuple[Tensor, ...]
    resid: Tensor
    count: int

    @staticmethod
    def check(component: Component) -> None:
        """UsageError for a component without a mean activation (an attention source)."""
        if component.kind == "source":
            raise UsageError(
                f"`component` {component.name}: mean ablation of an attention source is not defined "
                "(its term depends on the query and source positions); use zero or resample ablation"
            )

    def of(self, component: Component, columns: int | slice | None = None) -> Tensor:
        """The mean activation of a component (one position's shape); a neuron's or an
        expert's `columns` of the coefficients (`neuron_columns`)."""
        self.check(component)
        if component.kind in ("emb", "resid"):
            return self.resid[component.start]
        if component.kind == "head":
            return self.z[component.layer][component.index]
        if component.kind in ("neuron", "expert"):
            return self.coefficients[component.layer][component.index if columns is None else columns]
        return (self.attn if component.kind == "attn" else self.mlp)[component.layer]


def mean_values(means: Means, view: ModelView) -> Values:
    """Mean ablation: every component of `view`'s model set to its mean over the corpus sample."""

    def values(component: Component, positions: Tensor) -> Tensor:
        columns = neuron_columns(view, component) if component.coefficients else None
        mean = means.of(component, columns)
        return mean.expand(len(positions), *mean.shape)

    return values


def neuron_columns(view: ModelView, component: Component) -> int | slice:
    """Which of its block's neuron coefficients a neuron or expert component is: neuron k's
    column, or expert e's flat neurons (`ExpertsView.neurons`)."""
    if component.kind != "expert":
        return component.index
    experts = view.blocks[component.layer].experts
    if experts is None:
        raise UsageError(f"`component` {component.name}: block {component.layer}'s MLP has no experts")
    return experts.neurons(component.index)


def accumulate_means(runs: list[Run]) -> Means:
    """The mean activations (`Means`) over every position of every sequence of `runs`,
    summed and kept in float64 (cast to the model's dtype only where a value is set)."""
    count = sum(int(r.internals.input_ids.numel()) for r in runs)

    def mean(field: str, layer: int) -> Tensor:
        total = torch.stack(
            [getattr(r.internals.blocks[layer], field).double().flatten(0, 1).sum(0) for r in runs]
        )
        return total.sum(0) / count

    n_layers = runs[0].view.n_layers
    z = [mean("z", layer) for layer in range(n_layers)]
    coefficients = [mean("coefficients", layer) for layer in range(n_layers)]
    attn = [mean("attn_raw", layer) for layer in range(n_layers)]
    mlp = [mean("mlp_raw", layer) for layer in range(n_layers)]
    states = [
        torch.stack([_states(r, layer).double().flatten(0, 1).sum(0) for r in runs])
        for layer in range(n_layers + 1)
    ]
    resid = torch.stack([s.sum(0) / count for s in states])
    return Means(tuple(z), tuple(coefficients), tuple(attn), tuple(mlp), resid, count)


def _states(run: Run, layer: int) -> Tensor:
    blocks = run.internals.blocks
    return blocks[-1].block_output if layer == len(blocks) else blocks[layer].block_input


__all__ = [
    "BlockCall",
    "Means",
    "Run",
    "Values",
    "accumulate_means",
    "capture_run",
    "mean_values",
    "neuron_columns",
    "run_values",
    "zero_values",
]
