"""Adapter for Phi-3 and Phi (Phi-1, Phi-1.5, Phi-2).

Phi-3 (`Phi3ForCausalLM`): Llama's pre-norm RMSNorm block (`model.layers[l]`:
`input_layernorm`, `self_attn`, `post_attention_layernorm` = the norm before the MLP, `mlp`;
final `model.norm`) with fused projections. `self_attn.qkv_proj` computes q | k | v, q
n_heads·d_head wide and k, v n_kv_heads·d_head wide each (grouped-query attention), read by
`fused_qkv_weights` with the head width; `o_proj` writes. `mlp.gate_up_proj` computes gate |
up (chunked in two), the MLP writes down_proj(up · act(gate)). Rotary positions (optionally
partial, long-context scaled) and sliding windows change only attention. No biases.

Phi (`PhiForCausalLM`): one parallel block per layer, x + attn(ln(x)) + mlp(ln(x)), with ONE
`input_layernorm` (LayerNorm) whose output both sub-layers read (the view's ln1 and ln2 are
that module). Attention: q/k/v_proj and the output projection `dense`, all with biases;
with `config.qk_layernorm`, `q_layernorm` / `k_layernorm` (LayerNorms over one head's
d_head, gains shared by the heads) normalise queries and keys before rotary (the view's
q_norm / k_norm, span "head"). Rotary positions cover only the first
partial_rotary_factor·d_head dimensions of each head: attention changes, nothing else.
MLP fc2(act(fc1(x))) with biases; final `model.final_layernorm`; the LM head has a bias (b_U)
and is untied. h_0 is the token embedding (after `embed_dropout`, identity in eval).
"""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor

from resstream.models.adapters.base import DynamicModule, MLPWeights, ModelView
from resstream.models.adapters.layout import BlockLayout, Sublayer, hf_model_view
from resstream.models.adapters.llama import BLOCK as LLAMA_BLOCK
from resstream.models.adapters.llama import llama_like_view, shared_norm_notes, with_qk_norm
from resstream.models.adapters.registry import register
from resstream.models.adapters.weights import FusedQKV, bias_of, linear_weight, projection_mlp_weights

#: Phi-3's fused `qkv_proj`: q | k | v, with the grouped-query widths of the attention's `head_dim`.
PHI3_QKV = FusedQKV("qkv_proj", d_head="head_dim")


def _phi3_mlp_weights(mlp: DynamicModule) -> MLPWeights:
    """The gated MLP down_proj(up · act(gate)), gate | up = gate_up_proj(x) chunked in two."""
    W_gate, W_up = linear_weight(mlp.gate_up_proj).chunk(2, dim=1)
    bias = bias_of(mlp.gate_up_proj)
    b_gate, b_up = bias.chunk(2) if bias is not None else (None, None)
    down = mlp.down_proj
    return MLPWeights(
        W_in=W_gate,
        b_in=b_gate,
        W_up=W_up,
        b_up=b_up,
        W_out=linear_weight(down),
        b_out=bias_of(down),
        act=mlp.activation_fn,
    )


#: Phi-3's block: Llama's, with fused q | k | v and gate | up projections.
PHI3_BLOCK = BlockLayout(
    attention=replace(LLAMA_BLOCK.attention, weights=PHI3_QKV.weights, columns=PHI3_QKV.columns),
    mlp=replace(LLAMA_BLOCK.mlp, weights=_phi3_mlp_weights),
)


@register("phi3")
def phi3_view(model: DynamicModule) -> ModelView:
    """The view of a Phi-3 causal LM."""
    return llama_like_view(model, "phi3", layout=PHI3_BLOCK)


def _phi_mlp_weights(mlp: DynamicModule) -> MLPWeights:
    """Phi's MLP: fc2(act(fc1(x)))."""
    return projection_mlp_weights(mlp.fc1, mlp.fc2, mlp.activation_fn)


def phi_layout(qk_layernorm: bool) -> BlockLayout:
    """Phi's parallel block: one `input_layernorm` read by attention (q/k/v_proj, `dense`) and
    MLP (fc1, fc2); with `qk_layernorm`, the per-head `q_layernorm` / `k_layernorm`."""
    layout = BlockLayout(
        attention=replace(LLAMA_BLOCK.attention, out_proj="dense"),
        mlp=Sublayer("mlp", norm="input_layernorm", out_proj="fc2", weights=_phi_mlp_weights),
    )
    return with_qk_norm(layout, q_norm="q_layernorm", k_norm="k_layernorm") if qk_layernorm else layout


def _phi_notes(model: DynamicModule) -> tuple[str, ...]:
    """What Phi computes beyond a pre-norm block: the parallel block, partial rotary, QK-norm."""
    attn = model.model.layers[0].self_attn
    rotary = (
        f"rotary positions rotate only the first {attn.rotary_ndims} of each head's {attn.head_dim} "
        "dimensions (partial rotary): only attention probabilities depend on it"
    )
    qk_norm = "layer-normalised (q_layernorm / k_layernorm)" if model.config.qk_layernorm else None
    return shared_norm_notes(rotary, qk_norm)


@register("phi")
def phi_view(model: DynamicModule) -> ModelView:
    """The view of a Phi (Phi-1, Phi-1.5, Phi-2) causal LM."""
    config = model.config
    trunk = model.model

    def embed(input_ids: Tensor) -> Tensor:
        return trunk.embed_dropout(trunk.embed_tokens(input_ids))

    layout = phi_layout(bool(config.qk_layernorm))
    return hf_model_view(
        model,
        family="phi",
        blocks=layout.views(trunk.layers, config.num_attention_heads, parallel=True),
        embed=embed,
        final_norm=trunk.final_layernorm,
        notes=_phi_notes(model),
    )
