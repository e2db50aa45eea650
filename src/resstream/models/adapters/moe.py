"""Adapters for the mixtures of experts: Mixtral, Qwen3-MoE and GPT-OSS.

All three keep Llama's block layout (`model.layers[l]`: `input_layernorm`, `self_attn` with
q/k/v/o projections, `post_attention_layernorm` before the MLP, `model.norm`); the MLP is a
sparse block: a router scores the experts for each token, the top k are kept with weights
(Mixtral and Qwen3-MoE: softmax over all experts, then the top k, renormalised where the
config says so; GPT-OSS: the top k logits, then a softmax over them), and the experts module
(`mlp.experts`, its weights stored as 3-D parameters, no per-expert module) adds the chosen
experts' outputs times their weights. Each expert is a gated MLP:

* Mixtral / Qwen3-MoE: `gate_up_proj` (E, 2·d_ff, d) applied as x @ Wᵀ, gate then up halves,
  m = act(gate)·up, out = m @ `down_proj`[e]ᵀ;
* GPT-OSS: `gate_up_proj` (E, d, 2·d_ff) applied as x @ W + bias, gate and up interleaved
  (even and odd columns), both clamped at `swiglu_limit`, m = (up + 1)·gate·σ(α·gate), out =
  m @ `down_proj`[e] + `down_proj_bias`[e].

The view (`ExpertsView`, base.py) makes the experts' neurons one flat MLP: expert e's neuron j
is neuron e·width + j, its coefficient the router weight times the expert's m (0 where the
token is not routed to e), so the decomposition, DLA, contributions, neurons and interventions
work unchanged and the MLP's output is Σ_k m_k·W_out[k] exactly. GPT-OSS's per-expert output
bias is the expert's last neuron (value vector the bias, coefficient the router weight).
Qwen3-MoE may keep dense MLPs in some layers (`mlp_only_layers`, `decoder_sparse_step`): those
blocks are ordinary gated MLPs. Qwen3-MoE has Qwen3's per-head QK-norm; GPT-OSS has attention
sinks (`self_attn.sinks`, one learned logit per head that takes softmax mass and writes
nothing) and alternating sliding-window layers, which only change attention probabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch
from torch import Tensor
from torch.nn import functional

from resstream.errors import UsageError
from resstream.models.adapters.base import BlockView, DynamicModule, ExpertsView, MLPWeights, ModelView
from resstream.models.adapters.layout import BlockLayout, hf_model_view
from resstream.models.adapters.llama import BLOCK, layout_notes
from resstream.models.adapters.qwen3 import QK_NORM_BLOCK
from resstream.models.adapters.registry import register

#: An expert's coefficients m (n, width) for rows x (n, d) of expert `e`, before routing weights.
ExpertCoefficients = Callable[[DynamicModule, int, Tensor], Tensor]


def _linear_expert(experts: DynamicModule, e: int, x: Tensor) -> Tensor:
    """Mixtral / Qwen3-MoE: act(gate)·up from `gate_up_proj`[e] applied as x @ Wᵀ."""
    gate, up = functional.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
    m: Tensor = experts.act_fn(gate) * up
    return m


def _gpt_oss_expert(experts: DynamicModule, e: int, x: Tensor) -> Tensor:
    """GPT-OSS: the clamped (up + 1)·gate·σ(α·gate) from interleaved columns, then the bias
    neuron's coefficient 1."""
    gate_up = x @ experts.gate_up_proj[e] + experts.gate_up_proj_bias[e]
    m: Tensor = experts._apply_gate(gate_up)
    return torch.cat([m, torch.ones_like(m[..., :1])], dim=-1)


def routed_coefficients(
    expert: ExpertCoefficients,
    experts: DynamicModule,
    width: int,
    x: Tensor,
    index: Tensor,
    weights: Tensor,
) -> Tensor:
    """The flat coefficients (N, n_experts·width) of rows x (N, d) routed to experts `index`
    (N, k) with `weights` (N, k): each routed expert's m times its weight, 0 elsewhere. Each
    expert runs on the rows routed to it, as the experts module runs it."""
    n_experts = int(experts.num_experts)
    m = x.new_zeros(x.shape[0], n_experts, width)
    for e in index.unique().tolist():
        if not 0 <= e < n_experts:  # an index past the experts marks a dropped slot
            continue
        rows, slot = torch.where(index == e)
        weight = weights[rows, slot].unsqueeze(-1)
        m[rows, e] = (expert(experts, e, x[rows]) * weight).to(m.dtype)
    return m.reshape(x.shape[0], n_experts * width)


def _linear_width(experts: DynamicModule) -> int:
    """Neurons per Mixtral / Qwen3-MoE expert: its d_ff."""
    return int(experts.intermediate_dim)


def _gpt_oss_width(experts: DynamicModule) -> int:
    """Neurons per GPT-OSS expert: its d_ff and its output bias."""
    return int(experts.intermediate_size) + 1


def _flat(matrix: Tensor) -> Tensor:
    """(E, a, b) -> (a, E·b): the experts' (in, out) matrices side by side."""
    return matrix.permute(1, 0, 2).reshape(matrix.shape[1], -1)


def _linear_weights(experts: DynamicModule) -> MLPWeights:
    """Mixtral / Qwen3-MoE experts as one flat gated MLP (module docstring)."""
    d_ff = int(experts.intermediate_dim)
    gate_up = experts.gate_up_proj.transpose(1, 2)  # (E, d, 2·d_ff), x @ W
    down = experts.down_proj.transpose(1, 2)  # (E, d_ff, d)
    return MLPWeights(
        W_in=_flat(gate_up[..., :d_ff]),
        W_up=_flat(gate_up[..., d_ff:]),
        W_out=down.reshape(-1, down.shape[-1]),
        act=experts.act_fn,
    )


def _gpt_oss_weights(experts: DynamicModule) -> MLPWeights:
    """GPT-OSS experts as one flat gated MLP whose last neuron per expert is its output bias
    (zero key). `act` is gate·σ(α·gate) without the clamps and the up + 1 of the real gate:
    analyses never call it (the coefficients are recorded), it only names the gate."""
    gate_up, bias = experts.gate_up_proj, experts.gate_up_proj_bias  # (E, d, 2·d_ff), (E, 2·d_ff)

    def with_bias_neuron(columns: Tensor) -> Tensor:  # (E, ..., d_ff) -> (E, ..., d_ff + 1)
        return torch.cat([columns, torch.zeros_like(columns[..., :1])], dim=-1)

    down = torch.cat([experts.down_proj, experts.down_proj_bias.unsqueeze(1)], dim=1)  # (E, d_ff+1, d)
    alpha = float(experts.alpha)
    return MLPWeights(
        W_in=_flat(with_bias_neuron(gate_up[..., ::2])),
        b_in=with_bias_neuron(bias[..., ::2]).reshape(-1),
        W_up=_flat(with_bias_neuron(gate_up[..., 1::2])),
        b_up=with_bias_neuron(bias[..., 1::2]).reshape(-1),
        W_out=down.reshape(-1, down.shape[-1]),
        act=lambda gate: gate * torch.sigmoid(alpha * gate),
    )


def _sparse_layout(layout: BlockLayout, weights: Callable[[DynamicModule], MLPWeights]) -> BlockLayout:
    """`layout` whose MLP is a sparse block: no output projection (the experts' weights are
    3-D parameters), its flat weights read by `weights` from the block's experts."""
    mlp = replace(layout.mlp, out_proj=None, weights=lambda sparse: weights(sparse.experts))
    return replace(layout, mlp=mlp)


def _with_experts(view: BlockView, expert: ExpertCoefficients, width: int) -> BlockView:
    """The view of a block whose MLP is sparse, with its `ExpertsView`; UsageError for
    experts whose weights are packed (quantised), which no flat neuron can be read from."""
    sparse: DynamicModule = view.mlp
    experts = sparse.experts
    _check_unpacked(experts)
    routing = ExpertsView(
        module=experts,
        n_experts=int(experts.num_experts),
        top_k=int(_router(sparse).top_k),
        width=width,
        coefficients=partial(routed_coefficients, expert, experts, width),
    )
    return replace(view, experts=routing)


def _check_unpacked(experts: DynamicModule) -> None:
    """UsageError for an experts module without floating-point `gate_up_proj` weights (GPT-OSS's
    MXFP4 checkpoints loaded with the MXFP4 kernels keep them packed)."""
    weight = getattr(experts, "gate_up_proj", None)
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise UsageError(
            f"the experts ({type(experts).__name__}) hold packed or quantised weights, which resstream "
            "cannot read neuron by neuron; load the model dequantised "
            "(e.g. quantization_config=Mxfp4Config(dequantize=True))"
        )


def _router(sparse: DynamicModule) -> DynamicModule:
    """The router of a sparse MLP block (`gate` in Mixtral / Qwen3-MoE, `router` in GPT-OSS)."""
    return sparse.router if hasattr(sparse, "router") else sparse.gate


def _moe_view(
    model: DynamicModule,
    family: str,
    expert: ExpertCoefficients,
    weights: Callable[[DynamicModule], MLPWeights],
    width: Callable[[DynamicModule], int],
    *,
    layout: BlockLayout = BLOCK,
    notes: tuple[str, ...] = (),
    sinks: bool = False,
) -> ModelView:
    """The view of a model with `layout` (Llama's, or with QK-norm) whose sparse MLP blocks
    get an `ExpertsView` (dense ones stay ordinary gated MLPs); with `sinks` every block's
    attention sinks (`self_attn.sinks`) are read."""
    config, trunk = model.config, model.model
    sparse = _sparse_layout(layout, weights)
    n_heads = config.num_attention_heads

    def view_of_block(layer: DynamicModule) -> BlockView:
        extra = {"sinks": layer.self_attn.sinks} if sinks else {}
        if hasattr(layer.mlp, "experts"):
            view = sparse.view(layer, n_heads, **extra)
            return _with_experts(view, expert, width(layer.mlp.experts))
        return layout.view(layer, n_heads, **extra)

    routing = (
        f"mixture of experts: each token's MLP writes the weighted sum of its {config.num_experts_per_tok} "
        "routed experts; flat neuron e·width + j is expert e's neuron j"
    )
    return hf_model_view(
        model,
        family=family,
        blocks=tuple(view_of_block(layer) for layer in trunk.layers),
        final_norm=trunk.norm,
        notes=(routing, *notes, *layout_notes(layout, config)),
    )


@register("mixtral")
def mixtral_view(model: DynamicModule) -> ModelView:
    """The view of a Mixtral causal LM."""
    return _moe_view(model, "mixtral", _linear_expert, _linear_weights, _linear_width)


@register("qwen3_moe")
def qwen3_moe_view(model: DynamicModule) -> ModelView:
    """The view of a Qwen3-MoE causal LM (QK-norm as Qwen3)."""
    return _moe_view(model, "qwen3_moe", _linear_expert, _linear_weights, _linear_width, layout=QK_NORM_BLOCK)


@register("gpt_oss")
def gpt_oss_view(model: DynamicModule) -> ModelView:
    """The view of a GPT-OSS causal LM (experts with output biases, attention sinks)."""
    sinks = (
        "attention sinks: each head has a learned logit that takes attention mass and writes "
        "nothing, so a row of attention probabilities sums to less than one (1 − Σ = the sink's share)"
    )
    return _moe_view(
        model,
        "gpt_oss",
        _gpt_oss_expert,
        _gpt_oss_weights,
        _gpt_oss_width,
        notes=(sinks,),
        sinks=True,
    )


__all__ = ["routed_coefficients"]
