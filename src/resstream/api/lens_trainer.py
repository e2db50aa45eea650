"""The training loop of `resstream.tune_lens`: optimiser steps over the split's windows, with
checkpoints that a resumed run continues from bit for bit.

`LensTrainer.step` is one optimiser step: one forward pass per micro-batch of `batch_size`
windows captures h_0..h_L without gradients, `LensObjective.backward` adds every layer's KL
gradient, and the optimiser (`LensOptimiser`) steps once. `train_lens` runs the steps; given a
`CheckpointPlan` it saves the run (`analysis.decoding.lens_checkpoint`) every `every` steps and
after the last, and runs under `interrupts.stop_requests()`: the first Ctrl-C (or SIGTERM)
lets the current step finish, saves a checkpoint, says where and stops with
`KeyboardInterrupt` (exit code 130 on the command line); a second Ctrl-C interrupts at once,
and a resume then continues from the last periodic checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from tqdm.auto import tqdm

from resstream.analysis.decoding.lens_checkpoint import (
    LensCheckpoint,
    momentum_of,
    restore_momentum,
    save_checkpoint,
)
from resstream.analysis.decoding.lens_training import LensObjective, LensOptimiser
from resstream.analysis.decoding.tuned_lens import TunedLens
from resstream.api.lens_data import Ranks
from resstream.capture import residual_states
from resstream.data.store_windows import TokenWindows
from resstream.distributed import Failure, any_rank, exchange, on_main_first, portable
from resstream.errors import RunError
from resstream.interrupts import StopRequests, stop_requests
from resstream.models import LoadedModel, ModelView
from resstream.notices import notify

if TYPE_CHECKING:
    from resstream.api.tune_lens import Split

T = TypeVar("T")


class LensTrainer:
    """One model's lens and its optimiser: `step(windows)` is one optimiser step on a list of
    token windows (micro-batches of `batch_size` sequences, one forward each). `start`: the
    steps already done (a resumed run; `restore` then gives it the checkpoint's state)."""

    def __init__(
        self,
        view: ModelView,
        lens: TunedLens,
        optimiser: LensOptimiser,
        batch_size: int = 8,
        start: int = 0,
        ranks: Ranks | None = None,
    ) -> None:
        self.view = view
        self.ranks = ranks or Ranks()
        self.lens = lens
        self.objective = LensObjective(view)
        self.optimiser = optimiser
        self.optim, self.schedule = optimiser.build(lens.translators, start)
        self.batch_size = batch_size
        self.steps_done = start

    def step(self, windows: Sequence[torch.Tensor]) -> torch.Tensor:
        """One optimiser step; the step's mean KL per layer (L,) in nats (before the step).
        Under torchrun each rank computes the gradient of its share of `windows` (`Ranks`)
        and the ranks sum the gradients and KL sums before the optimiser steps."""
        self.optim.zero_grad(set_to_none=False)
        total = positions(windows)
        sums = self._summed_over_ranks(self._agreed(lambda: self._share_sums(windows, total)))
        kl = sums / total
        _check_finite(kl, self.steps_done)
        self.optimiser.clip(self.lens.translators)
        self.optim.step()
        self.schedule.step()
        self.steps_done += 1
        return kl

    def _share_sums(self, windows: Sequence[torch.Tensor], total: int) -> torch.Tensor:
        """This rank's share of the step: its gradients accumulated, its KL sums (L,) fp64."""
        sums = torch.zeros(self.view.n_layers, dtype=torch.float64)
        for batch in batches(self.ranks.share(windows), self.batch_size):
            states = flat_states(self.view, batch)
            sums += self.objective.backward(self.lens.translators, states, total).cpu()
        return sums

    def _agreed(self, work: Callable[[], T]) -> T:
        """`work()` on every rank, a failure on any rank raised on every rank (the lowest
        failing rank's error): one flag all-reduce per step, the error exchanged only then, so
        no rank is left waiting in the gradient all-reduce. Run directly: `work()`."""
        if self.ranks.world == 1:
            return work()
        failure: Failure | None = None
        try:
            result = work()
        except Exception as error:
            failure = Failure(self.ranks.rank, portable(error))
        device = next(self.lens.translators.parameters()).device
        if any_rank(failure is not None, self.ranks.place, device):
            exchange(failure, self.ranks.place)  # raises the agreed failure
        return result

    def _summed_over_ranks(self, sums: torch.Tensor) -> torch.Tensor:
        """The gradients (float32, each already scaled by the step's total positions) and the
        KL sums `sums` (float64) summed over the ranks: the step's whole gradient and sums."""
        if self.ranks.world == 1:
            return sums
        parameters = list(self.lens.translators.parameters())
        for p in parameters:
            if p.grad is None:  # a rank with no window this step adds nothing
                p.grad = torch.zeros_like(p)
        on_device = sums.to(parameters[0].device)
        self.ranks.sum([*(p.grad for p in parameters if p.grad is not None), on_device])
        return on_device.cpu()

    def parameters(self) -> dict[str, torch.Tensor]:
        """The translators' parameters by name."""
        return dict(self.lens.translators.named_parameters())

    def restore(self, checkpoint: LensCheckpoint) -> None:
        """Take the translators and momentum of `checkpoint` (taken after `start` steps)."""
        if checkpoint.step != self.steps_done:
            raise ValueError(
                f"a trainer built at step {self.steps_done} restores checkpoint {checkpoint.step}"
            )
        self.lens.translators.load_state_dict(checkpoint.translators)
        restore_momentum(self.optim, self.parameters(), checkpoint.momentum)


@dataclass(frozen=True)
class CheckpointPlan:
    """Where a run saves its checkpoint, how often, and the settings a resume must repeat."""

    directory: Path
    every: int
    settings: dict[str, Any]
    resumed: tuple[int, ...] = ()  # the steps earlier resumes of this run continued from

    def due(self, steps_done: int, steps: int) -> bool:
        """Whether a checkpoint is due after `steps_done` of `steps` steps."""
        return steps_done % self.every == 0 or steps_done == steps

    def save(self, trainer: LensTrainer, history: Sequence[float]) -> None:
        """Save the run as it is after the trainer's last step."""
        parameters = trainer.parameters()
        checkpoint = LensCheckpoint(
            step=trainer.steps_done,
            settings=self.settings,
            history=tuple(history),
            translators={name: p.detach() for name, p in parameters.items()},
            momentum=momentum_of(trainer.optim, parameters),
            resumed=self.resumed,
        )
        save_checkpoint(self.directory, checkpoint)


def train_lens(
    loaded: LoadedModel,
    split: Split,
    optimiser: LensOptimiser,
    batch_size: int,
    progress: bool,
    plan: CheckpointPlan | None = None,
    resume: LensCheckpoint | None = None,
    ranks: Ranks | None = None,
) -> tuple[TunedLens, list[float]]:
    """The lens of `loaded` trained on the split's training windows, and the KL curve (bits per
    step); from checkpoint `resume` on where given, saving checkpoints as `plan` says. Under
    torchrun (`ranks`) every rank trains on its share of each step; rank 0 alone saves and
    speaks, and a stop asked for on any rank stops every rank after the same step."""
    start = 0 if resume is None else resume.step
    ranks = ranks or Ranks()
    trainer = LensTrainer(
        loaded.view, TunedLens.zero(loaded.view, loaded.name), optimiser, batch_size, start=start, ranks=ranks
    )
    history = [] if resume is None else list(resume.history)
    if resume is not None:
        trainer.restore(resume)
    with _stops_when_asked(plan) as stop:
        _run_steps(trainer, split, history, progress, plan, stop)
        if plan is not None and stop is not None and _stop_agreed(trainer, stop):  # one clean line
            if ranks.is_main:
                notify(
                    f"tune-lens stopped at step {trainer.steps_done} of {optimiser.steps}; checkpoint saved "
                    f"in {str(plan.directory)!r}; continue with `resume=True` and the same settings"
                )
            stop.stop()
    return trainer.lens, history


def _run_steps(
    trainer: LensTrainer,
    split: Split,
    history: list[float],
    progress: bool,
    plan: CheckpointPlan | None,
    stop: StopRequests | None,
) -> None:
    """The steps left, each followed by a checkpoint when one is due or a stop was asked for
    (then no further step). A stop asked for after the last step's check finds the last step's
    checkpoint saved: it is due."""
    steps = trainer.optimiser.steps
    per_step = len(split.train) // steps
    desc = f"tune-lens {trainer.lens.model}"
    shown = progress and trainer.ranks.is_main
    with tqdm(total=steps, initial=trainer.steps_done, desc=desc, unit="step", disable=not shown) as bar:
        while trainer.steps_done < steps:
            step = trainer.steps_done
            kl = trainer.step(split.train[step * per_step : (step + 1) * per_step])
            history.append(float(kl.mean()) / math.log(2))
            bar.set_postfix(kl_bits=f"{history[-1]:.3f}")
            bar.update()
            stopping = stop is not None and _stop_agreed(trainer, stop)
            if plan is not None and (stopping or plan.due(trainer.steps_done, steps)):
                # a failure of rank 0's save is every rank's
                on_main_first(lambda: plan.save(trainer, history), trainer.ranks.place)
            if stopping:
                return


@contextlib.contextmanager
def _stops_when_asked(plan: CheckpointPlan | None) -> Iterator[StopRequests | None]:
    """`stop_requests()` for a run that saves checkpoints; None (Ctrl-C interrupts) otherwise."""
    if plan is None:
        yield None
        return
    with stop_requests() as stop:
        yield stop


def _stop_agreed(trainer: LensTrainer, stop: StopRequests) -> bool:
    """Whether the run stops after this step: a stop asked for (Ctrl-C, SIGTERM) in this process
    or, under torchrun, in any (one all-reduce per step, only then)."""
    device = next(trainer.lens.translators.parameters()).device
    return any_rank(stop.requested, trainer.ranks.place, device)


def _check_finite(kl: torch.Tensor, step: int) -> None:
    if not bool(torch.isfinite(kl).all()):
        layer = int((~torch.isfinite(kl)).nonzero()[0])
        raise RunError(
            f"tune-lens diverged at step {step + 1}: the KL of layer {layer} is not finite; "
            "try a lower learning rate (`--lr`)"
        )


def positions(windows: Sequence[torch.Tensor]) -> int:
    """The tokens of `windows` in all (windows of a token store: counted without reading them)."""
    if isinstance(windows, TokenWindows):
        return len(windows) * windows.window_length
    return sum(len(w) for w in windows)


def batches(windows: Sequence[torch.Tensor], batch_size: int) -> Iterator[torch.Tensor]:
    """The windows stacked into micro-batches of `batch_size` (the last may be smaller)."""
    for start in range(0, len(windows), batch_size):
        yield torch.stack(list(windows[start : start + batch_size]))


def flat_states(view: ModelView, batch: torch.Tensor, positions: slice = slice(None)) -> torch.Tensor:
    """h_0..h_L of a batch, (L+1, batch·positions, d): one forward without gradients."""
    with torch.inference_mode():
        states = residual_states(view, batch.to(view.W_E.device))[:, :, positions]
    return states.reshape(states.shape[0], -1, states.shape[-1])


def training_record(
    split: Split,
    optimiser: LensOptimiser,
    batch_size: int,
    history: list[float],
    tokens: int,
    resumed: Sequence[int] = (),
) -> dict[str, Any]:
    """The training record kept in lens.json (what `evaluate_lens` rebuilds the split from):
    `tokens` the training tokens asked for, what was trained, and the steps the run was
    resumed from (`resumed`; the lens is the same as without the interruptions)."""
    per_step = len(split.train) // optimiser.steps
    return {
        "dataset": split.dataset,
        "dataset_fingerprint": split.fingerprint,
        "seq_len": split.seq_len,
        "seed": split.seed,
        "train_seqs": len(split.train),
        "eval_seqs": len(split.held_out),
        "sequences_per_step": per_step,
        "tokens": tokens,
        "tokens_per_step": positions(split.train[:per_step]),
        "train_tokens": positions(split.train),
        "batch_size": batch_size,
        "optimiser": {
            "name": "SGD, Nesterov momentum, linear decay to 0",
            "steps": optimiser.steps,
            "lr": optimiser.lr,
            "momentum": optimiser.momentum,
            "weight_decay": optimiser.weight_decay,
            "max_grad_norm": optimiser.max_grad_norm,
        },
        "loss": "sum over layers 0..L-1 of the mean KL(final distribution || lens distribution)",
        "kl_bits_per_step": [round(value, 6) for value in history],
        "resumed_at_steps": list(resumed),
    }


__all__ = ["CheckpointPlan", "LensTrainer", "batches", "flat_states", "train_lens", "training_record"]
