"""resstream.models: a model for analysis, from a spec string or an object, seen as a `ModelView`.

`load_model(spec)` (module `loading`) resolves a spec — the built-in reference model, a
resstream run directory, a local Hugging Face directory or a hub name — into a checked
`LoadedModel` (view + tokenizer; module `loaded`); `as_loaded(...)` wraps a model already in
memory the same way. Hugging Face models are read by `hf_config` (the config accepted),
`hf_sizes` (whether it fits) and `hf_load` (tokenizer and weights). The `adapters` subpackage
maps each family onto the common `ModelView`.
"""

from resstream.models.adapters import BlockView, ModelView, family_of, register, supported_families, view_of
from resstream.models.loaded import LoadArgs
from resstream.models.loading import (
    DTYPES,
    LoadedModel,
    ModelLike,
    ModelSpec,
    as_loaded,
    check_model,
    is_causal_config,
    is_spec,
    load_model,
)

__all__ = [
    "DTYPES",
    "BlockView",
    "LoadArgs",
    "LoadedModel",
    "ModelLike",
    "ModelSpec",
    "ModelView",
    "as_loaded",
    "check_model",
    "family_of",
    "is_causal_config",
    "is_spec",
    "load_model",
    "register",
    "supported_families",
    "view_of",
]
