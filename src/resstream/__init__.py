"""resstream: the residual stream of causal Transformer language models.

`resstream.shift`, `.lens`, `.attribute`, `.attribute_corpus`, `.decompose`, `.directions`, `.neurons`,
`.compare`, `.composition`, `.recency`, `.simulate`, `.tune_lens`, `.evaluate_lens`,
`.evaluate_model`, `.load_lens`, `.ablate`, `.patch`, `.faithfulness`, `.routes`,
`.routes_corpus`, `.train`, `.sweep`, `.verify` and `.generate` are
the Python API (each in the module of its name under `resstream.api`; `attribute_corpus` beside
`attribute`, `routes_corpus` beside `routes`, `evaluate_lens` beside `tune_lens`,
`evaluate_model` in `api.evaluate`, `load_lens` in `api.decoders`, `ablate` and `patch` in
`api.interventions`), imported on first use (torch is heavy).

The open stream (`resstream.stream`): `.trace` reads any named activation of your own model,
`.edited` runs it under edits — `.Set`, `.Add`, `.Scale`, `.Project`, `.Clamp`, `.Apply` —
as a context manager.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

__version__ = "0.1.0"

if _TYPE_CHECKING:
    from resstream.api.attribute import attribute, attribute_corpus
    from resstream.api.compare import compare
    from resstream.api.composition import composition
    from resstream.api.decoders import load_lens
    from resstream.api.decompose import decompose
    from resstream.api.directions import directions
    from resstream.api.evaluate import evaluate_model
    from resstream.api.faithfulness import faithfulness
    from resstream.api.generate import generate
    from resstream.api.interventions import ablate, patch
    from resstream.api.lens import lens
    from resstream.api.neurons import neurons
    from resstream.api.recency import recency
    from resstream.api.routes import routes, routes_corpus
    from resstream.api.shift import shift
    from resstream.api.simulate import simulate
    from resstream.api.steer import attenuation, steer
    from resstream.api.sweep import sweep
    from resstream.api.train import train
    from resstream.api.tune_lens import evaluate_lens, tune_lens
    from resstream.api.verify import verify
    from resstream.stream.edited import edited
    from resstream.stream.edits import Add, Apply, Clamp, Project, Scale, Set
    from resstream.stream.trace import trace

__all__ = [
    "Add",
    "Apply",
    "Clamp",
    "Project",
    "Scale",
    "Set",
    "ablate",
    "attenuation",
    "attribute",
    "attribute_corpus",
    "compare",
    "composition",
    "decompose",
    "directions",
    "edited",
    "evaluate_lens",
    "evaluate_model",
    "faithfulness",
    "generate",
    "lens",
    "load_lens",
    "neurons",
    "patch",
    "recency",
    "routes",
    "routes_corpus",
    "shift",
    "simulate",
    "steer",
    "sweep",
    "trace",
    "train",
    "tune_lens",
    "verify",
]
#: API functions defined in a module of another name.
_MODULE_OF = {
    "ablate": "interventions",
    "patch": "interventions",
    "attribute_corpus": "attribute",
    "routes_corpus": "routes",
    "evaluate_lens": "tune_lens",
    "evaluate_model": "evaluate",
    "load_lens": "decoders",
    "attenuation": "steer",
    **dict.fromkeys(("Add", "Apply", "Clamp", "Project", "Scale", "Set"), "resstream.stream.edits"),
    "edited": "resstream.stream.edited",
    "trace": "resstream.stream.trace",
}


def __getattr__(name: str):
    """The API functions, imported on first use."""
    if name in __all__:
        module = _MODULE_OF.get(name, name)
        path = module if module.startswith("resstream.") else f"resstream.api.{module}"
        return getattr(_importlib.import_module(path), name)
    raise AttributeError(f"module 'resstream' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names with the API functions, which exist before they are imported (so
    completion in a notebook offers them)."""
    return sorted({*(name for name in globals() if not name.startswith("_")), *__all__, "__version__"})
