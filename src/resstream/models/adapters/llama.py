"""Adapter for Llama and the families that share its layout: Mistral, Qwen2 and SmolLM3.

Pre-norm RMSNorm blocks: `input_layernorm`, `self_attn` (q/k/v/o projections as
`nn.Linear`; rotary positions, grouped-query attention), `post_attention_layernorm` (the norm
before the MLP), gated `mlp`; final norm `model.norm`. h_0 is the plain token embedding.
Biases: none in Llama/Mistral by default (Llama's `attention_bias` may add them, o_proj
included); Qwen2 has q/k/v biases but no o_proj bias. Llama and Mistral are untied by
default, small Qwen2 models tied. `head_dim` may differ from hidden_size / n_heads.
SmolLM3 leaves rotary positions out of some layers (`config.no_rope_layers`: 0 = no rotary),
which changes only how those layers' queries meet keys, not where anything is read.

Families with QK-norm (Qwen3, Gemma-3, OLMo-2) use this layout `with_qk_norm`: the attention's
`q_norm` / `k_norm` normalise queries and keys after q_proj / k_proj, before rotary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch import Tensor, nn

from resstream.models.adapters.base import AttentionWeights, DynamicModule, MLPWeights, ModelView
from resstream.models.adapters.layout import SHARED_NORM_PARALLEL_NOTE, BlockLayout, Sublayer, hf_model_view
from resstream.models.adapters.registry import register
from resstream.models.adapters.weights import (
    bias_of,
    grouped_head_columns,
    linear_weight,
    per_head,
    per_head_bias,
    projection_mlp_weights,
    repeat_heads,
)


def _attention_weights(attn: DynamicModule, n_heads: int) -> AttentionWeights:
    """Q/K/V per query head from q/k/v_proj; grouped key/value heads repeated (`repeat_heads`)."""

    def read(proj: DynamicModule) -> tuple[Tensor, Tensor | None]:
        W = linear_weight(proj)
        heads = W.shape[1] // attn.head_dim
        W_h = repeat_heads(per_head(W, heads), n_heads)
        return W_h, repeat_heads(per_head_bias(bias_of(proj), heads), n_heads)

    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = (read(p) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    return AttentionWeights(W_Q, W_K, W_V, b_Q, b_K, b_V)


def _qkv_columns(attn: DynamicModule, n_heads: int, which: str, head: int) -> tuple[nn.Module, Tensor]:
    """Query head h's columns of q_proj's output, or those of the key/value head it reads in
    k_proj's / v_proj's (grouped-query attention: shared by its group)."""
    proj = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}[which]
    return proj, grouped_head_columns(linear_weight(proj).shape[1], attn.head_dim, n_heads, head)


def _mlp_weights(mlp: DynamicModule) -> MLPWeights:
    """The gated MLP: down_proj(act(gate_proj(x)) * up_proj(x))."""
    return projection_mlp_weights(mlp.gate_proj, mlp.down_proj, mlp.act_fn, up=mlp.up_proj)


#: Llama's block (`trunk.layers[l]`).
BLOCK = BlockLayout(
    attention=Sublayer(
        "self_attn",
        norm="input_layernorm",
        out_proj="o_proj",
        weights=_attention_weights,
        columns=_qkv_columns,
    ),
    mlp=Sublayer("mlp", norm="post_attention_layernorm", out_proj="down_proj", weights=_mlp_weights),
)
#: Gemma-2's variant: the norm before the MLP is `pre_feedforward_layernorm`, and
#: `post_attention_layernorm` / `post_feedforward_layernorm` normalise the sub-layer outputs
#: before they are added.
SANDWICH_BLOCK = BlockLayout(
    attention=replace(BLOCK.attention, post_norm="post_attention_layernorm"),
    mlp=replace(BLOCK.mlp, norm="pre_feedforward_layernorm", post_norm="post_feedforward_layernorm"),
)


def with_qk_norm(
    layout: BlockLayout, span: str = "head", *, q_norm: str = "q_norm", k_norm: str = "k_norm"
) -> BlockLayout:
    """`layout` whose attention normalises queries and keys with its own norms `q_norm` /
    `k_norm` (after q_proj / k_proj, before rotary) over one head (`span` "head") or over all
    heads' concatenation ("all")."""
    attention = replace(layout.attention, q_norm=q_norm, k_norm=k_norm, qk_norm_span=span)
    return replace(layout, attention=attention)


def qk_norm_note(span: str, how: str = "RMS-normalised") -> str:
    """The note a view with QK-norm over `span` ("head" or "all") gets; `how` names the norm."""
    over = "per head" if span == "head" else "over all heads together"
    return (
        f"queries and keys are {how} {over} before rotary (QK-norm); attention "
        "probabilities are read from the model, composition scores linearise the norm"
    )


def shared_norm_notes(note: str, qk_norm: str | None = None) -> tuple[str, ...]:
    """The notes of a parallel block whose attention and MLP read one shared norm (Phi,
    Cohere): `SHARED_NORM_PARALLEL_NOTE`, the family's own `note`, then, with `qk_norm` (how
    its per-head QK-norm normalises), the QK-norm's note."""
    qk_notes = () if qk_norm is None else (qk_norm_note("head", qk_norm),)
    return (SHARED_NORM_PARALLEL_NOTE, note, *qk_notes)


def layout_notes(layout: BlockLayout, config: Any) -> tuple[str, ...]:
    """The notes a model with a Llama-like `layout` gets from it and its `config`: the
    QK-norm's (`qk_norm_note`) where the layout has one, the sliding windows'
    (`sliding_window_notes`)."""
    attention = layout.attention
    qk_notes = () if attention.q_norm is None else (qk_norm_note(attention.qk_norm_span),)
    return (*qk_notes, *sliding_window_notes(config))


def llama_like_view(
    model: DynamicModule,
    family: str,
    *,
    layout: BlockLayout = BLOCK,
    embed: Callable[[Tensor], Tensor] | None = None,
    notes: tuple[str, ...] = (),
    **extra: Any,
) -> ModelView:
    """The view of a model with Llama's layout (`model.model.layers[l].self_attn.o_proj` ...).

    Gemma, Qwen3 and OLMo-2 share it and pass what they do differently: their block `layout`
    (`SANDWICH_BLOCK`, `with_qk_norm`, ...), their scaled `embed` (default: the plain token
    embedding), their `notes`, and the rarer `ModelView` fields (soft-capping, embedding
    scale) in `extra`. The layout's and config's notes follow the family's (`layout_notes`:
    QK-norm, sliding windows).
    """
    config = model.config
    trunk = model.model
    return hf_model_view(
        model,
        family=family,
        blocks=layout.views(trunk.layers, config.num_attention_heads),
        embed=embed,
        final_norm=trunk.norm,
        notes=(*notes, *layout_notes(layout, config)),
        **extra,
    )


@register("llama")
def llama_view(model: DynamicModule) -> ModelView:
    """The view of a Llama causal LM."""
    return llama_like_view(model, "llama")


@register("mistral")
def mistral_view(model: DynamicModule) -> ModelView:
    """The view of a Mistral causal LM."""
    return llama_like_view(model, "mistral")


@register("qwen2")
def qwen2_view(model: DynamicModule) -> ModelView:
    """The view of a Qwen2 causal LM."""
    return llama_like_view(model, "qwen2")


@register("smollm3")
def smollm3_view(model: DynamicModule) -> ModelView:
    """The view of a SmolLM3 causal LM (Llama's layout; some layers without rotary)."""
    return llama_like_view(model, "smollm3", notes=_no_rope_notes(model.config))


def sliding_window_notes(config: Any) -> tuple[str, ...]:
    """The note naming the layers that attend within a sliding window (`config.layer_types`
    "sliding_attention") of a set `sliding_window`; none for a config without such layers, or
    whose `use_sliding_window` is off (SmolLM3, Qwen)."""
    types = getattr(config, "layer_types", None) or ()
    sliding = [layer for layer, kind in enumerate(types) if kind == "sliding_attention"]
    windowed = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    if not (sliding and windowed):
        return ()
    return (
        f"layers {sliding} attend only to the last {config.sliding_window} tokens (sliding window); "
        "the others to the whole context",
    )


def _no_rope_notes(config: Any) -> tuple[str, ...]:
    """The note naming the layers that use no rotary positions (`config.no_rope_layers`)."""
    without = [layer for layer, rope in enumerate(config.no_rope_layers or ()) if not rope]
    if not without:
        return ()
    return (f"layers {without} use no rotary positions (NoPE): their queries and keys are not rotated",)
