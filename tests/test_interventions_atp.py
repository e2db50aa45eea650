"""Attribution patching: the estimates are the first-order change of exact patching (central
differences of patches base + ε·(source − base) through the engine, in float64, for several
families), the screen ranks heads and neurons together, and `patch(atp=True)` confirms the
screened components by exact patching."""

from __future__ import annotations

import copy
from functools import cache

import pytest
import torch

from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.interventions.atp import (
    SCREENED_NEURONS,
    AtpEstimates,
    attribution_patching,
    metric_of,
    screen_and_confirm,
    spearman,
)
from resstream.analysis.interventions.components import Component, ComponentSpace
from resstream.analysis.interventions.effects import Readout
from resstream.analysis.interventions.engine import edits, run_interventions
from resstream.analysis.interventions.runs import Run, capture_run
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from tests.test_models_adapters import SEQ, tiny_ids, tiny_model

POSITION = SEQ - 1
TARGET, FOIL = 7, 11
#: Central differences of ± EPSILON of the way to the source activation. Llama- and Gemma-style
#: RMSNorms compute in float32 even in a float64 model, so the difference quotient carries
#: ~1e-5 of rounding there; the tolerance is relative plus a small share of the largest effect.
EPSILON = 1e-3
RELATIVE, OF_LARGEST = 1e-2, 2e-3
CASES = ("gpt2", "gpt_neox", "llama", "gemma2", "resstream_post", "resstream_router", "mixtral", "gpt_oss")


@cache
def _runs(case: str) -> tuple[Run, Run]:
    """A float64 copy of the tiny model (the cached float32 one is left alone): the run of one
    random text and of another (the source of patched values)."""
    model = copy.deepcopy(tiny_model(case)).double()
    if case in ("mixtral", "gpt_oss"):  # the grouped-GEMM experts take no float64
        model.set_experts_implementation("eager")
    view = view_of(model)
    return capture_run(view, tiny_ids(1)), capture_run(view, tiny_ids(1, seed=5))


def _space(run: Run) -> ComponentSpace:
    return ComponentSpace(run.view.n_layers, run.view.n_heads, run.view.blocks[0].d_ff, SEQ)


def _some_neurons(space: ComponentSpace, layers: range) -> list[Component]:
    """Every 5th neuron of each layer (all of them would only repeat the check, slowly)."""
    return [Component(layer, "neuron", k) for layer in layers for k in range(0, space.d_ff, 5)]


def _difference_quotients(
    base: Run, source: Run, readout: Readout, components: list[Component], positions: torch.Tensor
) -> torch.Tensor:
    """(M(base + ε·Δ) − M(base − ε·Δ)) / 2ε for each component alone, Δ = source − base."""

    def toward(sign: float):
        def values(component: Component, at: torch.Tensor) -> torch.Tensor:
            now = base.activation(component, at)
            return now + sign * EPSILON * (source.activation(component, at) - now)

        return values

    with torch.no_grad():
        ends = [
            metric_of(
                readout,
                run_interventions(
                    base,
                    [edits([c], toward(sign), positions) for c in components],
                    POSITION,
                    batch_size=len(components),
                ),
            )
            for sign in (1.0, -1.0)
        ]
    return (ends[0] - ends[1]) / (2 * EPSILON)


def _assert_first_order(estimates: AtpEstimates, components: list[Component], exact: torch.Tensor) -> None:
    estimated = torch.tensor([estimates.of(c) for c in components], dtype=torch.float64)
    tolerance = RELATIVE * exact.abs() + OF_LARGEST * exact.abs().max()
    worst = int(((estimated - exact).abs() - tolerance).argmax())
    assert bool(((estimated - exact).abs() <= tolerance).all()), (
        f"{components[worst].name}: estimate {float(estimated[worst]):.6g}, exact {float(exact[worst]):.6g}"
    )
    assert float(exact.abs().max()) > 1e-2  # the patches do change the metric


@pytest.mark.parametrize("case", CASES)
def test_estimates_are_the_first_order_effect_of_patching(case: str) -> None:
    base, source = _runs(case)
    readout = Readout(decoder_of(base.view), POSITION, TARGET)
    space = _space(base)
    components = space.heads() + space.sublayers() + space.residuals(0) + space.residuals(5)
    components += _some_neurons(space, range(space.n_layers))
    everywhere = torch.arange(SEQ)
    estimates = attribution_patching(base, source, readout)
    exact = _difference_quotients(base, source, readout, components, everywhere)
    _assert_first_order(estimates, components, exact)
    assert estimates.metric == "logprob"
    with torch.no_grad():
        final = base.block_input(base.view.n_layers)[POSITION : POSITION + 1]
        assert estimates.base == pytest.approx(float(metric_of(readout, final)[0]))


def test_logit_difference_and_some_positions() -> None:
    base, source = _runs("gpt2")
    readout = Readout(decoder_of(base.view), POSITION, TARGET, FOIL)
    space = _space(base)
    components = [Component(-1, "emb"), *space.heads(), *space.sublayers()]
    components += _some_neurons(space, range(1, 2))
    positions = torch.tensor([3, 8, POSITION])
    estimates = attribution_patching(base, source, readout, positions)
    exact = _difference_quotients(base, source, readout, components, positions)
    _assert_first_order(estimates, components, exact)
    assert estimates.metric == "logit_diff"
    everywhere = attribution_patching(base, source, readout)
    assert not torch.allclose(everywhere.heads, estimates.heads)  # the positions are what is summed


def _estimates(heads: list[list[float]], neurons: list[list[float]]) -> AtpEstimates:
    n_layers = len(heads)
    return AtpEstimates(
        metric="logprob",
        base=-1.0,
        heads=torch.tensor(heads, dtype=torch.float64),
        neurons=torch.tensor(neurons, dtype=torch.float64),
        blocks=torch.tensor([[5.0, -6.0]] * n_layers, dtype=torch.float64),
        resid=torch.zeros(n_layers + 1, 4, dtype=torch.float64),
        positions=torch.arange(4),
    )


def test_the_screen_pools_heads_and_neurons_by_magnitude() -> None:
    estimates = _estimates([[0.1, -0.5], [0.2, 0.0]], [[0.3, -0.05, 0.0], [-0.4, 0.01, 0.25]])
    assert [c.name for c in estimates.top(4)] == ["L0.H1", "L1.N0", "L0.N0", "L1.N2"]
    assert len(estimates.top(100)) == 4 + 6  # block outputs are not in the pool
    among = [Component(0, "attn"), Component(1, "mlp"), Component(1, "head", 0)]
    assert [c.name for c in estimates.top(2, among)] == ["L1.mlp", "L0.attn"]
    with pytest.raises(UsageError, match="attention sources"):
        estimates.of(Component(0, "source", 1, source=2))


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their average rank: ranks (1.5, 1.5, 3) against (1, 2, 3)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254037844387)
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1], [2]) is None


@pytest.mark.parametrize("direction", ["noise", "denoise"])
def test_a_component_both_runs_share_is_estimated_at_its_exact_effect(direction: str) -> None:
    """Both texts start with the same token, so h_0 at position 0 is the same in both runs:
    patching it changes nothing, and its estimate must equal its exact effect as reported (the
    change from the clean run: zero when noising, the corrupted run's gap when denoising)."""
    view = view_of(tiny_model("llama"))
    ids = tiny_ids(1)
    other = torch.cat([ids[:, :1], tiny_ids(1, seed=5)[:, 1:]], dim=1)
    clean_run, dirty_run = capture_run(view, ids), capture_run(view, other)
    readout = Readout(decoder_of(view), POSITION, TARGET)
    base, source = (clean_run, dirty_run) if direction == "noise" else (dirty_run, clean_run)
    shared = Component(0, "resid", position=0)
    screen = screen_and_confirm(
        base,
        source,
        readout,
        clean=readout.of_run(clean_run),
        corrupt=readout.of_run(dirty_run),
        among=[shared, Component(1, "head", 0), Component(1, "mlp")],
        confirm=3,
    )
    effects, note = screen.effects, screen.note
    found = {e.component: e for e in effects}
    assert [e.mode for e in effects] == ["patch"] * 3 and {e.path for e in effects} == {"total"}
    assert found[shared.name].estimate == pytest.approx(found[shared.name].d_logprob, abs=1e-6)
    gap = float(readout.of_run(dirty_run).logprob[0] - readout.of_run(clean_run).logprob[0])
    assert abs(gap) > 1e-3
    assert found[shared.name].d_logprob == pytest.approx(0.0 if direction == "noise" else gap, abs=1e-6)
    assert "median |estimate − exact|" in note and "Spearman" in note


def test_confirm_may_be_zero_but_not_negative() -> None:
    base, source = _runs("gpt2")
    readout = Readout(decoder_of(base.view), POSITION, TARGET)
    with pytest.raises(UsageError, match=r"`confirm` -1 is not allowed; allowed: 0 \(estimates only\)"):
        screen_and_confirm(base, source, readout, clean=readout.of_run(base), confirm=-1)


def test_the_whole_screen_holds_every_head_and_neuron_and_confirm_zero_patches_nothing() -> None:
    """With `confirm` 0 nothing is patched exactly and the note says so; the screen holds the
    estimate of every head and every neuron (with the base run's gap to the clean run added,
    as the kept estimates have it), the same whatever is confirmed."""
    base, source = _runs("gpt2")
    readout = Readout(decoder_of(base.view), POSITION, TARGET)
    clean = readout.of_run(source)  # base ≠ clean: the estimates carry the gap
    estimates = attribution_patching(base, source, readout)
    alone = screen_and_confirm(base, source, readout, clean=clean, confirm=0)
    confirmed = screen_and_confirm(base, source, readout, clean=clean, confirm=3)
    assert alone.effects == [] and "none confirmed by exact patching" in alone.note
    assert alone.screen.confirmed == () and len(confirmed.screen.confirmed) == 3
    assert confirmed.screen.confirmed == tuple(e.component for e in confirmed.effects)
    gap = float(readout.of_run(base).logprob[0] - clean.logprob[0])
    for screen in (alone.screen, confirmed.screen):
        assert screen.metric == "logprob"
        assert screen.heads.shape == estimates.heads.shape and screen.neurons.shape == estimates.neurons.shape
        assert torch.equal(screen.heads, estimates.heads + gap)
        assert torch.equal(screen.neurons, estimates.neurons + gap)
    kept = {s.component: s.estimate for s in alone.screened}
    assert kept["L1.H0"] == float(alone.screen.heads[1, 0])
    assert all(not s.confirmed for s in alone.screened)


def test_patch_with_atp_confirms_the_top_components() -> None:
    from resstream.api.interventions import patch

    text, corrupt = "The cat sat on the mat and the dog", "The dog sat on the mat and the cat"
    result = patch(text, corrupt=corrupt, atp=True, confirm=5)
    assert len(result.effects) == 5
    assert all(e.mode == "patch" and e.path == "total" and e.estimate is not None for e in result.effects)
    assert {e.kind for e in result.effects} <= {"head", "neuron"}
    sizes = [abs(e.estimate or 0.0) for e in result.effects]
    assert sizes == sorted(sizes, reverse=True)
    assert any("attribution patching" in note for note in result.notes)
    # the estimates kept: every head's and the 100 largest neurons', largest first, the confirmed marked
    screened = result.screened
    assert sum(s.kind == "head" for s in screened) == result.n_layers * result.n_heads
    assert sum(s.kind == "neuron" for s in screened) == SCREENED_NEURONS
    assert [abs(s.estimate) for s in screened] == sorted((abs(s.estimate) for s in screened), reverse=True)
    confirmed = {s.component: s.estimate for s in screened if s.confirmed}
    assert confirmed == {e.component: e.estimate for e in result.effects}
    assert "attribution patching" in repr(result)
    # the whole screen: every head's and neuron's estimate, the confirmed marked
    frame = result.screen.to_pandas()
    assert len(frame) == result.n_layers * (result.n_heads + result.screen.neurons.shape[1])
    assert set(frame.loc[frame.confirmed, "component"]) == set(confirmed)
    by_name = frame.set_index("component")["estimate"]
    assert all(by_name[s.component] == s.estimate for s in screened if s.kind in ("head", "neuron"))
    # the confirmed effects are exact patching: the same as patching those components by name
    plain = patch(text, corrupt=corrupt, components=[e.component for e in result.effects])
    exact = {e.component: e.d_logprob for e in plain.select(path="total")}
    for effect in result.effects:
        assert effect.d_logprob == pytest.approx(exact[effect.component], abs=1e-9)
