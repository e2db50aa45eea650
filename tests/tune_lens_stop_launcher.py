"""Test-only torchrun entry point: `resstream tune-lens` with a SIGINT raised in rank 1 alone
while step `RESSTREAM_TEST_STOP_STEP` (1-based) runs (tests/test_tune_lens_parallel.py): every
rank must stop after that same step."""

from __future__ import annotations

import os
import signal

from resstream.api.lens_trainer import LensTrainer
from resstream.cli.entry import run

STOP_STEP = int(os.environ["RESSTREAM_TEST_STOP_STEP"])
step = LensTrainer.step


def step_with_ctrl_c(self: LensTrainer, windows):  # type: ignore[no-untyped-def]
    if self.steps_done == STOP_STEP - 1 and os.environ.get("RANK") == "1":
        signal.raise_signal(signal.SIGINT)
    return step(self, windows)


LensTrainer.step = step_with_ctrl_c  # type: ignore[method-assign]

if __name__ == "__main__":
    run()
