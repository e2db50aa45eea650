"""Interventions against hand computations with plain forward hooks on the model's own forward,
for every family: zero-ablating a head, a neuron, a block output, a residual state; patching
from a second run; the direct effect of a zero ablation is minus the component's DLA."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from resstream.analysis.attribution.readouts import readouts
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.interventions.carry import final_change
from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.engine import edits, run_interventions
from resstream.analysis.interventions.metrics import measure, measure_direct
from resstream.analysis.interventions.runs import capture_run, run_values, zero_values
from resstream.models.adapters import view_of
from tests.test_interventions_paths import hand_forward
from tests.test_models_adapters import ALL_CASES, SEQ, tiny_ids, tiny_model
from tests.test_models_experts import minus_expert_write

TOLERANCE = 1e-5
#: Where the models run: the CPU, or a GPU in a device check (RESSTREAM_TEST_DEVICE=cuda).
DEVICE = os.environ.get("RESSTREAM_TEST_DEVICE", "cpu")
POSITION = SEQ - 1
TARGET = 7


def _setup(case: str):
    model = tiny_model(case) if DEVICE == "cpu" else copy.deepcopy(tiny_model(case)).to(DEVICE)
    view = view_of(model)
    ids = tiny_ids(1).to(DEVICE)
    return view, ids, capture_run(view, ids), decoder_of(view)


def _hand_final(view, ids, module, edit, *, pre: bool) -> torch.Tensor:
    """h_L at POSITION with `edit` applied by one plain hook on the full forward (the input of
    `module` with `pre`, else its output)."""
    if pre:
        return hand_forward(view, ids, pre=[(module, lambda args: (edit(args[0].clone()), *args[1:]))])

    def on_output(args, out):
        return (edit(out[0].clone()), *out[1:]) if isinstance(out, tuple) else edit(out.clone())

    return hand_forward(view, ids, post=[(module, on_output)])


def _engine_logprob(view, run, decoder, components, values):
    positions = torch.arange(SEQ)
    intervention = edits(components, values, positions)
    final = run_interventions(run, [intervention], POSITION)
    return measure(decoder, final, TARGET).logprob[0]


@pytest.mark.parametrize("case", ALL_CASES)
def test_patching_a_head_and_a_source_from_the_same_run_changes_nothing(case: str) -> None:
    """The recorded calls replay the model's own attention: an identity patch gives back the
    recorded prediction bit for bit (a base run recorded under the eager attention and replayed
    under SDPA was off by ~1e-7). Falcon's blocks replay to float rounding only, as before."""
    view, _ids, run, decoder = _setup(case)
    layer = view.n_layers - 1
    recorded = run.internals.blocks[-1].block_output[:, POSITION]
    base = float(measure(decoder, recorded, TARGET).logprob[0])
    slack = 1e-7 if view.family == "falcon" else 0.0
    for component in (Component(layer, "head", 0), Component(layer, "source", 0, source=1)):
        patched = float(_engine_logprob(view, run, decoder, [component], run_values(run, run)))
        assert abs(patched - base) <= slack, (component, patched - base)


@pytest.mark.parametrize("case", ALL_CASES)
def test_zero_ablating_a_head_matches_a_hand_hook(case: str) -> None:
    view, ids, run, decoder = _setup(case)
    layer, head = view.n_layers - 2, 1
    d_head = view.d_head

    def zero_head(z):
        z[..., head * d_head : (head + 1) * d_head] = 0
        return z

    hand = _hand_final(view, ids, view.blocks[layer].out_proj, zero_head, pre=True)
    expected = measure(decoder, hand, TARGET).logprob[0]
    ours = _engine_logprob(view, run, decoder, [Component(layer, "head", head)], zero_values(run))
    assert abs(float(ours - expected)) <= TOLERANCE


@pytest.mark.parametrize("case", ALL_CASES)
def test_zero_ablating_a_neuron_and_a_block_output_match_hand_hooks(case: str) -> None:
    view, ids, run, decoder = _setup(case)

    def zero_neuron(m):
        m[..., 5] = 0
        return m

    block = view.blocks[0]
    if block.experts is None:
        hand = _hand_final(view, ids, block.mlp_out_proj, zero_neuron, pre=True)
    else:  # experts: take neuron 5's write, computed by hand from the routing, off the MLP's output
        hand = hand_forward(view, ids, post=[(block.mlp, minus_expert_write(block, [5]))])
    ours = _engine_logprob(view, run, decoder, [Component(0, "neuron", 5)], zero_values(run))
    assert abs(float(ours - measure(decoder, hand, TARGET).logprob[0])) <= TOLERANCE
    hand = _hand_final(view, ids, view.blocks[1].attn, torch.zeros_like, pre=False)
    ours = _engine_logprob(view, run, decoder, [Component(1, "attn")], zero_values(run))
    assert abs(float(ours - measure(decoder, hand, TARGET).logprob[0])) <= TOLERANCE


@pytest.mark.parametrize("case", ALL_CASES)
def test_patching_a_residual_state_from_a_second_run_matches_a_hand_hook(case: str) -> None:
    view, ids, run, decoder = _setup(case)
    corrupt_ids = ids.clone()
    corrupt_ids[0, 3] = (corrupt_ids[0, 3] + 1) % 100 + 3
    corrupt = capture_run(view, corrupt_ids)
    layer, position = 1, 3
    donor = corrupt.block_input(layer)[position]

    def patch(h):
        h[:, position] = donor
        return h

    hand = _hand_final(view, ids, view.blocks[layer].module, patch, pre=True)
    component = Component(layer, "resid", position=position)
    ours = _engine_logprob(view, run, decoder, [component], run_values(run, corrupt))
    assert abs(float(ours - measure(decoder, hand, TARGET).logprob[0])) <= TOLERANCE


@pytest.mark.parametrize("case", ALL_CASES)
def test_direct_effect_of_zero_ablation_is_minus_the_dla(case: str) -> None:
    view, _ids, run, decoder = _setup(case)
    at = torch.tensor([POSITION])
    read = readouts(view, run.internals, decoder, at, torch.tensor([TARGET]))
    base = run.block_input(view.n_layers)[POSITION]
    clean = measure_direct(decoder, base, torch.zeros(1, view.d_model), TARGET)
    for layer in range(view.n_layers):
        rec = run.internals.blocks[layer]
        z = rec.z[0, POSITION]
        for head in range(view.n_heads):
            dla = float(
                (
                    (z[head].double() @ view.blocks[layer].W_O[head].detach().double()) * read.attn[layer][0]
                ).sum()
            )
            component = Component(layer, "head", head)
            change = final_change(run, component, -z[head].unsqueeze(0), at)
            direct = measure_direct(decoder, base, change, TARGET)
            assert abs(float(direct.logit[0] - clean.logit[0]) + dla) <= 1e-5 * max(1.0, abs(dla))
