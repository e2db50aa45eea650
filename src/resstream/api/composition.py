"""`resstream.composition(...)`: Q-, K- and V-composition scores of every pair of heads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

from resstream.analysis.memories.composition import (
    BASELINE_SAMPLES,
    BASELINE_SEED,
    CompositionResult,
    Convention,
    check_convention,
    check_samples,
)
from resstream.analysis.memories.composition import composition as composition_scores
from resstream.api.inputs import LoadOptions, one_model, takes_load_args
from resstream.models import LoadArgs, ModelLike

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@takes_load_args
def composition(
    model: ModelLike = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    convention: Convention = "resstream",
    samples: int = BASELINE_SAMPLES,
    seed: int = BASELINE_SEED,
    progress: bool = False,
    **load: Unpack[LoadArgs],
) -> CompositionResult:
    """How much every later head reads what every earlier head writes, from the weights alone
    (Elhage et al. 2021; formulas in `resstream.analysis.memories.composition` and docs/attribution.md).

    `model` is a spec (loaded with `dtype`, `device`, `device_map`, `trust_remote_code`; None:
    the built-in reference model) or a model in memory, as for `resstream.lens`. `tokenizer`
    is accepted like every analysis's, for a model in memory, and not used: the scores need
    no text. `convention` says which norms enter the head matrices: "resstream" (default) or
    "transformer-lens" (TransformerLens's folded-and-centred weights; pre-norm models only).
    The random baseline is the mean score of `samples` draws of Gaussian matrices of the
    model's shapes, seeded with `seed`. `progress`: bars while a spec loads.

    Returns a `CompositionResult`: the (L, H, L, H) scores `q`, `k`, `v` ([l1, h1, l2, h2],
    NaN where l2 <= l1), `baseline`, `convention`, `top(kind, n)` and `to_dict()`
    (composition.json). UsageError for a model with fewer than 2 layers, an unknown
    convention, or "transformer-lens" for a post-norm model.
    """
    check_convention(convention)
    check_samples(samples)
    options = LoadOptions.of(
        load, tokenizer=tokenizer, progress=progress, needs_tokenizer=False, reads_blocks=True
    )
    with one_model(model, options) as loaded:
        return composition_scores(
            loaded.view, model=loaded.name, convention=convention, samples=samples, seed=seed
        )
