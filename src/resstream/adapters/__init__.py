"""resstream.adapters: one module per model family, each mapping a model to a `ModelView`.

`view_of(model)` picks the adapter from the registry (keyed by `config.model_type`;
resstream's own GPT is "resstream"); `load_model(spec)` loads a model by directory or hub
name and returns its view with the tokenizer. Importing this package does not import
`transformers`.
"""

from resstream.adapters.base import BlockView, ModelView
from resstream.adapters.loading import (
    DTYPES,
    LoadedModel,
    check_model,
    is_causal_config,
    load_model,
)
from resstream.adapters.registry import (
    ADAPTERS,
    family_of,
    register,
    supported_families,
    view_of,
)

__all__ = [
    "ADAPTERS",
    "DTYPES",
    "BlockView",
    "LoadedModel",
    "ModelView",
    "check_model",
    "family_of",
    "is_causal_config",
    "load_model",
    "register",
    "supported_families",
    "view_of",
]
