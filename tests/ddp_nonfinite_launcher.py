"""Test-only torchrun entry point: `resstream train` with one NaN put into rank 1's optimizer
state just before checkpoint `RESSTREAM_TEST_NAN_STEP` is saved (rank 0's stays finite), so
that only rank 1 can find it, or (`RESSTREAM_TEST_FULL_DISK_STEP`) rank 0's write of that
checkpoint failing for a full disk (tests/test_ddp_failures.py)."""

from __future__ import annotations

import errno
import os

from resstream.cli.entry import run
from resstream.training.loop import Trainer

POISONED_STEP = int(os.environ.get("RESSTREAM_TEST_NAN_STEP", "0"))
FULL_DISK_STEP = int(os.environ.get("RESSTREAM_TEST_FULL_DISK_STEP", "0"))
save_checkpoint = Trainer._save_checkpoint
write_checkpoint = Trainer._write_checkpoint


def poisoned_save(self: Trainer, step: int, val_loss: float) -> None:
    if step == POISONED_STEP and self.dist.rank == 1:
        moments = next(iter(self.optimizer.state.values()))
        moments["exp_avg"].view(-1)[0] = float("nan")
    save_checkpoint(self, step, val_loss)


def failing_write(self: Trainer, step: int, val_loss: float) -> None:
    if step == FULL_DISK_STEP:
        raise OSError(errno.ENOSPC, "No space left on device")
    write_checkpoint(self, step, val_loss)


Trainer._save_checkpoint = poisoned_save  # type: ignore[method-assign]
Trainer._write_checkpoint = failing_write  # type: ignore[method-assign]

if __name__ == "__main__":
    run()
