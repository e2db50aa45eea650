"""The common view of a causal LM's residual stream that every analysis works through.

An adapter maps one model family onto `ModelView`. Residual states follow docs/design.md:
h_0 is the input of block 0 (after any embedding scaling or positional embedding the model
applies); h_l (l = 1..L) is the output of block l, taken before the final norm.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

#: A model, or one of its submodules, as an adapter reads it: a third-party object (a Hugging
#: Face model, or resstream's GPT) whose submodules are attributes built at run time
#: (`model.transformer.h[0].attn.c_proj`). torch types such an attribute as
#: `Tensor | Module`, which says nothing useful about it, so adapters hold these objects as
#: `Any` and type what they build from them (tensors, `BlockView`, `ModelView`).
DynamicModule: TypeAlias = Any


@dataclass(frozen=True)
class AttentionWeights:
    """One block's attention read/write matrices per query head, in the model's orientation
    x @ W: `W_Q`, `W_K`, `W_V` (n_heads, d_model, d_head), biases (n_heads, d_head) or None.
    Grouped-query models repeat each key/value head for the query heads that share it, so
    head h always reads v = x @ W_V[h] + b_V[h]. Rotary position embeddings (applied to q and
    k after these projections) are not part of W_Q/W_K; values are never rotated.
    """

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    b_Q: Tensor | None = None
    b_K: Tensor | None = None
    b_V: Tensor | None = None


@dataclass(frozen=True)
class MLPWeights:
    """One block's MLP as key -> value memories. Neuron k's coefficient is
    m_k = act(x @ W_in[:, k] + b_in[k]), times (x @ W_up[:, k] + b_up[k]) for gated (SwiGLU /
    GeGLU) MLPs where W_in is the gate; the MLP writes Σ_k m_k · W_out[k] + b_out.
    `W_in`/`W_up` are (d_model, d_ff), `W_out` (d_ff, d_model)."""

    W_in: Tensor
    W_out: Tensor
    act: Callable[[Tensor], Tensor]
    b_in: Tensor | None = None
    b_out: Tensor | None = None
    W_up: Tensor | None = None
    b_up: Tensor | None = None

    @property
    def d_ff(self) -> int:
        """Number of neurons."""
        return int(self.W_out.shape[0])

    @property
    def gated(self) -> bool:
        """Whether m_k is act(gate_k) · up_k."""
        return self.W_up is not None


class InlineScale(nn.Module):
    """A constant factor a model applies inline, without a module of its own, as a module the
    view can name: `InlineScale(c)(x)` = c·x (Granite's residual multiplier on a sub-layer's
    output, as `BlockView.post_attn_norm` / `post_mlp_norm`), `InlineScale(c, norm)(x)` =
    c·norm(x) (a logit scale after the final norm, as `ModelView.final_norm`: Cohere's
    `logit_scale`, Granite's 1 / `logits_scaling`). It is not part of the model: the model
    multiplies by c itself, so hooks on it never run; `capture` applies it to what it records
    and `analysis.norms.norm_form` reads it as the linear map it is (c times the inner norm)."""

    def __init__(self, factor: float, inner: nn.Module | None = None) -> None:
        super().__init__()
        self.factor = float(factor)
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        return (x if self.inner is None else self.inner(x)) * self.factor

    def extra_repr(self) -> str:
        return f"factor={self.factor:g}"


#: Reads or replaces an MLP's neuron coefficients m (..., d_ff) during a forward: returns None
#: to leave them, or the tensor that replaces them.
CoefficientHook = Callable[[Tensor], Tensor | None]


@dataclass(frozen=True)
class ExpertsView:
    """A mixture-of-experts MLP (Mixtral, Qwen3-MoE, GPT-OSS): a router sends each token to
    `top_k` of `n_experts` experts, and the MLP writes their outputs weighted by the router's
    weights for that token. `module` is the experts module, which the MLP calls as
    module(x (N, d), index (N, top_k), weights (N, top_k)): its inputs are the routing.

    Neurons are flat so that every analysis sees one MLP: expert e's neuron j is neuron
    e·`width` + j. `width` is the expert's d_ff, plus one where experts have an output bias
    (GPT-OSS): that last neuron is the bias, its value vector the bias and its own coefficient
    1. The coefficient of a flat neuron is its expert's router weight for the token times the
    expert's own coefficient, and 0 for the experts the token is not routed to, so
    Σ_k m_k·W_out[k] is the MLP's output exactly (`BlockView.mlp_weights` gives W_out flat).
    `coefficients(x, index, weights)` computes them, (N, n_experts·width), with the expert's
    own projections (the same products the experts module computes).
    """

    module: nn.Module
    n_experts: int
    top_k: int
    width: int
    coefficients: Callable[[Tensor, Tensor, Tensor], Tensor]

    def expert_of(self, neuron: int) -> tuple[int, int]:
        """(expert, neuron within it) of flat neuron `neuron`."""
        return divmod(int(neuron), self.width)

    def neurons(self, expert: int) -> slice:
        """Expert `expert`'s flat neurons."""
        return slice(expert * self.width, (expert + 1) * self.width)

    def routing(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
        """(x, index, weights) from the arguments the experts module is called with, bound to
        its parameters in their order (positional or by name)."""
        try:
            values = list(inspect.signature(self.module.forward).bind(*args, **kwargs).arguments.values())
        except TypeError:  # a signature that does not say (a wrapped forward): positions, then names
            values = [*args, *kwargs.values()]
        if len(values) < 3:
            raise RuntimeError(f"the experts module was called with {len(values)} arguments, expected 3")
        x, index, weights = values[:3]
        return x, index, weights

    def hooks(
        self, mlp: nn.Module, W_out: Callable[[], Tensor], fn: CoefficientHook
    ) -> list[RemovableHandle]:
        """Hooks that call `fn` with the flat coefficients (batch, seq, n_experts·width) of
        every forward of `mlp`; a tensor `fn` returns replaces them: the MLP's output then
        changes by (m' − m) @ W_out, exactly what writing m' would add (`W_out()` is read, once,
        only then: the flat matrix is a copy of every expert's weights). The coefficients are
        computed from a detached input and require grad when autograd is on; the output then
        gains (m − m.detach()) @ W_out, zero in value, so a gradient reaches m (attribution
        patching) without a second path to the MLP's input."""
        state: dict[str, Any] = {}

        def on_mlp(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            state["shape"] = _first_input(args, kwargs).shape[:-1]

        def on_experts(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x, index, weights = self.routing(args, kwargs)
            m = self.coefficients(x.detach(), index, weights.detach())
            if torch.is_grad_enabled():
                m.requires_grad_(True)
            shaped = m.reshape(*state.get("shape", m.shape[:-1]), m.shape[-1])
            replaced = fn(shaped)
            if replaced is None and shaped.requires_grad:  # the tensor `fn` saw is on the path
                replaced = shaped
            if replaced is not None:
                state["delta"] = replaced.reshape(m.shape) - m.detach()

        def after_experts(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
            delta = state.pop("delta", None)
            if delta is None:
                return None
            if "W_out" not in state:
                state["W_out"] = W_out()
            return output + (delta @ state["W_out"].to(delta.dtype)).to(output.dtype)

        return [
            mlp.register_forward_pre_hook(on_mlp, with_kwargs=True),
            self.module.register_forward_pre_hook(on_experts, with_kwargs=True),
            self.module.register_forward_hook(after_experts),
        ]


def _first_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    value = args[0] if args else next(iter(kwargs.values()))
    if not isinstance(value, Tensor):
        raise RuntimeError(f"expected a tensor as the module's first input, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class BlockView:
    """One Transformer block.

    `ln1`/`ln2` are the norms before attention / MLP (None where a family has none);
    `attn` and `mlp` the sub-modules whose outputs are added to the residual stream (for
    families with post-sublayer norms, e.g. Gemma-2, the extra norms are `post_attn_norm` /
    `post_mlp_norm`). `W_O` is the attention output projection as (n_heads, d_head, d_model),
    so head h writes z_h @ W_O[h]; `b_O` its bias (d_model) or None. `out_proj` is the module
    that applies W_O: its input is the concatenation of the per-head z (hook it to get z).

    `attention_weights()` / `mlp_weights()` build the per-head Q/K/V matrices and the MLP's
    key/value matrices on demand (`AttentionWeights`, `MLPWeights`; `read_attention_weights()`
    / `read_mlp_weights()` call them, refusing a view that gives none); `mlp_out_proj` is the
    module that applies W_out (its input is the neuron coefficients m: hook it to get m).
    `identity_scale(args, kwargs)` reads, from the arguments the block is called with, the
    factor α its identity path is scaled by (resstream's residual gates: y = α·x + attn(...)),
    None for 1. `qkv_columns(which, head)` (which: "q", "k" or "v") gives the projection module
    that computes head h's query, key or value from the attention input and the columns of its
    output that hold them (a grouped-query key/value head's columns serve several query heads);
    None where a family does not say.

    QK-norm (Qwen3, Gemma-3, OLMo-2, Cohere): `q_norm` / `k_norm` normalise each head's query
    and key after W_Q / W_K and before rotary positions, over one head's d_head
    (`qk_norm_span` "head") or over all heads' concatenation ("all": OLMo-2). `experts` makes
    the MLP a mixture of experts (`ExpertsView`; its neurons are flat, and `mlp_out_proj` is
    None: `hook_coefficients` reads and replaces them). `sinks` (n_heads,): GPT-OSS's learned
    attention-sink logits, which take softmax mass and write nothing, so a row of attention
    probabilities sums to less than one.

    `parallel`: attention and MLP both read the block input (GPT-NeoX's parallel residual:
    out = x + attn(ln1(x)) + mlp(ln2(x))). `norm_position`: "pre" (the usual
    out = y + mlp(ln2(y)), y = x + attn(ln1(x))) or "post" (resstream's post-norm variant:
    ln1 and ln2 are applied to the residual sums, y = ln1(x + attn(x)), out = ln2(y + mlp(y))).
    """

    module: nn.Module
    ln1: nn.Module | None
    attn: nn.Module
    ln2: nn.Module | None
    mlp: nn.Module
    W_O: Tensor
    b_O: Tensor | None = None
    post_attn_norm: nn.Module | None = None
    post_mlp_norm: nn.Module | None = None
    out_proj: nn.Module | None = None
    parallel: bool = False
    norm_position: str = "pre"
    attention_weights: Callable[[], AttentionWeights] | None = None
    mlp_weights: Callable[[], MLPWeights] | None = None
    mlp_out_proj: nn.Module | None = None
    identity_scale: Callable[[tuple[Any, ...], dict[str, Any]], Tensor | None] | None = None
    qkv_columns: Callable[[str, int], tuple[nn.Module, Tensor]] | None = None
    q_norm: nn.Module | None = None
    k_norm: nn.Module | None = None
    qk_norm_span: str = "head"
    experts: ExpertsView | None = None
    sinks: Tensor | None = None

    @property
    def has_coefficients(self) -> bool:
        """Whether the view says where the MLP's neuron coefficients are (an output projection
        whose input they are) or how to compute them (experts)."""
        return self.mlp_out_proj is not None or self.experts is not None

    @property
    def d_ff(self) -> int:
        """The MLP's number of neurons (flat in a mixture of experts), without building its
        weights where they would be copies (experts)."""
        if self.experts is not None:
            return self.experts.n_experts * self.experts.width
        return self.read_mlp_weights().d_ff

    def hook_coefficients(self, fn: CoefficientHook) -> list[RemovableHandle]:
        """Hooks that call `fn` with the MLP's neuron coefficients m (batch, seq, d_ff) in every
        forward; a tensor `fn` returns replaces m (the input of the MLP's output projection, or
        for experts the flat coefficients, `ExpertsView.hooks`). ValueError for a view that
        says neither where m is nor how to compute it."""
        if self.experts is not None:
            return self.experts.hooks(self.mlp, lambda: self.read_mlp_weights().W_out.detach(), fn)
        if self.mlp_out_proj is None:
            raise ValueError("this block's view has no mlp_out_proj whose input is the coefficients")

        def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            replaced = fn(args[0])
            return None if replaced is None else (replaced, *args[1:])

        return [self.mlp_out_proj.register_forward_pre_hook(hook)]

    def read_attention_weights(self) -> AttentionWeights:
        """`attention_weights()`; ValueError for a block whose view gives none."""
        if self.attention_weights is None:
            raise ValueError("this block's view gives no attention weights (BlockView.attention_weights)")
        return self.attention_weights()

    def read_mlp_weights(self) -> MLPWeights:
        """`mlp_weights()`; ValueError for a block whose view gives none."""
        if self.mlp_weights is None:
            raise ValueError("this block's view gives no MLP weights (BlockView.mlp_weights)")
        return self.mlp_weights()


@dataclass(frozen=True)
class ModelView:
    """A model seen through its residual stream (see the module docstring)."""

    family: str
    model: nn.Module
    embed: Callable[[Tensor], Tensor]  # token ids (batch, seq) -> h_0 (batch, seq, d_model)
    blocks: tuple[BlockView, ...]
    final_norm: nn.Module
    W_U: Tensor  # (vocab, d_model)
    W_E: Tensor  # (vocab, d_model)
    tied: bool
    n_heads: int
    d_model: int
    max_positions: int | None
    b_U: Tensor | None = None  # (vocab,)
    logit_softcap: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # h_0 = embed_scale * W_E[t] (+ positional embedding): sqrt(d_model) for Gemma, else 1.
    embed_scale: float = 1.0
    # Runs the model's own forward once through every block: (input_ids, attention_mask) ->
    # anything (the LM head may be skipped). `capture.residual_states` hooks the blocks around it.
    forward: Callable[[Tensor, Tensor | None], object] | None = None
    # (input_ids) -> per-layer attention probabilities, each (batch, heads, query, key), for
    # models whose own forward cannot return them; None: Hugging Face's output_attentions
    # under the eager attention implementation (`capture.attention_probs`).
    attention: Callable[[Tensor], tuple[Tensor, ...]] | None = None

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @property
    def d_head(self) -> int:
        """Width of one attention head (from W_O: some families set head_dim explicitly)."""
        if self.blocks:
            return int(self.blocks[0].W_O.shape[1])
        return self.d_model // self.n_heads


@dataclass(frozen=True, eq=False)
class BlockInternals:
    """One block's reads and writes in one forward, each (batch, seq, ...), as recorded by
    `resstream.capture.block_internals` (its docstring says what each field holds)."""

    block_input: Tensor
    block_output: Tensor
    identity_scale: Tensor | None
    attn_input: Tensor
    z: Tensor
    attn_raw: Tensor
    attn_output: Tensor
    mlp_input: Tensor
    coefficients: Tensor
    mlp_raw: Tensor
    mlp_output: Tensor
    probs: Tensor | None = None  # (batch, heads, query rows, key)
    query_rows: Tensor | None = None  # the query positions `probs` holds (None: all, in order)
    expert_index: Tensor | None = None  # mixture of experts: the routed experts (batch, seq, top_k)
    expert_weight: Tensor | None = None  # and their router weights (batch, seq, top_k)

    def probs_at(self, sequence: int, positions: Tensor) -> Tensor:
        """Attention probabilities (heads, N, key) of query `positions` of one sequence;
        ValueError when they were not recorded (no probabilities, or other rows)."""
        if self.probs is None:
            raise ValueError("attention sources need internals recorded with attention=True")
        positions = positions.reshape(-1).to(self.probs.device)
        if self.query_rows is None:
            return self.probs[sequence][:, positions, :]
        rows = self.query_rows.to(positions.device)
        index = (rows.unsqueeze(0) == positions.unsqueeze(1)).int().argmax(dim=1)
        if not bool((rows[index] == positions).all()):
            raise ValueError(
                f"attention probabilities were recorded for query positions {rows.tolist()}, "
                f"not {positions.tolist()}"
            )
        return self.probs[sequence][:, index, :]


@dataclass(frozen=True, eq=False)
class Internals:
    """Every block's `BlockInternals` for `input_ids` (batch, seq), and h_0."""

    input_ids: Tensor
    embedding: Tensor  # h_0 (batch, seq, d_model)
    blocks: tuple[BlockInternals, ...]
