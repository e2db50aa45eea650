"""Package data: the built-in reference model (weights, tokenizer, config, training record)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from resstream.errors import UsageError

REFERENCE_NAME = "reference"


def reference_model_dir() -> Path:
    """The folder of the shipped reference model, a resstream run directory.

    It was trained with `resstream train --preset reference` on the built-in Shakespeare
    corpus; its `run.json` and `metrics.jsonl` are the training record.
    """
    path = Path(str(resources.files(__name__) / REFERENCE_NAME))
    if not (path / "model.safetensors").is_file():
        raise UsageError(f"the built-in reference model is missing from this installation ({path})")
    return path
