"""resstream.capture: forward hooks that record residual-stream points (no analysis here)."""

from resstream.capture.attention import attention_probs
from resstream.capture.hooks import first_tensor, record, residual_states, run_forward

__all__ = ["attention_probs", "first_tensor", "record", "residual_states", "run_forward"]
