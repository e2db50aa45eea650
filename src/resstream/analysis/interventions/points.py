"""Where each kind of component is read and written during a forward: one hook point per kind.

=========  ============================================================================
``z``      the input of the attention output projection: every head's z, (batch, seq,
           heads·d_head) — heads and attention sources
``m``      the MLP's neuron coefficients (batch, seq, d_ff), `BlockView.hook_coefficients`
           — neurons and experts
``attn``   the attention module's output (before any post-norm) — the attention output
``mlp``    the MLP module's output (before any post-norm) — the MLP output
``state``  a residual state h_l: the input of block 0 for l = 0 (and the embedding), the
           output of block l − 1 otherwise (h_L: the last block's output, before the final norm)
=========  ============================================================================

`hook_point(view, where, layer, rewrite)` installs one hook there; `rewrite` gets the
tensor (batch, seq, ...) at every forward and returns its replacement, or None to leave it
(a reader). The intervention engine (which restarts from recorded block inputs and sets
residual states itself) and the open stream API (`resstream.stream`) both hook through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.runs import neuron_columns
from resstream.models.adapters.base import ModelView

#: A hook's function: the tensor at the point -> its replacement, or None to leave it.
Rewrite = Callable[[Tensor], Tensor | None]

#: The hook point of each kind of component (module docstring).
POINT_OF = {
    "head": "z",
    "source": "z",
    "neuron": "m",
    "expert": "m",
    "attn": "attn",
    "mlp": "mlp",
    "emb": "state",
    "resid": "state",
}


def point_of(component: Component) -> tuple[str, int]:
    """(where, layer) of a component's hook point; a residual state's layer is its h index."""
    where = POINT_OF[component.kind]
    return where, (component.start if where == "state" else component.layer)


def split_heads(view: ModelView, where: str, layer: int, x: Tensor) -> Tensor:
    """The tensor at a hook point as its components index it: z as (batch, seq, heads,
    d_head) — a view of `x`, so writing into it writes `x` —, any other point as it is."""
    return x.unflatten(-1, (view.blocks[layer].W_O.shape[0], -1)) if where == "z" else x


def trailing_index(view: ModelView, component: Component) -> int | slice | None:
    """Where a component sits in its hook point's tensor (`split_heads`), past (batch, seq):
    a head, a neuron's column or an expert's columns; None for all of it (a block output, a
    residual state, every head or every neuron of a block: index −1)."""
    if component.index < 0 or POINT_OF[component.kind] not in ("z", "m"):
        return None
    if POINT_OF[component.kind] == "z":
        return component.index
    return neuron_columns(view, component)


def hook_point(view: ModelView, where: str, layer: int, rewrite: Rewrite) -> list[RemovableHandle]:
    """One hook at point `where` of block `layer` (module docstring); for "state", `layer` is
    the index l of h_l (0..n_layers)."""
    if where == "state":
        if layer == 0:
            return [view.blocks[0].module.register_forward_pre_hook(_state_input(rewrite), with_kwargs=True)]
        return [view.blocks[layer - 1].module.register_forward_hook(output_hook(rewrite))]
    block = view.blocks[layer]
    if where == "z":
        if block.out_proj is None:
            raise ValueError(f"block {layer} of this view has no out_proj whose input is z")
        return [block.out_proj.register_forward_pre_hook(_first_input(rewrite))]
    if where == "m":
        return block.hook_coefficients(rewrite)
    if where in ("attn", "mlp"):
        module = block.attn if where == "attn" else block.mlp
        return [module.register_forward_hook(output_hook(rewrite))]
    raise ValueError(f"no hook point {where!r}; allowed: z, m, attn, mlp, state")


def _first_input(rewrite: Rewrite) -> Callable[..., tuple[Any, ...] | None]:
    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        new = rewrite(args[0])
        return None if new is None else (new, *args[1:])

    return hook


def _state_input(rewrite: Rewrite) -> Callable[..., tuple[tuple[Any, ...], dict[str, Any]] | None]:
    """A block's hidden-state input, given positionally or as `hidden_states`."""

    def hook(
        module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if args and isinstance(args[0], Tensor):
            new = rewrite(args[0])
            return None if new is None else ((new, *args[1:]), kwargs)
        new = rewrite(kwargs["hidden_states"])
        return None if new is None else (args, {**kwargs, "hidden_states": new})

    return hook


def output_hook(rewrite: Rewrite) -> Callable[..., Any]:
    """A forward hook rewriting a module's output (a tensor, or a tuple's first one)."""

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if isinstance(output, Tensor):
            return rewrite(output)
        if isinstance(output, tuple) and output and isinstance(output[0], Tensor):
            new = rewrite(output[0])
            return None if new is None else (new, *output[1:])
        raise TypeError(f"cannot edit a {type(output).__name__} module output")

    return hook


__all__ = ["POINT_OF", "Rewrite", "hook_point", "output_hook", "point_of", "split_heads", "trailing_index"]
