"""Effects averaged over resampled runs, and the one-line summary of a result."""

from __future__ import annotations

from dataclasses import replace

from resstream.analysis.interventions.effects import mean_effects
from resstream.analysis.interventions.results import Effect, InterventionResult, Prediction

CLEAN_RANK = 1


def _effect(rank: int, logprob: float, *, component: str = "L0.H0", fraction: float | None = None) -> Effect:
    return Effect(
        component=component,
        kind="head",
        layer=0,
        index=0,
        mode="resample",
        path="total",
        logprob=logprob,
        logit=0.0,
        rank=rank,
        kl=0.0,
        d_logprob=logprob + 1.0,
        d_logit=0.0,
        d_rank=rank - CLEAN_RANK,
        fraction_logprob=fraction,
    )


def test_mean_effects_keeps_the_rank_change_equal_to_the_rank_minus_the_clean_rank() -> None:
    """Mean ranks 2.5 and 1.5 round (half to even) to 2 and 2: the rank change must follow the
    rounded rank, not be rounded on its own."""
    for ranks in ([2, 3], [4, 5], [0, 1, 2, 7]):
        samples = [[_effect(rank, -2.0)] for rank in ranks]
        (mean,) = mean_effects(samples)
        assert mean.d_rank == mean.rank - CLEAN_RANK
        assert abs(mean.rank - sum(ranks) / len(ranks)) <= 0.5


def _result(mode: str, effects: list[Effect]) -> InterventionResult:
    return InterventionResult(
        command="patch",
        mode=mode,
        model="m",
        tokens=("a", "b"),
        position=1,
        target_id=3,
        target="c",
        clean=Prediction(logprob=-1.0, logit=2.0, rank=0),
        effects=tuple(effects),
        n_layers=1,
        n_heads=2,
        corrupt=Prediction(logprob=-3.0, logit=1.0, rank=2),
    )


def test_the_summary_of_denoising_names_the_component_that_restores_most() -> None:
    """Denoising puts one clean component into the corrupted run: every difference from the
    clean run holds most of the gap, so the component that matters is the one that restores
    most (largest fraction), not the one with the largest drop."""
    nothing = replace(_effect(2, -3.0, component="L0.H0", fraction=0.0), mode="patch")
    restores = replace(_effect(0, -1.2, component="L0.H1", fraction=0.9), mode="patch")
    text = repr(_result("denoise", [nothing, restores]))
    assert "L0.H1" in text and "L0.H0" not in text
    noised = repr(_result("noise", [nothing, restores]))
    assert "largest drop L0.H0" in noised
