"""Test-only torchrun entry point: `resstream train` with one NaN put into rank 1's optimizer
state just before checkpoint `RESSTREAM_TEST_NAN_STEP` is saved (rank 0's stays finite), so
that only rank 1 can find it (tests/test_ddp_failures.py)."""

from __future__ import annotations

import os

from resstream.cli.entry import run
from resstream.training.loop import Trainer

POISONED_STEP = int(os.environ["RESSTREAM_TEST_NAN_STEP"])
save_checkpoint = Trainer._save_checkpoint


def poisoned_save(self: Trainer, step: int, val_loss: float) -> None:
    if step == POISONED_STEP and self.dist.rank == 1:
        moments = next(iter(self.optimizer.state.values()))
        moments["exp_avg"].view(-1)[0] = float("nan")
    save_checkpoint(self, step, val_loss)


Trainer._save_checkpoint = poisoned_save  # type: ignore[method-assign]

if __name__ == "__main__":
    run()
