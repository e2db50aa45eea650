"""resstream.models.adapters: one module per model family, each mapping a model to a `ModelView`.

`view_of(model)` picks the adapter from the registry (`registry`), keyed by the model's
`config.model_type` (resstream's own GPT declares "resstream"). A family module declares
where its pieces are (`layout.BlockLayout`) and how its weights are stored (`weights`).
Adapters only read a model's structure: they import torch, never `transformers`, `training`
or `data`; the model they read is a `DynamicModule` (typed `Any`: its submodules are
attributes built at run time, which static types cannot describe).
"""

from resstream.models.adapters.base import AttentionWeights, BlockView, DynamicModule, MLPWeights, ModelView
from resstream.models.adapters.registry import ADAPTERS, family_of, register, supported_families, view_of

__all__ = [
    "ADAPTERS",
    "AttentionWeights",
    "BlockView",
    "DynamicModule",
    "MLPWeights",
    "ModelView",
    "family_of",
    "register",
    "supported_families",
    "view_of",
]
