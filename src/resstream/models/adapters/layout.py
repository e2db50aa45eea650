"""Building a family's `ModelView` from where its pieces are.

A family module declares a `BlockLayout`: for each sub-layer of a block a `Sublayer` (the
attribute paths of the sub-layer, its norms and its output projection, and how its weights
are read). A Hugging Face family then hands the pieces of its trunk to `hf_model_view`, which
does what every Hugging Face family shares: W_U and its bias from the LM head, the tied check
and its note, the stated context, and the trunk forward that skips the LM head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from resstream.errors import UsageError
from resstream.models.adapters.base import AttentionWeights, BlockView, DynamicModule, MLPWeights, ModelView
from resstream.models.adapters.weights import bias_of, linear_W_O, same_tensor

#: Builds a sub-layer's weights from its module: (attention, n_heads) -> `AttentionWeights`,
#: or (mlp) -> `MLPWeights`.
Reader = TypeVar("Reader")
#: Where head h's query, key or value is: (attention, n_heads, which, head) -> the projection
#: module computing it and the columns of its output that hold it.
QKVColumns = Callable[[DynamicModule, int, str, int], tuple[DynamicModule, Tensor]]


@dataclass(frozen=True)
class Sublayer(Generic[Reader]):
    """Where a family keeps one sub-layer of a block (attention or MLP), as attribute paths.

    `module` is the sub-layer from the block (``"attn"``), `norm` the norm applied before it
    (from the block; None where a family has none, OLMo-2), `out_proj` its output projection
    inside it (``"c_proj"``: the module whose input is the per-head z, or the neuron
    coefficients m), `post_norm` Gemma-2's norm on its output (from the block; None where a
    family has none). `weights` builds its `AttentionWeights` / `MLPWeights` when asked for;
    `columns` (attention only) says where each head's query, key and value are: (attention,
    n_heads, which, head) -> the projection module and its output columns
    (`BlockView.qkv_columns`). `q_norm` / `k_norm` (attention only) are the QK-norms inside
    it, normalising over `qk_norm_span` ("head" or "all": `BlockView.qk_norm_span`).
    """

    module: str
    norm: str | None
    out_proj: str | None
    weights: Reader
    post_norm: str | None = None
    columns: QKVColumns | None = None
    q_norm: str | None = None
    k_norm: str | None = None
    qk_norm_span: str = "head"


@dataclass(frozen=True)
class BlockLayout:
    """Where a family keeps one block's sub-layers, and how it stores W_O: `read_W_O(out_proj,
    n_heads)` gives it as (n_heads, d_head, d_model) (default: from an `nn.Linear`)."""

    attention: Sublayer[Callable[[DynamicModule, int], AttentionWeights]]
    mlp: Sublayer[Callable[[DynamicModule], MLPWeights]]
    read_W_O: Callable[[DynamicModule, int], Tensor] = linear_W_O

    def views(self, blocks: Iterable[DynamicModule], n_heads: int, **extra: Any) -> tuple[BlockView, ...]:
        """The `BlockView` of every block in `blocks`; `extra` holds the rarer `BlockView`
        fields a family sets (parallel residual, norm position, identity scale)."""
        return tuple(self.view(block, n_heads, **extra) for block in blocks)

    def view(self, block: DynamicModule, n_heads: int, **extra: Any) -> BlockView:
        """The `BlockView` of one block (see `views`)."""
        attention, mlp = self.attention, self.mlp
        attn, mlp_module = _piece(block, attention.module), _piece(block, mlp.module)
        out_proj = _piece(attn, attention.out_proj)
        return BlockView(
            module=block,
            ln1=_piece(block, attention.norm),
            attn=attn,
            ln2=_piece(block, mlp.norm),
            mlp=mlp_module,
            W_O=self.read_W_O(out_proj, n_heads),
            b_O=bias_of(out_proj),
            post_attn_norm=_piece(block, attention.post_norm),
            post_mlp_norm=_piece(block, mlp.post_norm),
            out_proj=out_proj,
            attention_weights=partial(attention.weights, attn, n_heads),
            mlp_weights=partial(mlp.weights, mlp_module),
            mlp_out_proj=_piece(mlp_module, mlp.out_proj),
            qkv_columns=None if attention.columns is None else partial(attention.columns, attn, n_heads),
            q_norm=_piece(attn, attention.q_norm),
            k_norm=_piece(attn, attention.k_norm),
            qk_norm_span=attention.qk_norm_span,
            **extra,
        )


def _piece(block: DynamicModule, path: str | None) -> DynamicModule:
    """The submodule at attribute path `path` of `block` (None for no path)."""
    return None if path is None else attrgetter(path)(block)


#: The note of a parallel block whose attention and MLP read one shared norm (Phi, Cohere).
SHARED_NORM_PARALLEL_NOTE = (
    "parallel block: attention and MLP both read the one input_layernorm(x) of the block input"
)


def unembedding(model: DynamicModule) -> tuple[Tensor, Tensor | None]:
    """W_U (vocab, d_model) and its bias from a Hugging Face model's output embeddings."""
    head = model.get_output_embeddings()
    if head is None:
        raise UsageError(f"model {type(model).__name__!r} has no language-model head")
    return head.weight, bias_of(head)


def tie_notes(tied: bool, model: DynamicModule = None) -> tuple[str, ...]:
    """The note that an untied model decodes with its own unembedding (named from `model`;
    "lm_head" without one)."""
    if tied:
        return ()
    name = "lm_head"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        name = next((n for n, m in model.named_modules() if m is head), name)
    note = (
        f"untied embeddings: hidden states are decoded with the model's own unembedding "
        f"({name}.weight), not with the input embedding W_E"
    )
    return (note,)


def trunk_forward(trunk: DynamicModule) -> Callable[[Tensor, Tensor | None], object]:
    """A forward that runs a Hugging Face base model (embeddings + blocks + final norm) and
    skips the LM head, whose logits residual-state capture does not need."""

    def forward(input_ids: Tensor, attention_mask: Tensor | None = None) -> object:
        return trunk(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)

    return forward


def hf_model_view(
    model: DynamicModule,
    *,
    family: str,
    blocks: tuple[BlockView, ...],
    final_norm: DynamicModule,
    embed: Callable[[Tensor], Tensor] | None = None,
    notes: tuple[str, ...] = (),
    **extra: Any,
) -> ModelView:
    """The `ModelView` of a Hugging Face causal LM from the pieces its family adapter found:
    its `blocks`, its `final_norm` and how it embeds (`embed`; default: its input embedding
    module).

    What every Hugging Face family shares is done here, from what the model states itself:
    W_E (`get_input_embeddings`), W_U and its bias from its LM head, whether W_U is W_E (and
    the note an untied model gets, before the family's own `notes`), the heads and width its
    config states (`num_attention_heads`, `hidden_size`: every config answers to those names,
    GPT-2's through its attribute map), its context (`context_of`), and the forward of its
    trunk (`base_model`) that skips the LM head. `extra` holds the rarer `ModelView` fields
    (soft-capping, embedding scale).
    """
    config, embedding = model.config, model.get_input_embeddings()
    W_U, b_U = unembedding(model)
    tied = same_tensor(W_U, embedding.weight)
    return ModelView(
        family=family,
        model=model,
        embed=embed if embed is not None else embedding,
        blocks=blocks,
        final_norm=final_norm,
        W_U=W_U,
        W_E=embedding.weight,
        tied=tied,
        n_heads=config.num_attention_heads,
        d_model=config.hidden_size,
        max_positions=context_of(config),
        b_U=b_U,
        notes=(*tie_notes(tied, model), *notes),
        forward=trunk_forward(model.base_model),
        **extra,
    )


#: Where Hugging Face configs state the context (GPT-2: n_positions; the others:
#: max_position_embeddings), in the order they are read.
CONTEXT_FIELDS = ("n_positions", "max_position_embeddings")


def context_of(config: object) -> int | None:
    """The context in tokens a Hugging Face config states (the first of `CONTEXT_FIELDS`
    set to an int), or None."""
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def positions(input_ids: Tensor) -> Tensor:
    """Default position ids (1, seq) on the ids' device, as Hugging Face models build them."""
    return torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)


__all__ = [
    "CONTEXT_FIELDS",
    "SHARED_NORM_PARALLEL_NOTE",
    "BlockLayout",
    "Sublayer",
    "context_of",
    "hf_model_view",
    "positions",
    "tie_notes",
    "trunk_forward",
    "unembedding",
]
