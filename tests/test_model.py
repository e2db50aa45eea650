"""The gated GPT: initialisation, exact baseline at α = 1, gate algebra and gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from resstream.training.config import ModelConfig
from resstream.training.gates import FixedGate, LearnedGate
from resstream.training.model import GPT


def tiny(**overrides) -> ModelConfig:
    base = dict(n_layer=3, n_head=2, d_model=16, block_size=12, vocab_size=50)
    base.update(overrides)
    return ModelConfig(**base)


def build(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny(**overrides))


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))


def test_residual_projections_use_scaled_init_and_the_rest_0_02():
    torch.manual_seed(0)
    n_layer = 4
    model = GPT(ModelConfig(n_layer=n_layer, n_head=4, d_model=256, block_size=64, vocab_size=4096))
    expected = 0.02 / math.sqrt(2 * n_layer)
    for i, block in enumerate(model.blocks):
        for proj in (block.attn.c_proj, block.mlp.c_proj):
            assert proj.weight.std().item() == pytest.approx(expected, rel=0.02), f"block {i}"
            assert torch.all(proj.bias == 0)
        assert block.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.02)
        assert block.mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.02)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("pos_emb", ["learned", "rotary", "none"])
def test_fixed_gate_with_alpha_one_reproduces_the_baseline_bit_for_bit(tokens, norm_position, pos_emb):
    common = dict(norm_position=norm_position, pos_emb=pos_emb)
    baseline = build(**common)
    gated = build(gate="fixed", alpha=1.0, cut_layer=1, **common)
    gated.load_state_dict(baseline.state_dict())
    logits_a, loss_a = baseline(tokens, tokens)
    logits_b, loss_b = gated(tokens, tokens)
    assert torch.equal(logits_a, logits_b)
    loss_a.backward()
    loss_b.backward()
    for (name, pa), (_, pb) in zip(baseline.named_parameters(), gated.named_parameters(), strict=True):
        assert torch.equal(pa.grad, pb.grad), name


def test_same_seed_gives_same_weights_for_every_gate():
    reference = build(seed=3).state_dict()
    for gate in ("fixed", "learned", "router"):
        state = build(seed=3, gate=gate).state_dict()
        for name, value in reference.items():
            assert torch.equal(state[name], value), (gate, name)


def test_block_computes_the_design_equation_pre_norm():
    model = build(gate="fixed", alpha=0.25, cut_layer=0)
    block = model.blocks[0]
    x = torch.randn(2, 5, 16)
    alpha = torch.tensor(0.25)
    y = 0.25 * x + block.attn(block.ln1(x))
    expected = y + block.mlp(block.ln2(y))
    assert torch.allclose(block(x, alpha), expected, atol=0, rtol=0)


def test_block_computes_the_design_equation_post_norm():
    model = build(norm_position="post")
    block = model.blocks[0]
    x = torch.randn(2, 5, 16)
    y = block.ln1(0.5 * x + block.attn(x))
    expected = block.ln2(y + block.mlp(y))
    assert torch.equal(block(x, torch.tensor(0.5)), expected)


def test_fixed_gate_scales_only_its_layer():
    gate = FixedGate(n_layer=4, cut_layer=2, alpha=0.3)
    alphas = gate(torch.zeros(1, 1, 8))
    assert alphas[0] is None and alphas[1] is None and alphas[3] is None
    assert alphas[2].item() == pytest.approx(0.3)


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5])
def test_fixed_gate_refuses_alpha_outside_unit_interval(alpha):
    with pytest.raises(ValueError, match="outside"):
        FixedGate(n_layer=4, cut_layer=1, alpha=alpha)


def test_learned_gate_starts_uniform_and_computes_one_minus_s_p():
    gate = LearnedGate(n_layer=4, strength=0.4)
    alphas = torch.stack(gate(torch.zeros(1, 1, 8)))
    assert torch.allclose(alphas, torch.full((4,), 1 - 0.4 / 4))
    with torch.no_grad():
        gate.logits.copy_(torch.tensor([0.0, math.log(3.0), 0.0, 0.0]))
    # p = (1, 3, 1, 1) / 6
    alphas = torch.stack(gate(torch.zeros(1, 1, 8)))
    assert torch.allclose(alphas, torch.tensor([1 - 0.4 / 6, 1 - 0.4 * 3 / 6, 1 - 0.4 / 6, 1 - 0.4 / 6]))
    assert torch.allclose(gate.distribution(), torch.tensor([1, 3, 1, 1]) / 6)


def test_router_gate_is_uniform_at_init_and_per_token():
    model = build(gate="router", gate_strength=0.5)
    h0 = torch.randn(2, 5, 16)
    alphas = model.gate(h0)
    assert len(alphas) == 3 and alphas[0].shape == (2, 5, 1)
    assert torch.allclose(torch.stack(alphas), torch.full((3, 2, 5, 1), 1 - 0.5 / 3))
    with torch.no_grad():
        model.gate.router.weight.normal_()
    alphas = model.gate(h0)
    assert not torch.allclose(alphas[0][0, 0], alphas[0][0, 1])  # depends on the token


@pytest.mark.parametrize("gate", ["learned", "router"])
def test_gate_gradients_flow_and_distribution_moves(tokens, gate):
    model = build(gate=gate)
    before = model.gate.distribution().clone()
    optimizer = torch.optim.Adam(model.gate.parameters(), lr=0.1)
    for _ in range(5):
        _, loss = model(tokens, tokens)
        optimizer.zero_grad()
        loss.backward()
        grads = [p.grad for p in model.gate.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)
        optimizer.step()
    model(tokens, tokens)  # refresh the router's running distribution
    after = model.gate.distribution()
    assert after.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert (after - before).abs().max() > 1e-3


def test_hidden_states_start_at_the_embedding_and_end_before_final_norm(tokens):
    model = build()
    states = model.hidden_states(tokens)
    assert len(states) == model.config.n_layer + 1
    positions = torch.arange(tokens.shape[1])
    assert torch.equal(states[0], model.wte(tokens) + model.wpe(positions))
    logits, _ = model(tokens)
    assert torch.equal(logits, F.linear(model.final_norm(states[-1]), model.W_U))


def test_loss_is_cross_entropy_of_the_logits(tokens):
    model = build()
    logits, loss = model(tokens[:, :-1], tokens[:, 1:])
    expected = F.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_rotary_attention_is_causal_and_rmsnorm_works():
    model = build(pos_emb="rotary", norm="rmsnorm")
    x = torch.randint(0, 50, (1, 10))
    full, _ = model(x)
    prefix, _ = model(x[:, :6])
    assert torch.allclose(full[:, :6], prefix, atol=1e-5)


def test_sequence_longer_than_block_size_is_refused():
    with pytest.raises(ValueError, match="block_size"):
        build()(torch.zeros(1, 13, dtype=torch.long))


def test_a_model_without_normalisation_has_no_norm_parameters_and_trains(tokens):
    model = build(norm="none", pos_emb="none")
    assert not [n for n, _ in model.named_parameters() if "ln" in n or "final_norm" in n]
    states = model.hidden_states(tokens)
    logits, loss = model(tokens, tokens)
    assert torch.equal(logits, F.linear(states[-1], model.W_U))  # no final norm either
    loss.backward()
    assert torch.isfinite(model.wte.weight.grad).all()
