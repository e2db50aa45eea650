"""Forward hooks that record residual-stream points while the model runs its own forward.

`residual_states(view, input_ids)` gives h_0..h_L as one (L+1, batch, seq, d_model) tensor:
a forward-pre-hook on block 0 records exactly what the model feeds block 0 (h_0), and a
forward hook on every block records its output (h_l, before the final norm). The model's own
forward runs once (for Hugging Face models only the trunk: the LM head is skipped) under
`torch.inference_mode()`. Hugging Face's `output_hidden_states` is never used: its last
entry is after the final norm for most families.

`record(modules)` is the generic form: the outputs (or inputs) of any modules, by name.
Hooks are always removed, also when the forward raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from resstream.errors import UsageError
from resstream.models.adapters.base import ModelView


def first_tensor(value: Any) -> Tensor:
    """`value` itself when it is a tensor, else the first element of a tuple/list/ModelOutput."""
    while not isinstance(value, Tensor):
        if isinstance(value, Mapping):
            value = next(iter(value.values()))
        elif isinstance(value, (tuple, list)) and value:
            value = value[0]
        else:
            raise TypeError(f"cannot find a tensor in a {type(value).__name__}")
    return value


def _block_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    if args:
        return first_tensor(args[0])
    if "hidden_states" in kwargs:
        return first_tensor(kwargs["hidden_states"])
    return next(v for v in kwargs.values() if isinstance(v, Tensor))


@contextmanager
def _hooks(handles: list[torch.utils.hooks.RemovableHandle]) -> Iterator[None]:
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_forward(view: ModelView, input_ids: Tensor, attention_mask: Tensor | None = None) -> object:
    """Run the model's own forward once (the view's trunk forward when it has one)."""
    if view.forward is not None:
        return view.forward(input_ids, attention_mask)
    return view.model(input_ids=input_ids, attention_mask=attention_mask)


def right_padding_mask(
    view: ModelView, lengths: Sequence[int], width: int, device: torch.device | str
) -> Tensor | None:
    """The attention mask of a batch of texts of `lengths` padded on the right to `width`;
    None when no text is padded, and for resstream's GPT, which takes no mask (a causal
    model's states at the real positions never see the padding after them)."""
    if all(n == width for n in lengths) or view.family == "resstream":
        return None
    return (torch.arange(width, device=device) < torch.tensor(list(lengths), device=device)[:, None]).long()


def check_input_ids(view: ModelView, input_ids: Tensor) -> None:
    """input_ids must be (batch, seq) and fit the model's context (UsageError if longer)."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
    seq = input_ids.shape[1]
    if view.max_positions is not None and seq > view.max_positions:
        raise UsageError(
            f"sequence length {seq} is over the model's context of "
            f"{view.max_positions} tokens; allowed: 1..{view.max_positions}"
        )


def residual_states(view: ModelView, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """h_0..h_L of `input_ids` (batch, seq) as a tensor (L+1, batch, seq, d_model).

    h_0 is the input of block 0, h_l the output of block l (before the final norm), in the
    model's dtype, on the device of h_0; a normal tensor (not an inference tensor), so it can
    feed later computations with or without autograd. `input_ids` is moved to the embedding's
    device. A sequence longer than the model's context is a UsageError.
    """
    check_input_ids(view, input_ids)
    device = view.W_E.device
    if device.type != "meta":
        input_ids = input_ids.to(device)
        if attention_mask is not None:
            attention_mask = attention_mask.to(device)

    n_layers = view.n_layers
    buffer: dict[str, Tensor] = {}
    seen = [0] * (n_layers + 1)

    def store(index: int, h: Tensor) -> None:
        if "states" not in buffer:
            # A normal (non-inference) tensor, so callers may use the states under autograd.
            with torch.inference_mode(False):
                buffer["states"] = torch.empty((n_layers + 1, *h.shape), dtype=h.dtype, device=h.device)
        buffer["states"][index].copy_(h)
        seen[index] += 1

    def pre_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        store(0, _block_input(args, kwargs))

    def make_hook(index: int) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            store(index, first_tensor(output))

        return hook

    handles = [view.blocks[0].module.register_forward_pre_hook(pre_hook, with_kwargs=True)]
    try:
        for index, block in enumerate(view.blocks, start=1):
            handles.append(block.module.register_forward_hook(make_hook(index)))
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    with _hooks(handles), torch.inference_mode():
        run_forward(view, input_ids, attention_mask)
    if any(count != 1 for count in seen):
        raise RuntimeError(f"expected every block to run exactly once, got counts {seen} (h_0 first)")
    return buffer["states"]


@contextmanager
def record(
    modules: Mapping[str, nn.Module] | Iterable[nn.Module], *, inputs: bool = False
) -> Iterator[dict[str, list[Tensor]]]:
    """Record what `modules` output (or, with `inputs=True`, receive as first input).

    `modules` maps names to modules (e.g. a selection of `model.named_modules()`), or is a
    sequence of modules named "0", "1", .... Yields a dict name -> list of tensors, one entry
    per call, filled while the block runs; the hooks are removed on exit.
    """
    named = dict(modules) if isinstance(modules, Mapping) else {str(i): m for i, m in enumerate(modules)}
    recorded: dict[str, list[Tensor]] = {name: [] for name in named}
    handles = []
    try:
        for name, module in named.items():
            if inputs:

                def pre(
                    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], _name: str = name
                ) -> None:
                    recorded[_name].append(_block_input(args, kwargs))

                handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            else:

                def post(module: nn.Module, args: tuple[Any, ...], output: Any, _name: str = name) -> None:
                    recorded[_name].append(first_tensor(output))

                handles.append(module.register_forward_hook(post))
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    with _hooks(handles):
        yield recorded


__all__ = ["first_tensor", "record", "residual_states", "right_padding_mask", "run_forward"]
