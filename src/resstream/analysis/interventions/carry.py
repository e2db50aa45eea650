"""A change of one component carried along the residual stream with every later computation
held at the base run: the direct path of direct effects and path patching.

A component's change δ becomes a change of what its sub-layer writes (`raw_write`: δz_h·W_O[h],
δm_k·W_out[k], or the module output's change), enters the stream (`into_stream`: through
Gemma-2's post-sub-layer norm and a post-norm block's stream norm, each frozen at the base
run's actual input) and travels up to a later residual point (`carry`): a residual gate scales
it by α, a post-norm block's stream norms pass it frozen, and nothing else touches it — every
later component sees its base value. These are exactly the linear maps
`analysis.attribution.decomposition` applies to each component, so the direct effect of
removing a component is minus its share there (and on the target's logit, minus its DLA).

Residual points are numbered as in the decomposition: 2l = the input of block l (2L: h_L),
2l + 1 = L_res_l, after block l's attention.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from resstream.analysis.attribution.decomposition import after_attention, attention_base, identity_scale_at
from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.runs import Run, neuron_columns
from resstream.analysis.norms import norm_form


def raw_write(run: Run, component: Component, change: Tensor) -> Tensor:
    """What the component's sub-layer writes differently (P, d) in float64, for a change of its
    activation `change` (P, ...) (a residual state's change is itself)."""
    change = change.double()
    if component.kind in ("emb", "resid", "attn", "mlp"):
        return change
    block = run.view.blocks[component.layer]
    if component.kind in ("head", "source"):
        return change @ block.W_O[component.index].detach().double()
    W_out = block.read_mlp_weights().W_out.detach()
    if component.kind == "expert":  # (P, width): its neurons' writes summed
        return change @ W_out[neuron_columns(run.view, component)].double()
    return change.unsqueeze(-1) * W_out[component.index].double()


def into_stream(run: Run, component: Component, write: Tensor, positions: Tensor) -> tuple[int, Tensor]:
    """The residual point where a sub-layer's raw write change lands and the change there."""
    if component.kind in ("emb", "resid"):
        return 2 * component.start, write
    layer = component.layer
    block, rec = run.view.blocks[layer], run.internals.blocks[layer]
    at = (0, positions.to(rec.block_input.device))
    if component.sublayer == "attn":
        write = _frozen(block.post_attn_norm, rec.attn_raw[at], write)
        if block.norm_position == "post":
            write = _frozen(block.ln1, attention_base(rec, at) + rec.attn_output[at], write)
        return 2 * layer + 1, write
    write = _frozen(block.post_mlp_norm, rec.mlp_raw[at], write)
    if block.norm_position == "post":
        write = _frozen(block.ln2, after_attention(block, rec, at) + rec.mlp_output[at], write)
    return 2 * layer + 2, write


def carry(run: Run, delta: Tensor, positions: Tensor, start: int, stop: int) -> Tensor:
    """A stream change `delta` (P, d) at `positions` carried from residual point `start` up to
    point `stop` (module docstring), in float64."""
    if stop < start:
        raise ValueError(f"cannot carry a change down from residual point {start} to {stop}")
    view = run.view
    for point in range(start, stop):
        layer, stage = divmod(point, 2)
        block, rec = view.blocks[layer], run.internals.blocks[layer]
        at = (0, positions.to(rec.block_input.device))
        if stage == 0:  # block input -> after attention
            alpha = identity_scale_at(rec, at)
            if alpha is not None:
                delta = delta * alpha.double()
            if block.norm_position == "post":
                delta = _frozen(block.ln1, attention_base(rec, at) + rec.attn_output[at], delta)
        elif block.norm_position == "post":  # after attention -> block output
            delta = _frozen(block.ln2, after_attention(block, rec, at) + rec.mlp_output[at], delta)
    return delta


def _frozen(module: nn.Module | None, actual: Tensor, delta: Tensor) -> Tensor:
    """`delta` through a norm frozen at `actual` (a missing norm passes it unchanged)."""
    if module is None:
        return delta
    form = norm_form(module).to(torch.float64)
    return form.freeze(actual.double()).apply(delta)


def final_change(run: Run, component: Component, change: Tensor, positions: Tensor) -> Tensor:
    """The change of h_L at `positions` (P, d) that a component's activation change at those
    positions makes along the direct path alone."""
    point, delta = into_stream(run, component, raw_write(run, component, change), positions)
    return carry(run, delta, positions, point, 2 * run.view.n_layers)


__all__ = ["carry", "final_change", "into_stream", "raw_write"]
