"""resstream.capture: forward hooks that record residual-stream points (no analysis here)."""

from resstream.capture.attention import attention_probs
from resstream.capture.hooks import first_tensor, record, residual_states, run_forward
from resstream.capture.internals import BlockInternals, Internals, block_internals

__all__ = [
    "BlockInternals",
    "Internals",
    "attention_probs",
    "block_internals",
    "first_tensor",
    "record",
    "residual_states",
    "run_forward",
]
