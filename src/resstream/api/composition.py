"""`resstream.composition(...)`: Q-, K- and V-composition scores of every pair of heads."""

from __future__ import annotations

from typing import Unpack

from resstream.analysis.circuits.composition import (
    BASELINE_SAMPLES,
    BASELINE_SEED,
    CompositionResult,
    check_samples,
)
from resstream.analysis.circuits.composition import composition as composition_scores
from resstream.api.inputs import LoadOptions, one_model, takes_load_args
from resstream.models import LoadArgs, ModelLike


@takes_load_args
def composition(
    model: ModelLike = None,
    *,
    samples: int = BASELINE_SAMPLES,
    seed: int = BASELINE_SEED,
    progress: bool = True,
    **load: Unpack[LoadArgs],
) -> CompositionResult:
    """How much every later head reads what every earlier head writes, from the weights alone
    (Elhage et al. 2021; formulas in `resstream.analysis.circuits.composition` and docs/attribution.md).

    `model` is a spec (loaded with `dtype`, `device`, `device_map`, `trust_remote_code`; None:
    the built-in reference model) or a model in memory (no tokenizer needed), as for
    `resstream.lens`. The random baseline is the mean score of `samples` draws of Gaussian
    matrices of the model's shapes, seeded with `seed`.

    Returns a `CompositionResult`: the (L, H, L, H) scores `q`, `k`, `v` ([l1, h1, l2, h2],
    NaN where l2 <= l1), `baseline`, `top(kind, n)` and `to_dict()` (composition.json).
    UsageError for a model with fewer than 2 layers.
    """
    check_samples(samples)
    options = LoadOptions.of(load, progress=progress, needs_tokenizer=False)
    with one_model(model, options) as loaded:
        return composition_scores(loaded.view, model=loaded.name, samples=samples, seed=seed)
