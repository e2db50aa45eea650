"""Reading a family's weights in the orientation of the view (`x @ W`, heads first).

Families store their projections differently: an `nn.Linear` keeps its weight as (out, in), a
GPT-2 style `Conv1D` as (in, out); attention's query, key and value projections may be
separate, fused as q | k | v (equal thirds, or grouped-query widths: Phi-3), or fused per
key/value head as [its queries | k | v] (Falcon; GPT-NeoX's [q_h | k_h | v_h] per head). The
helpers here turn each layout into the view's matrices (`AttentionWeights`, `MLPWeights`, W_O)
so that a family module only says which layout it uses. The helpers only reorient and split:
no value is changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import overload

import torch
from torch import Tensor

from resstream.models.adapters.base import AttentionWeights, DynamicModule, MLPWeights

#: Reads a projection module's (in, out) matrix W, so that y = x @ W + b.
WeightReader = Callable[[DynamicModule], Tensor]


def linear_weight(module: DynamicModule) -> Tensor:
    """The (in, out) matrix W of an `nn.Linear` (y = x @ W + b; its weight is stored (out, in))."""
    return module.weight.T


def conv1d_weight(module: DynamicModule) -> Tensor:
    """The (in, out) matrix W of a GPT-2 style `Conv1D`, which stores its weight that way."""
    return module.weight


def linear_W_O(proj: DynamicModule, n_heads: int) -> Tensor:
    """W_O as (n_heads, d_head, d_model) from an `nn.Linear` (weight stored as (out, in))."""
    weight: Tensor = proj.weight  # (d_model, n_heads * d_head)
    return weight.T.view(n_heads, weight.shape[1] // n_heads, weight.shape[0])


def conv1d_W_O(proj: DynamicModule, n_heads: int) -> Tensor:
    """W_O from a GPT-2 style `Conv1D` (weight stored as (in, out): y = x @ W + b)."""
    weight: Tensor = proj.weight  # (n_heads * d_head, d_model)
    return weight.view(n_heads, weight.shape[0] // n_heads, weight.shape[1])


def per_head(weight: Tensor, n_heads: int) -> Tensor:
    """(n_heads, d_model, d_head) from an (in=d_model, out=n_heads*d_head) matrix whose output
    columns are grouped by head, as every family lays them out."""
    d_model, width = weight.shape
    return weight.reshape(d_model, n_heads, width // n_heads).permute(1, 0, 2)


def per_head_bias(bias: Tensor | None, n_heads: int) -> Tensor | None:
    """(n_heads, d_head) from a bias laid out like `per_head`'s columns, or None."""
    return None if bias is None else bias.reshape(n_heads, -1)


@overload
def repeat_heads(tensor: Tensor, n_heads: int) -> Tensor: ...
@overload
def repeat_heads(tensor: None, n_heads: int) -> None: ...
@overload
def repeat_heads(tensor: Tensor | None, n_heads: int) -> Tensor | None: ...
def repeat_heads(tensor: Tensor | None, n_heads: int) -> Tensor | None:
    """Grouped-query attention: key/value heads (first dim) repeated for the query heads that
    share them (kv head j serves query heads j·g .. j·g+g−1, g = n_heads / n_kv_heads)."""
    if tensor is None or tensor.shape[0] == n_heads:
        return tensor
    return tensor.repeat_interleave(n_heads // tensor.shape[0], dim=0)


def bias_of(module: DynamicModule | None) -> Tensor | None:
    """The module's `bias` parameter, or None (also for no module)."""
    bias = getattr(module, "bias", None)
    return bias if isinstance(bias, Tensor) else None


def same_tensor(a: Tensor, b: Tensor) -> bool:
    """Whether two parameters are one tensor (tied weights)."""
    if a is b:
        return True
    if a.shape != b.shape or a.device != b.device or a.device.type == "meta":
        return False
    return a.data_ptr() == b.data_ptr() and a.stride() == b.stride()


def kv_heads_of(width: int, n_heads: int, d_head: int) -> int:
    """The number of key/value heads of a fused q/k/v projection `width` wide that computes
    `n_heads` queries and n_kv keys and values, each `d_head` wide: width = (n_heads + 2·n_kv)·d_head.
    ValueError for a width that holds no whole number of key/value heads sharing the queries."""
    kv_heads, odd = divmod(width // d_head - n_heads, 2)
    if width % d_head or odd or kv_heads < 1 or n_heads % kv_heads:
        raise ValueError(
            f"a fused q/k/v projection {width} wide does not hold {n_heads} query heads and "
            f"key/value heads sharing them, each {d_head} wide"
        )
    return kv_heads


def _fused_qkv_widths(width: int, n_heads: int, d_head: int | None) -> tuple[int, int, int]:
    """The widths of q, k and v in a fused q | k | v projection `width` wide: equal thirds, or
    with `d_head` given n_heads·d_head for q and n_kv·d_head for k and v (`kv_heads_of`)."""
    if d_head is None:
        return (width // 3,) * 3
    kv_width = kv_heads_of(width, n_heads, d_head) * d_head
    return n_heads * d_head, kv_width, kv_width


def fused_qkv_weights(
    proj: DynamicModule, n_heads: int, *, weight: WeightReader = linear_weight, d_head: int | None = None
) -> AttentionWeights:
    """Q/K/V per query head from one projection whose output columns are q | k | v, each
    n_heads·d_head wide (GPT-2's and resstream's `c_attn`), or, with `d_head` given, q
    n_heads·d_head wide and k, v n_kv·d_head wide each (Phi-3's `qkv_proj` under grouped-query
    attention; key/value heads repeated for the query heads sharing them, `repeat_heads`).
    `weight` reads its (in, out) matrix."""
    W = weight(proj)
    widths = _fused_qkv_widths(W.shape[1], n_heads, d_head)
    width_of_head = widths[0] // n_heads
    bias = bias_of(proj)
    biases = bias.split(widths) if bias is not None else (None, None, None)
    W_Q, W_K, W_V = (
        repeat_heads(per_head(w, w.shape[1] // width_of_head), n_heads) for w in W.split(widths, dim=1)
    )
    b_Q, b_K, b_V = (
        repeat_heads(per_head_bias(b, width // width_of_head), n_heads)
        for b, width in zip(biases, widths, strict=True)
    )
    return AttentionWeights(W_Q, W_K, W_V, b_Q, b_K, b_V)


#: The order of query, key and value in a fused projection's output.
QKV = ("q", "k", "v")


def fused_qkv_columns(
    width: int, n_heads: int, which: str, head: int, *, d_head: int | None = None
) -> Tensor:
    """The output columns of query head `head`'s query, or of the key or value (`which`) it
    reads, in a projection `width` wide whose output is q | k | v (`fused_qkv_weights`: equal
    thirds, or with `d_head` given grouped-query widths)."""
    widths = _fused_qkv_widths(width, n_heads, d_head)
    part = QKV.index(which)
    return grouped_head_columns(widths[part], widths[0] // n_heads, n_heads, head) + sum(widths[:part])


def grouped_qkv_weights(
    proj: DynamicModule, n_heads: int, *, d_head: int | None = None, weight: WeightReader = linear_weight
) -> AttentionWeights:
    """Q/K/V per query head from one projection whose output is laid out per key/value group
    as [the group's queries | its key | its value], each `d_head` wide (Falcon's
    `query_key_value`: one group for multi-query attention, n_kv groups for the new decoder
    architecture, one per head, [q_h | k_h | v_h], for the original layout, which is
    GPT-NeoX's and what `d_head` None means); key/value heads are repeated for the query
    heads sharing them."""
    W = weight(proj)
    d_model, width = W.shape
    d_head = _group_head_width(width, n_heads, d_head)
    slots = W.reshape(d_model, kv_heads_of(width, n_heads, d_head), -1, d_head)
    W_Q, W_K, W_V = (repeat_heads(part.permute(1, 0, 2), n_heads) for part in _group_parts(slots))
    bias = bias_of(proj)
    b_Q = b_K = b_V = None
    if bias is not None:
        grouped = bias.reshape(slots.shape[1:])
        b_Q, b_K, b_V = (repeat_heads(part, n_heads) for part in _group_parts(grouped))
    return AttentionWeights(W_Q, W_K, W_V, b_Q, b_K, b_V)


def _group_parts(slots: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(…, n_heads, d_head) queries and (…, n_kv, d_head) keys and values from a grouped
    layout (…, n_kv, queries per group + 2, d_head) (`grouped_qkv_weights`)."""
    return slots[..., :-2, :].flatten(-3, -2), slots[..., -2, :], slots[..., -1, :]


def grouped_qkv_columns(
    width: int, n_heads: int, which: str, head: int, *, d_head: int | None = None
) -> Tensor:
    """The output columns of query head `head`'s query, or of the key or value (`which`) it
    reads, in a projection `width` wide laid out per key/value group as [queries | key |
    value] (`grouped_qkv_weights`; `d_head` None: one head per group)."""
    d_head = _group_head_width(width, n_heads, d_head)
    served = n_heads // kv_heads_of(width, n_heads, d_head)
    group, member = divmod(head, served)
    slot = member if which == "q" else served + QKV.index(which) - 1
    return torch.arange(d_head) + (group * (served + 2) + slot) * d_head


def _group_head_width(width: int, n_heads: int, d_head: int | None) -> int:
    """The head width of a grouped q/k/v layout `width` wide: `d_head`, or without it that of
    one head per group ([q_h | k_h | v_h] per head)."""
    return d_head if d_head is not None else width // (3 * n_heads)


@dataclass(frozen=True)
class FusedQKV:
    """Where an attention module keeps its one query/key/value projection and how that
    projection's output is laid out, as a family declares it.

    `proj` is the projection's attribute path in the attention module; `grouped` says the
    layout: False for q | k | v (`fused_qkv_weights`: GPT-2, resstream, Phi-3), True for
    [queries | key | value] per key/value group (`grouped_qkv_weights`: Falcon, and GPT-NeoX
    with one head per group); `d_head` the attention module's attribute that holds the head
    width (None: equal thirds, or one head per group); `weight` reads the projection's (in,
    out) matrix. `weights` and `columns` are the attention `Sublayer`'s readers.
    """

    proj: str
    grouped: bool = False
    d_head: str | None = None
    weight: WeightReader = linear_weight

    def weights(self, attention: DynamicModule, n_heads: int) -> AttentionWeights:
        """Q/K/V per query head of `attention` (key/value heads repeated for the query heads
        sharing them)."""
        proj, d_head = self._parts(attention)
        split = grouped_qkv_weights if self.grouped else fused_qkv_weights
        return split(proj, n_heads, d_head=d_head, weight=self.weight)

    def columns(
        self, attention: DynamicModule, n_heads: int, which: str, head: int
    ) -> tuple[DynamicModule, Tensor]:
        """The projection and its output columns of query head `head`'s query, or of the key
        or value (`which`) it reads (`BlockView.qkv_columns`)."""
        proj, d_head = self._parts(attention)
        find = grouped_qkv_columns if self.grouped else fused_qkv_columns
        return proj, find(self.weight(proj).shape[1], n_heads, which, head, d_head=d_head)

    def _parts(self, attention: DynamicModule) -> tuple[DynamicModule, int | None]:
        """The projection module and the declared head width (None when not declared)."""
        d_head = None if self.d_head is None else int(getattr(attention, self.d_head))
        return attrgetter(self.proj)(attention), d_head


def grouped_head_columns(width: int, d_head: int, n_heads: int, head: int) -> Tensor:
    """The output columns, in a projection `width` wide with d_head-wide heads, of the head
    that query head `head` (of `n_heads`) reads: itself, or with grouped-query attention the
    key/value head its group shares (`repeat_heads`)."""
    served = n_heads // (width // d_head)
    return torch.arange(d_head) + (head // served) * d_head


def projection_mlp_weights(
    fc_in: DynamicModule,
    fc_out: DynamicModule,
    act: Callable[[Tensor], Tensor],
    *,
    up: DynamicModule | None = None,
    weight: WeightReader = linear_weight,
) -> MLPWeights:
    """The key/value matrices of an MLP made of projections: fc_out(act(fc_in(x))), or with
    `up` the gated fc_out(act(fc_in(x)) * up(x)) (`fc_in` is then the gate). `weight` reads
    a projection's (in, out) matrix; biases are each projection's own (None without one)."""
    return MLPWeights(
        W_in=weight(fc_in),
        b_in=bias_of(fc_in),
        W_up=None if up is None else weight(up),
        b_up=bias_of(up),
        W_out=weight(fc_out),
        b_out=bias_of(fc_out),
        act=act,
    )


__all__ = [
    "QKV",
    "FusedQKV",
    "WeightReader",
    "bias_of",
    "conv1d_W_O",
    "conv1d_weight",
    "fused_qkv_columns",
    "fused_qkv_weights",
    "grouped_head_columns",
    "grouped_qkv_columns",
    "grouped_qkv_weights",
    "kv_heads_of",
    "linear_W_O",
    "linear_weight",
    "per_head",
    "per_head_bias",
    "projection_mlp_weights",
    "repeat_heads",
    "same_tensor",
]
