"""The metrics of an intervention are read no less precisely than the model computes them: on
a float64 model an identity intervention changes nothing, exactly, and a tiny change agrees
with the model's own float64 forward to ~1e-12 (scores in float32 were off by ~1e-7); means
are kept in float64; a final state zeroed on a model without biases in its read-out leaves
every score equal, so no token is strictly above the target (rank 0) on either path."""

from __future__ import annotations

import copy

import pytest
import torch

from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.effects import Readout, component_effects
from resstream.analysis.interventions.runs import accumulate_means, capture_run, run_values, zero_values
from resstream.models.adapters import view_of
from tests.test_models_adapters import SEQ, tiny_ids, tiny_model

POSITION = SEQ - 1
TARGET = 7
#: RMSNorm final norm and a bias-free unembedding.
BIAS_FREE = ("llama", "resstream_rotary_rms")


@pytest.fixture(scope="module")
def double():
    """A float64 tiny resstream GPT (its norms compute in the input's dtype; Hugging Face's
    RMSNorm computes in float32 whatever the model's dtype), its view, ids and recorded run."""
    model = copy.deepcopy(tiny_model("resstream_rotary_rms")).double()
    view = view_of(model)
    ids = tiny_ids(1)
    return model, view, ids, capture_run(view, ids, attention=False)


def _effects(run, component, values) -> dict:
    """The total and direct effect of setting `component` from `values`, by path."""
    readout = Readout(decoder_of(run.view), POSITION, TARGET)
    found = component_effects(run, readout, values, [[component]], mode="patch", clean=readout.of_run(run))
    return {effect.path: effect for effect in found}


def test_an_identity_intervention_changes_nothing_exactly(double) -> None:
    _model, _view, _ids, run = double
    for component in (Component(1, "head", 1), Component(0, "mlp"), Component(1, "resid", position=POSITION)):
        for effect in _effects(run, component, run_values(run, run)).values():
            assert (effect.d_logprob, effect.d_logit, effect.kl, effect.d_rank) == (0.0, 0.0, 0.0, 0), effect


def test_a_tiny_change_agrees_with_the_models_own_float64_forward(double) -> None:
    """1e-6 added to the input of block 1 at the position: Δ log p(target), Δ logit and KL as
    the model's own float64 logits give them, to 1e-12."""
    model, view, ids, run = double
    layer = 1
    shift = 1e-6 * torch.randn(view.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def shifted(component: Component, positions: torch.Tensor) -> torch.Tensor:
        return run.block_input(layer)[positions] + shift

    def nudge(module, args):
        h = args[0].clone()
        h[:, POSITION] += shift
        return (h, *args[1:])

    with torch.no_grad():
        clean = torch.log_softmax(model(ids)[0][0, POSITION], -1)
        handle = view.blocks[layer].module.register_forward_pre_hook(nudge)
        try:
            logits = model(ids)[0][0, POSITION]
        finally:
            handle.remove()
    patched = torch.log_softmax(logits, -1)
    effect = _effects(run, Component(layer, "resid", position=POSITION), shifted)["total"]
    hand_kl = float((clean.exp() * (clean - patched)).sum())
    assert effect.d_logprob != 0.0
    assert abs(effect.d_logprob - float(patched[TARGET] - clean[TARGET])) <= 1e-12
    assert abs(effect.logit - float(logits[TARGET])) <= 1e-12
    assert abs(effect.kl - hand_kl) <= 1e-12


def test_means_are_kept_in_float64(double) -> None:
    _model, _view, _ids, run = double
    means = accumulate_means([run])
    assert means.z[1].dtype == means.resid.dtype == torch.float64
    by_hand = run.internals.blocks[1].z[0].double().mean(0)
    assert torch.allclose(means.z[1], by_hand.reshape(means.z[1].shape), rtol=0, atol=1e-15)


@pytest.mark.parametrize("case", BIAS_FREE)
def test_a_zeroed_final_state_without_biases_ranks_the_target_0_on_both_paths(case: str) -> None:
    """Every score is 0 there: no token strictly above the target (the direct path read the
    base's scores minus the state's own, which left float noise and ranks in the tens)."""
    view = view_of(tiny_model(case))
    run = capture_run(view, tiny_ids(1), attention=False)
    assert decoder_of(view).bias is None
    effects = _effects(run, Component(view.n_layers, "resid", position=POSITION), zero_values(run))
    vocab = view.W_U.shape[0]
    for effect in effects.values():
        assert effect.rank == 0, effect
        assert effect.logit == 0.0 and abs(effect.logprob + torch.log(torch.tensor(vocab * 1.0))) < 1e-6
