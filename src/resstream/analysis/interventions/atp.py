"""Attribution patching (AtP): the first-order estimate of every component's patching effect.

Activation patching sets a component c of the base run to its activation in a source run and
measures the change of the headline metric M at the prediction's position (log p(target), or
the target − foil logit difference before soft-capping with a foil). To first order that change
is

    ΔM_c ≈ Σ_{p ∈ P} ⟨∂M/∂a_c[p], a_c^source[p] − a_c^base[p]⟩,

a_c the component's activation (z_h for a head, m_k for a neuron, the module output for an
attention or MLP block, the state itself for a residual state) and P the intervened positions
(Nanda 2023, "Attribution patching"). One forward of the base run with autograd and one
backward give ∂M/∂a for every head, neuron, block output and residual state of every layer at
once (`attribution_patching`): the forward restarts from the base run's h_0 and calls each block
with the arguments the model called it with (`runs.Run.calls`), keeping the output projection's
input z, the MLP output projection's input m and each attention / MLP module's output as they
enter the graph; the activations of both runs come from their recordings. Gradients are taken
in the model's dtype, the products in it (at least float32), the sums over positions in float64.

`AtpEstimates.top` picks the components to confirm: heads and neurons pooled, ranked by
|estimate| (both estimate the same quantity, ΔM of patching one unit, so one ranking compares
them; block outputs and residual states are sums of those units and are confirmed only when
named). `screen_and_confirm` then patches the chosen components exactly (`effects`; none with
`confirm` 0: the estimates alone) and reports how far the estimates were off
(`estimate_note`); its `screen` keeps every head's and every neuron's estimate (`AtpScreen`).

Where the first-order estimate fails (Kramár et al. 2024, "AtP*"):

* **saturated attention**: when a patch moves an attention logit far, the softmax saturates and
  its gradient at the base run says little about the change (false negatives for the query and
  key side of heads). AtP* recomputes the attention softmax for the query/key side instead of
  linearising it.
* **cancelling paths**: a component's direct and indirect effects can cancel in the gradient
  while they do not cancel under the patch (or the reverse). AtP* drops the gradient of one
  path at a time ("GradDrop") to expose them.

We compute plain AtP: neither correction. The exact patching of the confirmed set is the check;
a component the screen ranks low is not proven unimportant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from resstream.analysis.attribution.readouts import actual_logits
from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.effects import Readout, component_effects
from resstream.analysis.interventions.engine import DEFAULT_BATCH
from resstream.analysis.interventions.metrics import (
    Measured,
    final_inputs,
    log_probabilities,
    pre_cap_scores,
)
from resstream.analysis.interventions.results import AtpScreen, Effect, ScreenedComponent
from resstream.analysis.interventions.runs import Run, run_values
from resstream.capture.hooks import first_tensor
from resstream.errors import UsageError
from resstream.reprs import summary

#: Components confirmed by exact patching by default.
DEFAULT_CONFIRM = 20
#: Neurons whose estimates a result keeps beside every head's (the largest |estimate|).
SCREENED_NEURONS = 100
#: The component kinds AtP estimates.
ESTIMATED_KINDS = ("emb", "resid", "attn", "mlp", "head", "neuron")


@dataclass(frozen=True, eq=False)
class AtpEstimates:
    """First-order estimates of ΔM (module docstring) for patching each component alone at
    `positions` (P,), in float64: `heads` (L, H), `neurons` (L, d_ff), `blocks` (L, 2) (the
    attention output, then the MLP output), `resid` (L + 1, seq) (the input of block l at one
    position; row L the final state). `metric` names M ("logprob" or "logit_diff"), `base` its
    value in the base run."""

    metric: str
    base: float
    heads: Tensor
    neurons: Tensor
    blocks: Tensor
    resid: Tensor
    positions: Tensor

    def of(self, component: Component) -> float:
        """The estimate for one component (`ESTIMATED_KINDS`); UsageError for an attention
        source, which AtP does not estimate."""
        kind = component.kind
        if kind == "head":
            return float(self.heads[component.layer, component.index])
        if kind == "neuron":
            return float(self.neurons[component.layer, component.index])
        if kind in ("attn", "mlp"):
            return float(self.blocks[component.layer, 0 if kind == "attn" else 1])
        if kind == "resid":
            return float(self.resid[component.layer, component.position])
        if kind == "emb":
            return float(self.resid[0, self.positions].sum())
        raise UsageError(
            f"`component` {component.name}: attribution patching estimates {', '.join(ESTIMATED_KINDS)}; "
            "leave out attention sources and experts, or patch without `atp`"
        )

    def top(self, count: int, among: Sequence[Component] | None = None) -> list[Component]:
        """The `count` components with the largest |estimate|, largest first: among every head
        and every neuron pooled (None; ties: heads before neurons, then in layer order), or
        among the components given (ties in the order given)."""
        if among is None:
            pool = self.units()
            scores = torch.cat([self.heads.flatten(), self.neurons.flatten()]).abs()
        else:
            pool = list(among)
            scores = torch.tensor([abs(self.of(c)) for c in pool], dtype=torch.float64)
        order = torch.sort(scores, descending=True, stable=True).indices[:count]
        return [pool[int(i)] for i in order]

    def kept(self, neurons: int, confirmed: Sequence[Component]) -> list[Component]:
        """Every head, the `neurons` neurons with the largest |estimate| and every component
        `confirmed` (the estimates a result keeps)."""
        d_ff = self.neurons.shape[1]
        order = self.neurons.flatten().abs().sort(descending=True, stable=True).indices[:neurons]
        top = [Component(int(i) // d_ff, "neuron", int(i) % d_ff) for i in order]
        return list(dict.fromkeys([*self._heads(), *top, *confirmed]))

    def units(self) -> list[Component]:
        """Every head and every neuron, layer by layer, heads first (the pool `top` ranks by
        default, in the order of `heads.flatten()` then `neurons.flatten()`)."""
        n_layers, d_ff = self.neurons.shape
        return self._heads() + [
            Component(layer, "neuron", k) for layer in range(n_layers) for k in range(d_ff)
        ]

    def _heads(self) -> list[Component]:
        n_layers, n_heads = self.heads.shape
        return [Component(layer, "head", h) for layer in range(n_layers) for h in range(n_heads)]

    def __repr__(self) -> str:
        largest = max(float(self.heads.abs().max()), float(self.neurons.abs().max()))
        return summary(
            self,
            f"{self.metric} {self.base:.3f} in the base run",
            f"{self.heads.numel()} heads, {self.neurons.numel()} neurons",
            f"largest |estimate| {largest:.3g}",
        )


def attribution_patching(
    base: Run, source: Run, readout: Readout, positions: Tensor | None = None
) -> AtpEstimates:
    """AtP estimates for patching each component of `base` from `source` (sequence 0) at
    `positions` (None: every position), measured by `readout` (module docstring)."""
    run_values(base, source)  # refuses a source shorter than the base, with both token counts
    widths = {block.d_ff for block in base.view.blocks}
    if len(widths) > 1:
        raise UsageError(
            f"attribution patching needs every block's MLP to have as many neurons; this model's have "
            f"{', '.join(map(str, sorted(widths)))} (dense and sparse blocks): patch without `atp`"
        )
    grads, value = gradients(base, readout)
    heads, neurons, blocks = [], [], []
    for layer in range(base.view.n_layers):
        now, new = base.internals.blocks[layer], source.internals.blocks[layer]
        g = grads.of_layer(layer)
        heads.append(_products(g["z"].unflatten(-1, (now.z.shape[2], -1)), now.z, new.z, positions).sum(-1))
        neurons.append(_products(g["m"], now.coefficients, new.coefficients, positions))
        blocks.append(
            torch.stack(
                [
                    _products(g["attn"], now.attn_raw, new.attn_raw, positions).sum(),
                    _products(g["mlp"], now.mlp_raw, new.mlp_raw, positions).sum(),
                ]
            )
        )
    resid = torch.stack(
        [
            _state_products(grads.states[layer], base.block_input(layer), source.block_input(layer))
            for layer in range(base.view.n_layers + 1)
        ]
    )
    return AtpEstimates(
        metric="logit_diff" if readout.foil is not None else "logprob",
        base=float(value),
        heads=torch.stack(heads).cpu(),
        neurons=torch.stack(neurons).cpu(),
        blocks=torch.stack(blocks).cpu(),
        resid=resid.cpu(),
        positions=(torch.arange(base.seq_len) if positions is None else positions).cpu(),
    )


def _products(grad: Tensor, now: Tensor, new: Tensor, at: Tensor | None) -> Tensor:
    """Σ_{p ∈ at} grad[p] · (new[p] − now[p]) over positions (None: all), elementwise: `grad`
    (seq, ...) of one sequence, `now` / `new` recorded (batch, seq, ...), sequence 0. Products
    in the activations' dtype (at least float32), the sum in float64."""
    dtype = torch.promote_types(grad.dtype, torch.float32)
    change = new[0, : now.shape[1]].to(grad.device, dtype) - now[0].to(grad.device, dtype)
    products = grad.to(dtype) * change
    if at is not None:
        products = products[at.to(grad.device)]
    return products.sum(0, dtype=torch.float64)


def _state_products(grad: Tensor, now: Tensor, new: Tensor) -> Tensor:
    """⟨grad[p], new[p] − now[p]⟩ at every position (seq,), summed in float64; states (seq, d)."""
    dtype = torch.promote_types(grad.dtype, torch.float32)
    change = new[: len(now)].to(grad.device, dtype) - now.to(grad.device, dtype)
    return (grad.to(dtype) * change).sum(-1, dtype=torch.float64)


def metric_of(readout: Readout, h: Tensor) -> Tensor:
    """M of final states h (N, d) (module docstring), (N,) float64, differentiable in h, read
    as `metrics.measure` reads it: the final norm's formula in float64, the scores in the
    model's dtype (at least float32), the logit difference, or log p(target) soft-capped and
    normalised in float64."""
    decoder = readout.decoder
    device = decoder.matrix.device
    target = torch.full((h.shape[0],), readout.target, dtype=torch.long, device=device)
    if readout.foil is not None:
        return actual_logits(decoder, h, target, torch.full_like(target, readout.foil))
    scores = pre_cap_scores(decoder, final_inputs(decoder, h.to(device)))
    return log_probabilities(decoder, scores)[:, readout.target]


@dataclass(frozen=True, eq=False)
class Gradients:
    """∂M/∂a of one forward (seq, ...) per layer: `kept[name][layer]` for z, m, attn and mlp
    (module docstring), `states[l]` for the input of block l (l = L: the final state)."""

    kept: dict[str, list[Tensor]]
    states: list[Tensor]

    def of_layer(self, layer: int) -> dict[str, Tensor]:
        """The gradients of one layer's kept activations by name."""
        return {name: grads[layer] for name, grads in self.kept.items()}


def gradients(base: Run, readout: Readout) -> tuple[Gradients, Tensor]:
    """∂M/∂a of every kept activation of the base run, and M's value: one forward of the base
    run's blocks with autograd from h_0 and one backward of M at the readout's position."""
    view = base.view
    kept: dict[str, list[Tensor]] = {"z": [], "m": [], "attn": [], "mlp": []}
    with torch.inference_mode(False), torch.enable_grad(), _keeping(view, kept):
        h = base.block_input(0).detach().clone().unsqueeze(0).requires_grad_()
        states = [h]
        for layer in range(view.n_layers):
            args, kwargs = base.calls[layer].with_state(h)
            h = first_tensor(view.blocks[layer].module(*args, **kwargs))
            states.append(h)
        value = metric_of(readout, h[:, readout.position])[0]
        for name, found in kept.items():
            if len(found) != view.n_layers:
                raise RuntimeError(
                    f"attribution patching kept {len(found)} {name} activations, not {view.n_layers}"
                )
        inputs = [t for name in kept for t in kept[name]] + states
        grads = torch.autograd.grad(value, inputs, allow_unused=True)
    flat = [torch.zeros_like(t[0]) if g is None else g[0] for g, t in zip(grads, inputs, strict=True)]
    n = view.n_layers
    by_name = {name: flat[i * n : (i + 1) * n] for i, name in enumerate(kept)}
    return Gradients(by_name, flat[len(kept) * n :]), value.detach()


@contextmanager
def _keeping(view: Any, kept: dict[str, list[Tensor]]) -> Iterator[None]:
    """Hooks that keep, as they enter the graph, each block's z (the output projection's
    input), m (the neuron coefficients, `BlockView.hook_coefficients`) and attention and MLP
    module outputs."""
    handles = []
    try:
        for layer, block in enumerate(view.blocks):
            if block.out_proj is None or not block.has_coefficients:
                raise UsageError(
                    f"block {layer} of this model's view names no output projection; "
                    "attribution patching needs z and m"
                )
            handles.append(block.out_proj.register_forward_pre_hook(_input_keeper(kept["z"])))
            handles += block.hook_coefficients(kept["m"].append)
            handles.append(block.attn.register_forward_hook(_output_keeper(kept["attn"])))
            handles.append(block.mlp.register_forward_hook(_output_keeper(kept["mlp"])))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _input_keeper(into: list[Tensor]) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        into.append(args[0])

    return hook


def _output_keeper(into: list[Tensor]) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        into.append(output if isinstance(output, Tensor) else output[0])

    return hook


@dataclass(frozen=True)
class Screen:
    """What `screen_and_confirm` found: the confirmed `effects` (estimate set), the `note` on
    how far the estimates were off, the `screened` estimates kept for the result and the
    whole `screen` (every head's and neuron's estimate)."""

    effects: list[Effect]
    note: str
    screened: tuple[ScreenedComponent, ...]
    screen: AtpScreen


def screen_and_confirm(
    base: Run,
    source: Run,
    readout: Readout,
    *,
    clean: Measured,
    corrupt: Measured | None = None,
    among: Sequence[Component] | None = None,
    confirm: int = DEFAULT_CONFIRM,
    positions: Tensor | None = None,
    batch_size: int = DEFAULT_BATCH,
    progress: Callable[[int], None] | None = None,
) -> Screen:
    """AtP over every head and neuron (or the components `among`), then exact activation
    patching of the `confirm` with the largest |estimate| (0: none, the estimates alone):
    their total effects (mode "patch", largest |estimate| first) with `estimate` set, one line
    saying how far the estimates were off (`estimate_note`), the estimates kept (`screened`:
    every head's and the `SCREENED_NEURONS` neurons' with the largest |estimate|, or every
    component `among`) and the whole screen (`AtpScreen`: every head's and every neuron's,
    `among` or not). The estimate is of the effect's `d_` metric, the change from the clean
    run (with base the corrupted run: its gap to the clean run added)."""
    if confirm < 0:
        raise UsageError(f"`confirm` {confirm} is not allowed; allowed: 0 (estimates only) or more")
    estimates = attribution_patching(base, source, readout, positions)
    chosen = estimates.top(confirm, among) if confirm > 0 else []
    effects = (
        component_effects(
            base,
            readout,
            run_values(base, source),
            [[c] for c in chosen],
            mode="patch",
            positions=positions,
            clean=clean,
            corrupt=corrupt,
            paths=("total",),
            batch_size=batch_size,
            progress=progress,
        )
        if chosen
        else []
    )
    offset = _headline(readout.of_run(base), estimates.metric) - _headline(clean, estimates.metric)
    estimated = [
        _with_estimate(effect, offset + estimates.of(c)) for effect, c in zip(effects, chosen, strict=True)
    ]
    count = len(among) if among is not None else estimates.heads.numel() + estimates.neurons.numel()
    kept = list(among) if among is not None else estimates.kept(SCREENED_NEURONS, chosen)
    screened = sorted(
        (_screened(c, offset + estimates.of(c), c in chosen) for c in kept),
        key=lambda s: -abs(s.estimate),
    )
    whole = AtpScreen(
        estimates.metric,
        estimates.heads + offset,
        estimates.neurons + offset,
        tuple(c.name for c in chosen),
    )
    return Screen(estimated, estimate_note(estimated, estimates.metric, count), tuple(screened), whole)


def _screened(component: Component, estimate: float, confirmed: bool) -> ScreenedComponent:
    return ScreenedComponent(
        component.name, component.kind, component.layer, component.index, estimate, confirmed
    )


def _headline(measured: Measured, metric: str) -> float:
    value = measured.logit_diff if metric == "logit_diff" else measured.logprob
    return 0.0 if value is None else float(value[0])


def _with_estimate(effect: Effect, estimate: float) -> Effect:
    return Effect(**{**effect.__dict__, "estimate": estimate})


def estimate_note(effects: Sequence[Effect], metric: str, screened: int) -> str:
    """One line: how far the AtP estimates of `effects` were from their exact `d_<metric>`
    (median and largest |estimate − exact|, Spearman's ρ), of `screened` components; with no
    effects (`confirm` 0), that none was confirmed."""
    if not effects:
        return (
            f"attribution patching (plain AtP, first order) screened {screened} components; none "
            f"confirmed by exact patching (`confirm` 0: the estimates alone)"
        )
    exact = [float(getattr(e, "d_" + metric) or 0.0) for e in effects]
    guessed = [float(e.estimate or 0.0) for e in effects]
    misses = [abs(g - x) for g, x in zip(guessed, exact, strict=True)]
    worst = max(range(len(misses)), key=misses.__getitem__)
    rho = spearman(guessed, exact)
    rank = "n/a" if rho is None else f"{rho:+.2f}"
    return (
        f"attribution patching (plain AtP, first order) screened {screened} components; exact patching of "
        f"the top {len(effects)} by |estimate|: median |estimate − exact| {_median(misses):.3g} "
        f"(d_{metric}), largest {misses[worst]:.3g} at {effects[worst].component}, Spearman ρ {rank}"
    )


def _median(values: Sequence[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).quantile(0.5))


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equally long sequences (average ranks for ties);
    None for fewer than two values or a constant sequence."""
    if len(x) != len(y):
        raise ValueError(f"spearman of {len(x)} and {len(y)} values")
    if len(x) < 2:
        return None
    rx, ry = (
        _centred_ranks(torch.tensor(x, dtype=torch.float64)),
        _centred_ranks(torch.tensor(y, dtype=torch.float64)),
    )
    spread = float((rx.square().sum() * ry.square().sum()).sqrt())
    return None if spread == 0.0 else float((rx * ry).sum()) / spread


def _centred_ranks(values: Tensor) -> Tensor:
    """Average ranks minus their mean, doubled: Σ_j sign(v_i − v_j)."""
    return torch.sign(values.unsqueeze(1) - values.unsqueeze(0)).sum(1)


__all__ = [
    "DEFAULT_CONFIRM",
    "ESTIMATED_KINDS",
    "SCREENED_NEURONS",
    "AtpEstimates",
    "Gradients",
    "Screen",
    "attribution_patching",
    "estimate_note",
    "gradients",
    "metric_of",
    "screen_and_confirm",
    "spearman",
]
