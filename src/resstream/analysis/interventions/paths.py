"""Path patching: a sender's effect on the prediction through one receiver's input only.

A *sender* (any component of `components`: a head, an MLP, a neuron, an attention source …)
changes by its value in another run minus its base value (`runs.run_values`). Its write
change enters the residual stream and is carried up to the receiver's input with every
component in between held at the base run (`carry.into_stream`, `carry.carry`: post-norms
and residual gates frozen). The *receiver* then reads its input with that change added, its
own input norm recomputed, and everything after it recomputes (the receiver's total effect):

* ``L5.mlp`` (an MLP's input): the change is added to the input of the norm before the MLP
  (pre-norm), or of the MLP itself (no such norm, or a post-norm block). Its point is the
  stream after block 5's attention, or block 5's input in a parallel-residual block;
* ``L5.H3.q``, ``L5.H3.k``, ``L5.H3.v`` (head 3's query, key or value input): only that head's
  projection reads ln1(h_5 + Δ) — every other head of the block and the rest of block 5 read
  ln1(h_5). The projection's output columns holding head 3's query (key, value) are replaced
  by the projection applied to the patched input (`BlockView.qkv_columns`); a grouped-query
  key/value head serves several query heads, so every other head's z is held at its base
  value (exact: their queries, keys and values are otherwise the base run's).

A sender must write below its receiver's input: in an earlier block, or in the same block's
attention for the MLP of a block whose MLP reads the attention's output. Each (sender,
receiver) pair gives one `Effect` whose `path` is the receiver's name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from resstream.analysis.interventions.carry import carry, into_stream, raw_write
from resstream.analysis.interventions.components import Component, ComponentSpace, expand
from resstream.analysis.interventions.effects import Readout, effects_of
from resstream.analysis.interventions.engine import DEFAULT_BATCH, Edit, edits
from resstream.analysis.interventions.metrics import Measured
from resstream.analysis.interventions.results import Effect
from resstream.analysis.interventions.runs import Run, Values
from resstream.analysis.names import input_name
from resstream.capture.hooks import first_tensor
from resstream.errors import UsageError
from resstream.models.adapters.base import BlockView, ModelView

ReceiverKind = Literal["q", "k", "v", "mlp"]
#: The spellings of a receiver, for error messages.
RECEIVER_GRAMMAR = "L<l>.H<h>.q, L<l>.H<h>.k, L<l>.H<h>.v, L<l>.mlp"
#: The families whose adapters say where each head's query, key and value are.
QKV_FAMILIES = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2", "gemma", "gemma2", "resstream")

_PATTERN = re.compile(r"^L(?P<layer>\d+)\.(?:H(?P<head>\d+)\.(?P<which>[qkv])|(?P<mlp>mlp))$")


@dataclass(frozen=True, order=True)
class Receiver:
    """One input of a component that path patching sends a change into (module docstring):
    `kind` "q", "k" or "v" of head `head` of block `layer`, or "mlp" (head −1)."""

    layer: int
    kind: ReceiverKind
    head: int = -1

    @property
    def name(self) -> str:
        """The receiver's spelling (``L5.H3.q``, ``L5.mlp``)."""
        return input_name(self.layer, self.kind, self.head)

    def point(self, view: ModelView) -> int:
        """The residual point whose state the receiver reads (`carry`'s numbering)."""
        if self.kind == "mlp" and not view.blocks[self.layer].parallel:
            return 2 * self.layer + 1
        return 2 * self.layer

    def __str__(self) -> str:
        return self.name


def parse_receiver(name: str, space: ComponentSpace) -> Receiver:
    """The `Receiver` a name spells, its indices checked against `space`; UsageError naming the
    spellings for a name it does not spell, or the valid range for an index outside it."""
    match = _PATTERN.match(name.strip())
    if match is None:
        raise UsageError(
            f"`receivers` {name!r} is not a receiver name; allowed: {RECEIVER_GRAMMAR} (0-based)"
        )
    layer = _checked(name, "layer", int(match["layer"]), space.n_layers)
    if match["mlp"]:
        return Receiver(layer, "mlp")
    which = cast(ReceiverKind, match["which"])
    return Receiver(layer, which, _checked(name, "head", int(match["head"]), space.n_heads))


def parse_receivers(names: Sequence[str], space: ComponentSpace) -> list[Receiver]:
    """`parse_receiver` of every name, `*` standing for every valid layer or head
    (`L3.H*.q`: the query input of every head of block 3); duplicates refused."""
    receivers = [parse_receiver(each, space) for name in names for each in expand(name, space)]
    if len(set(receivers)) != len(receivers):
        twice = next(r for r in receivers if receivers.count(r) > 1)
        raise UsageError(f"`receivers` {twice.name} is given twice")
    if not receivers:
        raise UsageError(f"`receivers` is empty; give at least one of {RECEIVER_GRAMMAR}")
    return receivers


def _checked(name: str, what: str, value: int, count: int) -> int:
    if not 0 <= value < count:
        raise UsageError(
            f"`receivers` {name!r}: {what} {value} is out of range; allowed: 0..{count - 1} (0-based)"
        )
    return value


def landing_point(sender: Component) -> int:
    """The residual point where a sender's write enters the stream (`carry.into_stream`)."""
    if sender.kind in ("emb", "resid"):
        return 2 * sender.start
    return 2 * sender.layer + (1 if sender.sublayer == "attn" else 2)


def precedes(sender: Component, receiver: Receiver, view: ModelView) -> bool:
    """Whether the sender writes below the receiver's input (module docstring)."""
    return landing_point(sender) <= receiver.point(view)


def sender_pairs(
    senders: Sequence[Component], receivers: Sequence[Receiver], view: ModelView, *, strict: bool = True
) -> list[tuple[Receiver, list[Component]]]:
    """Each receiver with the senders path patching measures through it: every sender when
    `strict` (UsageError for one that does not write below the receiver), else those that do
    (UsageError for a receiver none of them writes below). UsageError too for a head's input
    where the family does not say where its query, key and value are."""
    out = []
    for receiver in receivers:
        if receiver.kind != "mlp" and view.blocks[receiver.layer].qkv_columns is None:
            raise UsageError(
                f"`receivers` {receiver.name}: the {view.family} adapter does not say where each head's "
                f"query, key and value are; allowed: MLP receivers, or a head's input in "
                f"{', '.join(QKV_FAMILIES)}"
            )
        below = [s for s in senders if precedes(s, receiver, view)]
        late = [s for s in senders if not precedes(s, receiver, view)]
        if late and (strict or not below):
            raise UsageError(
                f"`receivers` {receiver.name}: sender {late[0].name} does not write below it; a sender "
                "must be in an earlier block than its receiver (or in the same block's attention for the "
                "MLP input of a block whose MLP reads the attention's output)"
            )
        out.append((receiver, below))
    return out


def path_effects(
    base: Run,
    readout: Readout,
    values: Values,
    senders: Sequence[Component],
    receivers: Sequence[Receiver],
    *,
    mode: str,
    positions: Tensor | None = None,
    clean: Measured,
    corrupt: Measured | None = None,
    strict: bool = True,
    batch_size: int = DEFAULT_BATCH,
    progress: Callable[[int], None] | None = None,
) -> list[Effect]:
    """The effect of each sender, changed to `values` at `positions` (None: every position),
    through each receiver alone (module docstring): one `Effect` per pair, receiver by
    receiver, its `path` the receiver's name. The pairs are `sender_pairs`'s (`strict`: a
    sender that does not write below a receiver is refused; else that pair is left out)."""
    at = torch.arange(base.seq_len) if positions is None else positions
    found: list[Effect] = []
    for receiver, below in sender_pairs(senders, receivers, base.view, strict=strict):
        sent = [edits([s], values, at)[0] for s in below]
        for start in range(0, len(sent), batch_size):
            chunk = sent[start : start + batch_size]
            changes = received_changes(base, chunk, receiver)
            finals = receiver_finals(base, receiver, changes, readout.position)
            groups = [[edit.component] for edit in chunk]
            found += effects_of(groups, readout.measure(finals), clean, corrupt, mode, receiver.name)
            if progress is not None:
                progress(len(chunk))
    return found


def received_changes(run: Run, sent: Sequence[Edit], receiver: Receiver) -> Tensor:
    """The change (N, seq, d) float64 each sender's edit makes to the state the receiver reads,
    along the residual stream with everything in between held at the base run."""
    stop = receiver.point(run.view)
    out = torch.zeros(len(sent), run.seq_len, run.view.d_model, dtype=torch.float64)
    for row, edit in enumerate(sent):
        c = edit.component
        point, delta = into_stream(run, c, raw_write(run, c, edit.change(run)), edit.positions)
        out[row, edit.positions] = carry(run, delta, edit.positions, point, stop).cpu()
    return out


def receiver_finals(run: Run, receiver: Receiver, changes: Tensor, position: int) -> Tensor:
    """h_L at `position` (N, d) when the receiver alone reads its input plus each row of
    `changes` (N, seq, d): blocks from the receiver's on, restarted from the base run."""
    view, layer = run.view, receiver.layer
    h = run.block_input(layer).unsqueeze(0).expand(len(changes), -1, -1).clone()
    changes = changes.to(h.device)
    with torch.no_grad(), _receiving(run, receiver, changes, h):
        for index in range(layer, view.n_layers):
            args, kwargs = run.calls[index].with_state(h)
            h = first_tensor(view.blocks[index].module(*args, **kwargs))
    return h[:, position]


@contextmanager
def _receiving(run: Run, receiver: Receiver, changes: Tensor, h: Tensor) -> Iterator[None]:
    """Hooks on the receiver's block that make the receiver alone read its changed input."""
    block = run.view.blocks[receiver.layer]
    if receiver.kind == "mlp":
        reads = block.ln2 if block.norm_position == "pre" and block.ln2 is not None else block.mlp
        handles = [reads.register_forward_pre_hook(_added(changes), with_kwargs=True)]
    else:
        handles = _head_input_hooks(run, block, receiver, _changed_attention_input(block, h, changes))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _added(changes: Tensor) -> Callable[..., tuple[tuple[Any, ...], dict[str, Any]]]:
    """A pre-hook adding `changes` to a module's input (positional, or `hidden_states`)."""

    def hook(
        module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if args:
            return (_plus(args[0], changes), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": _plus(kwargs["hidden_states"], changes)}

    return hook


def _plus(x: Tensor, change: Tensor) -> Tensor:
    return (x.double() + change).to(x.dtype)


def _changed_attention_input(block: BlockView, h: Tensor, changes: Tensor) -> Tensor:
    """What the attention reads from the changed block input: ln1(h + Δ) (pre-norm), or h + Δ
    (a post-norm block's attention reads its input directly)."""
    x = _plus(h, changes)
    if block.norm_position == "pre" and block.ln1 is not None:
        x = block.ln1(x)
    return x


def _head_input_hooks(
    run: Run, block: BlockView, receiver: Receiver, attention_input: Tensor
) -> list[torch.utils.hooks.RemovableHandle]:
    """The receiver head's query (key, value) columns from `attention_input`; every other
    head's z held at the base run's."""
    if block.qkv_columns is None or block.out_proj is None:
        raise UsageError(f"`receivers` {receiver.name}: this block's view gives no q/k/v columns")
    projection, columns = block.qkv_columns(receiver.kind, receiver.head)

    def splice(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        patched = module.forward(attention_input).reshape(output.shape)
        output = output.clone()
        where = columns.to(output.device)
        output[..., where] = patched[..., where]
        return output

    base_z = run.internals.blocks[receiver.layer].z[0]  # (seq, heads, d_head)
    others = torch.arange(base_z.shape[1]) != receiver.head

    def hold_others(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        z = args[0].unflatten(-1, base_z.shape[1:]).clone()
        mask = others.to(z.device)
        z[..., mask, :] = base_z[:, mask.to(base_z.device)].to(z.device, z.dtype)
        return (z.flatten(-2), *args[1:])

    return [
        projection.register_forward_hook(splice),
        block.out_proj.register_forward_pre_hook(hold_others),
    ]


__all__ = [
    "QKV_FAMILIES",
    "RECEIVER_GRAMMAR",
    "Receiver",
    "ReceiverKind",
    "landing_point",
    "parse_receiver",
    "parse_receivers",
    "path_effects",
    "precedes",
    "received_changes",
    "receiver_finals",
    "sender_pairs",
]
