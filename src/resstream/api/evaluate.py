"""`resstream.evaluate_model`: benchmark evaluation of any model (a resstream run, the built-in
reference model, a Hugging Face directory or hub name).

Defined in `resstream.models.evaluation`, beside the model loading it needs; re-exported here
so that it is called like the rest of the Python API.
"""

from __future__ import annotations

from resstream.models.evaluation import evaluate_model

__all__ = ["evaluate_model"]
