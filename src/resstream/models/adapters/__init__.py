"""resstream.models.adapters: one module per model family, each mapping a model to a `ModelView`.

`view_of(model)` picks the adapter from the registry, keyed by the model's
`config.model_type` (resstream's own GPT declares "resstream"). Adapters only read a model's
structure: they import torch, never `transformers`, `training` or `data`.
"""

from resstream.models.adapters.base import AttentionWeights, BlockView, MLPWeights, ModelView
from resstream.models.adapters.registry import ADAPTERS, family_of, register, supported_families, view_of

__all__ = [
    "ADAPTERS",
    "AttentionWeights",
    "BlockView",
    "MLPWeights",
    "ModelView",
    "family_of",
    "register",
    "supported_families",
    "view_of",
]
