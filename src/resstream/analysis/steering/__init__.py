"""Steering: directions read from data (`directions`), and what acts on the stream with them.

`find_directions` turns per-text states of two sets of texts into a `DirectionsResult`:
DiffMean, the first principal component of paired differences and a logistic-regression probe
at every layer, each with its held-out ROC-AUC; `save_directions` / `load_directions` write and
read them as safetensors, `export_control_vector` as a llama.cpp control vector (GGUF).
"""

from resstream.analysis.steering.directions import (
    METHODS,
    POSITIONS,
    DirectionsResult,
    HeldOutSplit,
    find_directions,
    held_out_split,
    roc_auc,
)
from resstream.analysis.steering.files import (
    SavedDirections,
    export_control_vector,
    load_directions,
    save_directions,
)

__all__ = [
    "METHODS",
    "POSITIONS",
    "DirectionsResult",
    "HeldOutSplit",
    "SavedDirections",
    "export_control_vector",
    "find_directions",
    "held_out_split",
    "load_directions",
    "roc_auc",
    "save_directions",
]
