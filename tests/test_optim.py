"""AdamW groups and the warmup + cosine schedule, against hand-computed values."""

from __future__ import annotations

import math

import pytest

from resstream.training.config import ModelConfig, OptimConfig
from resstream.training.model import GPT
from resstream.training.optim import lr_scale, make_optimizer, param_groups


def test_gains_biases_and_gate_are_not_decayed_and_gate_has_its_own_lr():
    model = GPT(ModelConfig(n_layer=2, n_head=2, d_model=8, block_size=8, vocab_size=20, gate="learned"))
    groups = {g["name"]: g for g in param_groups(model, OptimConfig(lr=1e-3, gate_lr=5e-2, weight_decay=0.1))}
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in groups["decay"]["params"]}
    plain = {names[id(p)] for p in groups["no_decay"]["params"]}
    assert groups["gate"]["params"] == [model.gate.logits]
    assert groups["gate"]["weight_decay"] == 0.0 and groups["gate"]["base_lr"] == 5e-2
    assert groups["no_decay"]["weight_decay"] == 0.0
    assert all(n.endswith(".weight") for n in decayed) and "blocks.0.ln1.weight" not in decayed
    assert {"blocks.0.ln1.weight", "blocks.0.ln1.bias", "blocks.0.attn.c_attn.bias"} <= plain
    total = sum(len(g["params"]) for g in groups.values())
    assert total == len(list(model.parameters()))
    assert len(make_optimizer(model, OptimConfig()).param_groups) == 3


def test_schedule_hand_values():
    kw = dict(warmup_steps=4, max_steps=14, min_ratio=0.1)
    assert [lr_scale(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_scale(4, **kw) == pytest.approx(1.0)
    # halfway through the decay: cos(pi/2) = 0 -> 0.1 + 0.9 * 0.5
    assert lr_scale(9, **kw) == pytest.approx(0.55)
    assert lr_scale(14, **kw) == pytest.approx(0.1)
    assert lr_scale(100, **kw) == pytest.approx(0.1)
    assert lr_scale(6, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2)))
