"""The tuned lens's default training recipe, torch-free: `resstream.api.tune_lens` trains with
it, and `resstream tune-lens --help` states it without importing torch."""

from __future__ import annotations

#: The tuned-lens paper's 250 steps, of tokens sized for a laptop (2 × 8 × 128 a step).
DEFAULT_STEPS = 250
DEFAULT_TOKENS_PER_STEP = 2 * 8 * 128
DEFAULT_TOKENS = DEFAULT_STEPS * DEFAULT_TOKENS_PER_STEP
DEFAULT_EVAL_SEQS = 32
DEFAULT_SEQ_LEN = 128
#: Steps between periodic checkpoints: a default run saves 10 times (the reference model's
#: checkpoint is under 1 MB, GPT-2 small's 57 MB: a fraction of one step's time).
DEFAULT_CHECKPOINT_EVERY = 25

__all__ = [
    "DEFAULT_CHECKPOINT_EVERY",
    "DEFAULT_EVAL_SEQS",
    "DEFAULT_SEQ_LEN",
    "DEFAULT_STEPS",
    "DEFAULT_TOKENS",
    "DEFAULT_TOKENS_PER_STEP",
]
