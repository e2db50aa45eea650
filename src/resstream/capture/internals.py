"""What every block reads and writes during one forward: the inputs of attribution.

`block_internals(view, input_ids)` runs the model's own forward once with hooks on every
block and records, per block (`BlockInternals`, tensors (batch, seq, ...)):

* `block_input` (L_in) and `block_output` (L_out), and the factor α the block scales its
  identity path by (resstream's residual gates; None for 1);
* `attn_input`: what the attention module reads (ln1(L_in) for pre-norm models), from which
  every head's values are recomputed for attention sources;
* `z`: the per-head attention results, the input of the output projection (batch, seq,
  heads, d_head); `attn_raw`: the attention module's output Σ_h z_h W_O[h] + b_O;
  `attn_output`: what is added to the stream (Gemma-2: after its post-attention norm);
* `mlp_input`: what the MLP reads; `coefficients`: the neuron coefficients m (the input of
  the MLP's output projection, batch, seq, d_ff; a mixture of experts: the flat, routed and
  weighted coefficients of `ExpertsView`, with the routing in `expert_index` /
  `expert_weight`); `mlp_raw`: the MLP module's output; `mlp_output`: what is added
  (Gemma-2: after its post-feed-forward norm; Granite: times its residual multiplier);
* `probs` (with `attention=True`): the attention probabilities (batch, heads, query, key),
  recorded in the same forward, which then runs the model's eager attention (fused kernels do
  not return them; a view with its own `attention` computes them from its states;
  `same_forward=False` takes them from a second forward instead); with
  `attention=[positions]` only those query rows, cut layer by layer as the forward goes.

Nothing is computed here beyond what the model computes; `analysis.attribution.decomposition` turns the
records into components. The record types live with the view they describe
(`models.adapters.base`), so analysis reads them without depending on the hooks. Tensors are
normal (non-inference) float tensors in the model's dtype; hooks are removed also when the
forward raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from resstream.capture.attention import attention_rows, hooked_attention
from resstream.capture.hooks import _block_input, _hooks, check_input_ids, first_tensor, run_forward
from resstream.models.adapters.base import BlockInternals, BlockView, InlineScale, Internals, ModelView


def _out_projection(block: BlockView, index: int) -> nn.Module:
    """The block's attention output projection, hooked for z; ValueError for a view that
    gives none, or no neuron coefficients (`BlockView.has_coefficients`)."""
    if block.out_proj is None or not block.has_coefficients:
        raise ValueError(f"block {index} of this view has no out_proj / mlp_out_proj to hook")
    return block.out_proj


def block_internals(
    view: ModelView,
    input_ids: Tensor,
    *,
    attention: bool | Sequence[int] = False,
    same_forward: bool = True,
) -> Internals:
    """Record every block's reads and writes during one forward of `input_ids` (batch, seq)
    (module docstring); `attention=True` adds each block's attention probabilities, a
    sequence of positions only those query rows of them (`BlockInternals.probs_at`).

    With `same_forward` the probabilities come from the recorded forward itself, which then
    runs the eager attention; without, the internals come from the model's own attention
    implementation and the probabilities from a second, eager forward — for a caller that
    replays the recorded blocks under the model's own attention (`interventions.runs`)."""
    check_input_ids(view, input_ids)
    input_ids = input_ids.to(view.W_E.device)
    seen: list[dict[str, Any]] = [{} for _ in view.blocks]
    handles: list[torch.utils.hooks.RemovableHandle] = []
    try:
        for index, block in enumerate(view.blocks):
            handles += _block_hooks(block, index, seen[index])
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    rows = None if isinstance(attention, bool) else torch.as_tensor(list(attention), dtype=torch.long)
    probs: tuple[Tensor, ...] | None = None
    with _hooks(handles), torch.inference_mode():
        if attention is False or view.attention is not None or not same_forward:
            run_forward(view, input_ids)
        else:  # one eager forward records the probabilities with everything else
            with hooked_attention(view, rows, input_ids.device) as found:
                run_forward(view, input_ids)
            probs = found()
    if attention is not False and probs is None:
        probs = attention_rows(view, input_ids, rows)  # the view computes them from its own states
    blocks = tuple(
        _internals(block, record, probs, rows, i)
        for i, (block, record) in enumerate(zip(view.blocks, seen, strict=True))
    )
    return Internals(input_ids=input_ids, embedding=blocks[0].block_input, blocks=blocks)


def _block_hooks(
    block: BlockView, index: int, record: dict[str, Any]
) -> list[torch.utils.hooks.RemovableHandle]:
    """Hooks that fill `record` with block `index`'s reads and writes (each module runs once)."""
    out_proj = _out_projection(block, index)

    def keep(name: str, value: Tensor) -> None:
        if name in record:
            raise RuntimeError(f"{name} was recorded twice in one forward")
        with torch.inference_mode(False):
            record[name] = value.detach().clone()

    def on_input(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            keep(name, _block_input(args, kwargs))

        return hook

    def on_output(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            keep(name, first_tensor(output))

        return hook

    def on_block(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        keep("block_input", _block_input(args, kwargs))
        alpha = block.identity_scale(args, kwargs) if block.identity_scale is not None else None
        record["identity_scale"] = None if alpha is None else alpha.detach().clone()

    def on_coefficients(m: Tensor) -> None:
        keep("coefficients", m)

    def on_routing(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        assert block.experts is not None
        _, index, weights = block.experts.routing(args, kwargs)
        keep("expert_index", index)
        keep("expert_weight", weights)

    pre = [
        (block.module, on_block),
        (block.attn, on_input("attn_input")),
        (out_proj, on_input("z")),
        (block.mlp, on_input("mlp_input")),
    ]
    if block.experts is not None:
        pre.append((block.experts.module, on_routing))
    post = [
        (block.module, on_output("block_output")),
        (block.attn, on_output("attn_raw")),
        (block.mlp, on_output("mlp_raw")),
    ]
    for norm, name in ((block.post_attn_norm, "attn_output"), (block.post_mlp_norm, "mlp_output")):
        if norm is not None and not isinstance(norm, InlineScale):  # an inline factor runs no module
            post.append((norm, on_output(name)))
    handles: list[torch.utils.hooks.RemovableHandle] = []
    try:  # a view that fails half-way (its weights unreadable) leaves no hook behind
        handles += [module.register_forward_pre_hook(hook, with_kwargs=True) for module, hook in pre]
        handles += block.hook_coefficients(on_coefficients)
        return handles + [module.register_forward_hook(hook) for module, hook in post]
    except BaseException:
        for handle in handles:
            handle.remove()
        raise


def _internals(
    block: BlockView,
    record: dict[str, Any],
    probs: tuple[Tensor, ...] | None,
    rows: Tensor | None,
    index: int,
) -> BlockInternals:
    missing = [
        n
        for n in ("block_input", "block_output", "attn_raw", "z", "mlp_raw", "coefficients")
        if n not in record
    ]
    if missing:
        raise RuntimeError(f"block {index}: the forward did not run {', '.join(missing)}")
    z = record["z"]
    n_heads, d_head = block.W_O.shape[0], block.W_O.shape[1]
    routed = [record.get(name) for name in ("expert_index", "expert_weight")]
    routed = [None if r is None else r.reshape(*z.shape[:-1], -1) for r in routed]  # from (batch·seq) rows
    return BlockInternals(
        block_input=record["block_input"],
        block_output=record["block_output"],
        identity_scale=record.get("identity_scale"),
        attn_input=record["attn_input"],
        z=z.reshape(*z.shape[:-1], n_heads, d_head),
        attn_raw=record["attn_raw"],
        attn_output=record.get("attn_output", _inline(block.post_attn_norm, record["attn_raw"])),
        mlp_input=record["mlp_input"],
        coefficients=record["coefficients"],
        mlp_raw=record["mlp_raw"],
        mlp_output=record.get("mlp_output", _inline(block.post_mlp_norm, record["mlp_raw"])),
        probs=None if probs is None else probs[index],
        query_rows=rows,
        expert_index=routed[0],
        expert_weight=routed[1],
    )


def _inline(norm: nn.Module | None, raw: Tensor) -> Tensor:
    """What a sub-layer adds when no post-norm module runs: its raw output, times the factor
    the model applies inline (`InlineScale`) where there is one."""
    if isinstance(norm, InlineScale):
        with torch.no_grad():
            return norm(raw)
    return raw


__all__ = ["BlockInternals", "Internals", "block_internals"]
