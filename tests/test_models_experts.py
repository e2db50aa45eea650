"""Mixtures of experts (Mixtral, Qwen3-MoE, GPT-OSS) and attention sinks (GPT-OSS): the flat,
routed coefficients are what the experts compute, token by token, by hand; the routing the view
records is the model's own router's; the MLP's output is Σ_k m_k·W_out[k]; sinks take mass."""

from __future__ import annotations

import copy

import pytest
import torch

from resstream.analysis.attribution.decomposition import decompose
from resstream.capture import attention_probs
from resstream.capture.internals import block_internals
from resstream.models.adapters import view_of
from resstream.models.adapters.base import BlockView
from tests.test_models_adapters import SEQ, tiny_ids, tiny_model

MOE = ("mixtral", "qwen3_moe", "gpt_oss")


def _router(sparse: torch.nn.Module) -> torch.nn.Module:
    return sparse.router if hasattr(sparse, "router") else sparse.gate


def _expert_by_hand(experts: torch.nn.Module, e: int, x: torch.Tensor) -> torch.Tensor:
    """One token's coefficients in expert e, from the experts' parameters written out."""
    if hasattr(experts, "gate_up_proj_bias"):  # GPT-OSS: interleaved, clamped, bias neuron
        gate_up = x @ experts.gate_up_proj[e] + experts.gate_up_proj_bias[e]
        gate = gate_up[0::2].clamp(max=experts.limit)
        up = gate_up[1::2].clamp(min=-experts.limit, max=experts.limit)
        m = (up + 1) * gate * torch.sigmoid(experts.alpha * gate)
        return torch.cat([m, torch.ones(1, device=x.device)])
    d_ff = experts.intermediate_dim
    gate_up = experts.gate_up_proj[e] @ x
    return experts.act_fn(gate_up[:d_ff]) * gate_up[d_ff:]


def experts_by_hand(block: BlockView, x: torch.Tensor) -> torch.Tensor:
    """The flat coefficients (N, n_experts·width) of MLP inputs x (N, d): the model's router
    picks each token's experts and weights; each routed expert's m times its weight."""
    assert block.experts is not None
    experts = block.mlp.experts
    with torch.no_grad():
        _, weights, index = _router(block.mlp)(x)
        m = torch.zeros(x.shape[0], block.experts.n_experts, block.experts.width, device=x.device)
        for n in range(x.shape[0]):
            for slot in range(index.shape[1]):
                e = int(index[n, slot])
                m[n, e] = weights[n, slot] * _expert_by_hand(experts, e, x[n])
    return m.reshape(x.shape[0], -1)


def minus_expert_write(block: BlockView, columns: list[int] | slice):
    """A forward hook's edit (args, output) of the MLP that removes the write of flat neurons
    `columns`, their coefficients computed by hand from the MLP's input."""
    W_out = block.read_mlp_weights().W_out.detach()

    def edit(args: tuple, out):
        x, written = args[0], out[0] if isinstance(out, tuple) else out  # GPT-OSS: (output, scores)
        m = experts_by_hand(block, x.reshape(-1, x.shape[-1]))[:, columns]
        written = written - (m @ W_out[columns]).reshape(written.shape)
        return (written, *out[1:]) if isinstance(out, tuple) else written

    return edit


@pytest.mark.parametrize("case", MOE)
def test_recorded_coefficients_are_the_experts_by_hand_and_write_the_mlp_output(case: str) -> None:
    view = view_of(tiny_model(case))
    internals = block_internals(view, tiny_ids())
    for block, rec in zip(view.blocks, internals.blocks, strict=True):
        assert block.experts is not None and block.mlp_out_proj is None
        x = rec.mlp_input.reshape(-1, view.d_model)
        by_hand = experts_by_hand(block, x).reshape(rec.coefficients.shape)
        torch.testing.assert_close(rec.coefficients, by_hand, rtol=1e-5, atol=1e-6)
        written = rec.coefficients @ block.read_mlp_weights().W_out.detach()
        torch.testing.assert_close(written, rec.mlp_raw, rtol=1e-5, atol=1e-6)
        routed = (by_hand.reshape(*by_hand.shape[:-1], block.experts.n_experts, -1) != 0).any(-1)
        assert int(routed.sum(-1).max()) <= block.experts.top_k  # only the routed experts write


@pytest.mark.parametrize("case", MOE)
def test_recorded_routing_is_the_models_own_router_output(case: str) -> None:
    model = tiny_model(case)
    view = view_of(model)
    ids = tiny_ids()
    internals = block_internals(view, ids)
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
    for layer, rec in enumerate(internals.blocks):
        logits = out.router_logits[layer].reshape(*ids.shape, -1)
        k = view.blocks[layer].experts.top_k
        theirs = logits.topk(k, dim=-1).indices.sort(-1).values  # top-k logits = top-k softmax
        assert torch.equal(rec.expert_index.sort(-1).values, theirs)
        assert torch.all(rec.expert_weight > 0)


@pytest.mark.parametrize("case", MOE)
def test_flat_neurons_name_their_expert_and_the_decomposition_sums(case: str) -> None:
    view = view_of(tiny_model(case))
    block = view.blocks[0]
    assert block.experts is not None
    width = block.experts.width
    assert block.read_mlp_weights().d_ff == block.experts.n_experts * width
    assert block.experts.expert_of(2 * width + 3) == (2, 3)
    internals = block_internals(view, tiny_ids())
    parts = decompose(view, internals, list(range(SEQ)), neurons=True)
    _, relative = parts.residual()
    assert relative <= 1e-5


def test_gpt_oss_expert_bias_is_each_experts_last_neuron() -> None:
    view = view_of(tiny_model("gpt_oss"))
    block = view.blocks[0]
    experts = block.mlp.experts
    W_out = block.read_mlp_weights().W_out
    width = block.experts.width
    assert width == experts.intermediate_size + 1
    for e in range(block.experts.n_experts):
        assert torch.equal(W_out[e * width + width - 1], experts.down_proj_bias[e])


def test_gpt_oss_sinks_take_attention_mass_and_rows_sum_to_one_without_them() -> None:
    model = tiny_model("gpt_oss")
    view = view_of(model)
    assert view.blocks[0].sinks is view.blocks[0].attn.sinks
    probs = attention_probs(view, tiny_ids())
    assert torch.all(probs.sum(-1) < 1) and torch.all(probs.sum(-1) > 0)
    sunk = copy.deepcopy(model)
    with torch.no_grad():
        for layer in sunk.model.layers:
            layer.self_attn.sinks.fill_(-1e9)  # a sink that takes no mass
    rows = attention_probs(view_of(sunk), tiny_ids()).sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))
    assert any("sink" in note for note in view.notes)


@pytest.mark.parametrize("case", MOE)
def test_ablating_an_expert_removes_its_write_and_its_direct_effect_is_minus_its_dla(case: str) -> None:
    from resstream.analysis.attribution.readouts import readouts
    from resstream.analysis.decoding.decoder import decoder_of
    from resstream.analysis.interventions.carry import final_change
    from resstream.analysis.interventions.components import Component, ComponentSpace, parse_components
    from resstream.analysis.interventions.engine import edits, run_interventions
    from resstream.analysis.interventions.metrics import measure, measure_direct
    from resstream.analysis.interventions.runs import capture_run, zero_values
    from tests.test_interventions_paths import POSITION, hand_forward

    view = view_of(tiny_model(case))
    ids = tiny_ids(1)
    run, decoder = capture_run(view, ids), decoder_of(view)
    block, layer = view.blocks[0], 0
    expert = int(run.internals.blocks[layer].expert_index[0, POSITION, 0])  # routed at the position
    component = Component(layer, "expert", expert)
    space = ComponentSpace(view.n_layers, view.n_heads, block.read_mlp_weights().d_ff, SEQ, 4)
    assert parse_components(["L0.E*"], space)[expert] == component
    columns = block.experts.neurons(expert)
    hand = hand_forward(view, ids, post=[(block.mlp, minus_expert_write(block, columns))])
    final = run_interventions(run, [edits([component], zero_values(run), torch.arange(SEQ))], POSITION)
    torch.testing.assert_close(final, hand, rtol=1e-5, atol=1e-5)
    assert abs(float(measure(decoder, final, 7).logprob[0] - measure(decoder, hand, 7).logprob[0])) <= 1e-5
    # the direct path: minus the expert's DLA (its neurons' DLA summed)
    at = torch.tensor([POSITION])
    read = readouts(view, run.internals, decoder, at, torch.tensor([7]))
    m = run.activation(component, at)  # (1, width)
    written = m.double() @ block.read_mlp_weights().W_out.detach()[columns].double()
    dla = float((written * read.mlp[layer][0]).sum())
    base = run.block_input(view.n_layers)[POSITION]
    clean = measure_direct(decoder, base, torch.zeros(1, view.d_model), 7)
    direct = measure_direct(decoder, base, final_change(run, component, -m, at), 7)
    assert abs(float(direct.logit[0] - clean.logit[0]) + dla) <= 1e-5 * max(1.0, abs(dla))
    assert dla != 0


def test_an_expert_of_a_dense_model_is_refused() -> None:
    from resstream.analysis.interventions.components import ComponentSpace, parse_component
    from resstream.errors import UsageError

    with pytest.raises(UsageError, match="this model's MLPs have no experts"):
        parse_component("L0.E1", ComponentSpace(2, 4, 48, SEQ))
    with pytest.raises(UsageError, match=r"expert 4 is out of range; allowed: 0\.\.3"):
        parse_component("L0.E4", ComponentSpace(2, 4, 48, SEQ, 4))


def test_experts_with_packed_weights_are_refused_with_the_way_out() -> None:
    from resstream.errors import UsageError

    model = copy.deepcopy(tiny_model("gpt_oss"))
    for layer in model.model.layers:  # what MXFP4 kernels leave: packed integer blocks
        del layer.mlp.experts.gate_up_proj
        layer.mlp.experts.gate_up_proj = torch.zeros(4, 8, dtype=torch.uint8)
    with pytest.raises(UsageError, match=r"packed or quantised weights.*Mxfp4Config\(dequantize=True\)"):
        view_of(model)


def test_a_mixture_with_a_dense_block_has_a_width_per_block() -> None:
    """Qwen3-MoE's `mlp_only_layers`: block 0 a dense gated MLP (48 neurons), block 1 sparse
    (4 experts × 24): the decomposition sums, neuron names are checked per block, AtP refuses."""
    import transformers as tf

    from resstream.analysis.decoding.decoder import decoder_of
    from resstream.analysis.interventions.atp import attribution_patching
    from resstream.analysis.interventions.components import ComponentSpace, parse_component, parse_components
    from resstream.analysis.interventions.effects import Readout
    from resstream.analysis.interventions.runs import capture_run
    from resstream.errors import UsageError
    from tests.test_models_adapters import _hf_config

    config = tf.Qwen3MoeConfig(**{**_hf_config("qwen3_moe").to_dict(), "mlp_only_layers": [0]})
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    view = view_of(model)
    assert view.blocks[0].experts is None and view.blocks[1].experts is not None
    assert [block.d_ff for block in view.blocks] == [48, 96]
    internals = block_internals(view, tiny_ids())
    assert decompose(view, internals, list(range(SEQ)), neurons=True).residual()[1] <= 1e-5
    space = ComponentSpace(2, 4, (48, 96), SEQ, 4)
    assert parse_component("L1.N60", space).index == 60
    assert len(parse_components(["L0.N*"], space)) == 48
    with pytest.raises(UsageError, match=r"neuron 60 is out of range; allowed: 0\.\.47"):
        parse_component("L0.N60", space)
    with pytest.raises(UsageError, match="have 48, 96 neurons; name one block"):
        parse_components(["L*.N*"], space)
    run = capture_run(view, tiny_ids(1))
    with pytest.raises(UsageError, match="as many neurons"):
        attribution_patching(run, run, Readout(decoder_of(view), SEQ - 1, 7))
