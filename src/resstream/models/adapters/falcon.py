"""Adapter for Falcon (`FalconForCausalLM`).

Blocks `transformer.h[l]`, final norm `transformer.ln_f`, h_0 the token embedding
`word_embeddings[t]`; the LM head is tied by default. Attention `self_attention` computes
queries, keys and values with one fused `query_key_value` projection laid out per key/value
group as [the group's queries | its key | its value] (`grouped_qkv_weights`), which covers
all three of Falcon's layouts (`FalconAttention._split_heads`): multi-query (one group: q of
every head, then the one k, then the one v), the new decoder architecture (n_kv_heads
groups), and neither ([q_h | k_h | v_h] per head, one head per group); `dense` writes.
MLP dense_4h_to_h(act(dense_h_to_4h(x))). Projections have biases where `config.bias`.

Blocks are parallel, x + attn(ln_a(x)) + mlp(ln_m(x)), under the new decoder architecture
or `parallel_attn`: with two norms (`ln_attn`, `ln_mlp`) when the new architecture has
`num_ln_in_parallel_attn` 2, else one `input_layernorm` read by both. Otherwise blocks are
serial pre-norm: `input_layernorm` before attention, `post_attention_layernorm` before the
MLP. Rotary positions, or ALiBi's per-head linear bias on attention logits (`config.alibi`),
change only attention probabilities, which the view's `attention` reads as the model
computes them (`_attention_probs`: Falcon cannot switch its attention implementation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from torch import Tensor

from resstream.models.adapters.base import DynamicModule, ModelView
from resstream.models.adapters.layout import BlockLayout, hf_model_view
from resstream.models.adapters.neox import BLOCK as NEOX_BLOCK
from resstream.models.adapters.registry import register
from resstream.models.adapters.weights import FusedQKV, kv_heads_of, linear_weight

#: The fused `query_key_value`, laid out per key/value group as [queries | key | value] of
#: the attention's `head_dim` (key/value heads repeated for the query heads sharing them).
QKV = FusedQKV("query_key_value", grouped=True, d_head="head_dim")

#: The serial block: GPT-NeoX's (`input_layernorm` before attention, `post_attention_layernorm`
#: before the MLP, `dense`, dense_4h_to_h(act(dense_h_to_4h(x)))), attention `self_attention`
#: with key/value groups.
BLOCK = replace(
    NEOX_BLOCK,
    attention=replace(
        NEOX_BLOCK.attention, module="self_attention", weights=QKV.weights, columns=QKV.columns
    ),
)


def falcon_layout(config: Any) -> tuple[BlockLayout, bool]:
    """The block layout and whether blocks are parallel, as `FalconDecoderLayer.forward` reads
    its norms: `ln_attn` / `ln_mlp` for the new architecture with two norms, one
    `input_layernorm` for both sub-layers in other parallel blocks, `BLOCK` for serial ones."""
    new = bool(config.new_decoder_architecture)
    norms = config.num_ln_in_parallel_attn or (2 if new else 1)  # the layer's own default
    if new and norms == 2:
        return _with_norms(BLOCK, "ln_attn", "ln_mlp"), True
    if new or config.parallel_attn:
        return _with_norms(BLOCK, "input_layernorm", "input_layernorm"), True
    return BLOCK, False


def _with_norms(layout: BlockLayout, attention_norm: str, mlp_norm: str) -> BlockLayout:
    """`layout` with the norms before attention and before the MLP at other paths."""
    return replace(
        layout,
        attention=replace(layout.attention, norm=attention_norm),
        mlp=replace(layout.mlp, norm=mlp_norm),
    )


def _notes(config: Any, parallel: bool, layout: BlockLayout, kv_heads: int) -> tuple[str, ...]:
    """The block's residual structure, the key/value sharing and the position scheme."""
    notes: list[str] = []
    if parallel:
        norms = {layout.attention.norm, layout.mlp.norm}
        read = "the one input_layernorm(x)" if len(norms) == 1 else "ln_attn(x) and ln_mlp(x)"
        notes.append(f"parallel attention: attention and MLP both read the block input ({read})")
    if kv_heads < config.num_attention_heads:
        notes.append(
            f"query_key_value holds {kv_heads} key/value head(s) shared by the "
            f"{config.num_attention_heads} query heads; per-head weights repeat them"
        )
    if config.alibi:
        notes.append(
            "ALiBi: a per-head linear position bias on attention logits; only attention probabilities change"
        )
    return tuple(notes)


def _kv_heads(attention: DynamicModule, n_heads: int) -> int:
    """The number of key/value heads attention's `query_key_value` holds."""
    return kv_heads_of(linear_weight(attention.query_key_value).shape[1], n_heads, attention.head_dim)


def _attention_probs(trunk: DynamicModule) -> Callable[[Tensor], tuple[Tensor, ...]]:
    """Per-layer attention probabilities of what the trunk computes. Falcon refuses
    `set_attn_implementation` (its one attention class reads the implementation from the
    config at every forward), and asked for `output_attentions` under "sdpa" it returns wrong
    probabilities (its boolean causal mask is added to the logits as 0 / 1). So rotary models
    run the eager implementation, which computes what "sdpa" does; ALiBi models under "sdpa"
    have their probabilities recomputed as "sdpa" computes them (`_sdpa_alibi_probs`: Falcon's
    eager ALiBi path adds the bias twice, once itself and once in the mask, so it computes
    something else); any other returns its own."""

    def attention(input_ids: Tensor) -> tuple[Tensor, ...]:
        if trunk.config.alibi and trunk.config._attn_implementation == "sdpa":
            return _sdpa_alibi_probs(trunk, input_ids)
        with _eager(trunk.config):
            return tuple(trunk(input_ids=input_ids, output_attentions=True, use_cache=False).attentions)

    return attention


def _sdpa_alibi_probs(trunk: DynamicModule, input_ids: Tensor) -> tuple[Tensor, ...]:
    """softmax(q·kᵀ/√d_head + mask) of every layer, from each attention module's input and
    the mask the trunk hands it (ALiBi's bias included), as "sdpa" computes it."""
    probs: list[Tensor] = []

    def hook(module: DynamicModule, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs["hidden_states"]
        query, key, _ = module._split_heads(module.query_key_value(x))  # (batch, seq, heads, d_head)
        query, key = query.transpose(1, 2), key.transpose(1, 2)
        logits = query @ key.transpose(-1, -2) * module.inv_norm_factor + kwargs["attention_mask"]
        probs.append(logits.softmax(dim=-1))

    handles = [block.self_attention.register_forward_pre_hook(hook, with_kwargs=True) for block in trunk.h]
    try:
        trunk(input_ids=input_ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return tuple(probs)


@contextmanager
def _eager(config: Any) -> Iterator[None]:
    """The config's attention implementation switched from "sdpa" to "eager" while inside."""
    previous = config._attn_implementation
    if previous == "sdpa":
        config._attn_implementation = "eager"
    try:
        yield
    finally:
        config._attn_implementation = previous


@register("falcon")
def falcon_view(model: DynamicModule) -> ModelView:
    """The view of a Falcon causal LM."""
    config = model.config
    trunk = model.transformer
    layout, parallel = falcon_layout(config)
    kv_heads = _kv_heads(trunk.h[0].self_attention, config.num_attention_heads)
    return hf_model_view(
        model,
        family="falcon",
        blocks=layout.views(trunk.h, config.num_attention_heads, parallel=parallel),
        final_norm=trunk.ln_f,
        notes=_notes(config, parallel, layout, kv_heads),
        attention=_attention_probs(trunk),
    )
