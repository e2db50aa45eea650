"""Resolved edits as hooks on a model, at the positions of whatever forward runs.

A forward of a model with a KV cache (Hugging Face's `generate`) sees only the new positions;
an edit's positions are those of the whole sequence. `Clock`, a pre-hook on block 0, reads
where the forward starts — the length of the cache it is given (`get_seq_length`), 0
without one — and every edit's hook maps its positions into the forward's (`Clock.select`).

Each edit acts at its site's hook point (`analysis.interventions.points`), except a scaled
residual state: `Scale` on h_l (l < L) attenuates block l's identity path, so that the
block computes α·h_l + F_l(h_l) — the sub-layers read h_l itself, as in a model trained with
resstream's residual gates (y = α·x + attn(ln1(x)); out = y + mlp(ln2(y))). It is applied
as −(1 − α)·h_l added to what the block's attention adds to the stream (its post-attention
norm's output where it has one, its attention output otherwise, divided by an inline
multiplier), which is exact for serial, parallel and post-norm blocks alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from resstream.analysis.interventions.operations import ScaleBy, write
from resstream.analysis.interventions.points import (
    hook_point,
    output_hook,
    point_of,
    split_heads,
    trailing_index,
)
from resstream.capture.hooks import _block_input
from resstream.errors import UsageError
from resstream.models.adapters.base import InlineScale, ModelView
from resstream.stream.edits import Resolved


class Clock:
    """Where the running forward starts in the whole sequence (module docstring)."""

    def __init__(self) -> None:
        self.start = 0
        self.length = 0

    def hook(self, view: ModelView) -> RemovableHandle:
        """The pre-hook on block 0 that reads the forward's start and length."""

        def on_block(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.length = int(_block_input(args, kwargs).shape[1])
            self.start = _cache_length(args, kwargs)

        return view.blocks[0].module.register_forward_pre_hook(on_block, with_kwargs=True)

    def select(self, positions: tuple[int, ...] | None, device: torch.device) -> tuple[Any, Tensor] | None:
        """(index into the forward's positions, those positions in the sequence) of the
        edit's `positions` in the running forward (None: all), or None when none is in it."""
        if positions is None:
            return slice(None), torch.arange(self.start, self.start + self.length, device=device)
        inside = [p for p in positions if self.start <= p < self.start + self.length]
        if not inside:
            return None
        absolute = torch.tensor(inside, dtype=torch.long, device=device)
        return absolute - self.start, absolute


def _cache_length(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The length of the KV cache a block is called with (0: none, or empty)."""
    for value in (*args, *kwargs.values()):
        length = getattr(value, "get_seq_length", None)
        if callable(length):
            return int(length())
    return 0


def install(view: ModelView, resolved: list[Resolved]) -> list[RemovableHandle]:
    """Hooks applying every resolved edit (module docstring), the clock's first; removed by
    the caller. A hook fails half-way: the ones installed are removed."""
    if not resolved:  # nothing to edit: not even the clock, so the forward runs unhooked
        return []
    clock = Clock()
    handles = [clock.hook(view)]
    try:
        by_point: dict[tuple[str, int], list[Resolved]] = defaultdict(list)
        identity_paths: dict[int, dict[str, Tensor]] = defaultdict(dict)  # shared by a block's Scales
        for each in resolved:
            if _attenuates(view, each):
                handles += _identity_attenuation(view, each, clock, identity_paths[each.component.start])
            else:
                by_point[point_of(each.component)].append(each)
        for (where, layer), found in by_point.items():
            handles += hook_point(view, where, layer, _rewrite(view, where, layer, found, clock))
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    return handles


def _attenuates(view: ModelView, each: Resolved) -> bool:
    """Whether an edit is a scaled residual state read by a block (module docstring)."""
    component = each.component
    if not isinstance(each.operation, ScaleBy) or component.kind not in ("emb", "resid"):
        return False
    if component.start >= view.n_layers:
        raise UsageError(
            f"{each.edit.label()}: Scale on a residual state attenuates the identity path of the block "
            f"that reads it, and no block reads the final state; use Apply to scale it"
        )
    return True


def _rewrite(
    view: ModelView, where: str, layer: int, found: list[Resolved], clock: Clock
) -> Callable[[Tensor], Tensor | None]:
    """The rewrite of a hooked tensor (batch, seq, ...) applying `found` in order."""
    columns = [trailing_index(view, each.component) for each in found]

    def apply(x: Tensor) -> Tensor | None:
        out: Tensor | None = None
        for each, column in zip(found, columns, strict=True):
            chosen = clock.select(each.positions, x.device)
            if chosen is None:
                continue
            within, absolute = chosen
            if out is None:
                out = x.clone()
            index = (slice(None), within, *(() if column is None else (column,)))
            write(split_heads(view, where, layer, out), index, each.operation, absolute)
        return out

    return apply


def _identity_attenuation(
    view: ModelView, each: Resolved, clock: Clock, seen: dict[str, Tensor]
) -> list[RemovableHandle]:
    """Block l's identity path scaled by α at the edit's positions (module docstring); `seen`
    holds what the path carries (shared by the block's Scales, so that they multiply)."""
    assert isinstance(each.operation, ScaleBy)
    layer, alpha = each.component.start, each.operation.alpha
    block = view.blocks[layer]

    def on_block(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = _block_input(args, kwargs)
        gate = block.identity_scale(args, kwargs) if block.identity_scale is not None else None
        seen["x"] = x if gate is None else gate * x  # a gated block's identity path is already α_g·x

    norm = block.post_attn_norm
    factor = norm.factor if isinstance(norm, InlineScale) else 1.0
    adds = norm if norm is not None and not isinstance(norm, InlineScale) else block.attn

    def rewrite(added: Tensor) -> Tensor | None:
        chosen = clock.select(each.positions, added.device)
        if chosen is None:
            return None
        within, _ = chosen
        out = added.clone()
        x = seen["x"][:, within].to(added.dtype)
        out[:, within] = out[:, within] - ((1.0 - alpha) / factor) * x
        left = seen["x"].clone()  # what the path carries now, for a later Scale of this block
        left[:, within] = left[:, within] * alpha
        seen["x"] = left
        return out

    handles = [block.module.register_forward_pre_hook(on_block, with_kwargs=True)]
    return [*handles, adds.register_forward_hook(output_hook(rewrite))]


__all__ = ["Clock", "install"]
