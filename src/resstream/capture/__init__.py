"""resstream.capture: forward hooks that record residual-stream points (no analysis here)."""

from resstream.capture.hooks import first_tensor, record, residual_states, run_forward

__all__ = ["first_tensor", "record", "residual_states", "run_forward"]
