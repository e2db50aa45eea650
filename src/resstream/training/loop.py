"""The training loop: the `Trainer`, and `train`, which runs it in a locked run folder.

Single process: `train(config, out_dir)`. Several processes: launch the same command with
`torchrun --nproc_per_node N` (`resstream.training.distributed`); only rank 0 writes files.
The set-up before the first step (corpus, tokenizer, token ids) is
`resstream.training.preparation`; what a resume must keep and restore, and which checkpoint a
stopped run continues from, `resstream.training.resume`; the metrics log
`resstream.training.metrics`.

Good checkpoints (`resstream.training.checkpoint`): a step's loss is computed from the weights
of the checkpoint saved just before it, so that step verifies the checkpoint (finite loss and
gradient norm) or marks it diverged. A stop for non-finite values names the newest good
checkpoint, which `resume=True` continues from.

Ctrl-C keeps the progress. The steps run under `resstream.interrupts.stop_requests`: the first
SIGINT or SIGTERM lets the current step finish (its metrics, evaluation and interval checkpoint
included), saves a checkpoint of it (unless that step saved one already), says so on `log` and
stops with `KeyboardInterrupt` (exit code 130 on the command line); `resume=True` then continues
exactly as an uninterrupted run would have. That checkpoint is unverified like any other. A
second Ctrl-C interrupts at once, leaving the previous checkpoint as the latest. Under torchrun
the ranks agree on the stop once per step (`_stop_agreed`), so every rank stops after the same step.

The learning-rate schedule (warmup, then cosine to `min_lr`) is a function of the run's
`max_steps`. A resume that changes `max_steps` keeps the schedule of the original run
(`schedule_steps`: cosine over the original `max_steps`, `min_lr` after it), so the steps
already taken and the ones to come follow one schedule; the run says so on `log` and records
it in run.json (`lr_schedule`), the checkpoints and model.json (`schedule_steps`).

The module is long because the `Trainer` is one idea: the state of one run (model, optimizer,
step, the checkpoint not yet verified) and the order in which a step, an evaluation and a save
change it; what a run does before its first step, or to resume after a stop, is in
`preparation` and `resume`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any, TypedDict, Unpack

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from resstream.data import save_tokenizer
from resstream.data.shards import StoredCorpus
from resstream.data.tokenizer import tokenizer_fingerprint
from resstream.devices import resolve_device
from resstream.distributed import Failure, any_rank, exchange, on_main_first
from resstream.errors import RunError
from resstream.interrupts import StopRequests, stop_requests
from resstream.io import run_record, write_json
from resstream.notices import say
from resstream.rundir import check_free_space, refuse_another_commands_run, write_failure
from resstream.training import checkpoint as ckpt
from resstream.training.budget import check_training_budget
from resstream.training.config import TrainConfig, from_dict
from resstream.training.data import check_enough_tokens, eval_starts, micro_batch, windows
from resstream.training.distributed import check_batch_layout, init_distributed, run_lock
from resstream.training.metrics import METRICS_FILE, MetricsLog, read_records
from resstream.training.model import GPT
from resstream.training.optim import apply_optim_config, lr_scale, make_optimizer, set_lr
from resstream.training.preparation import (
    Log,
    model_task,
    open_corpus,
    resolve_vocab,
    run_tokenizer,
    saying,
    store_directory,
    token_splits,
)
from resstream.training.records import TrainResult
from resstream.training.resume import (
    check_resume_compatible,
    check_resume_steps,
    checkpoint_to_resume,
    good_checkpoint_text,
    out_of_space,
    refuse_identity_changes,
    rng_state,
    schedule_steps,
    set_rng_state,
)

#: Dense bf16 peak FLOP/s of known accelerators, for the MFU estimate.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}
#: How a run stopped by Ctrl-C continues, as the library says it (the command line says its flags).
RESUME_HINT = "`resume=True` continues from it"


def peak_flops(config: TrainConfig, device: torch.device) -> float | None:
    """The FLOP/s to compute MFU against: `peak_flops`, else a known GPU's bf16 peak."""
    if config.run.peak_flops > 0:
        return config.run.peak_flops
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in PEAK_FLOPS.items():
            if key in name:
                return value
    return None


def layer_grad_norms(model: GPT) -> list[float]:
    """L2 norm of the gradient of each block's parameters."""
    norms = []
    for block in model.blocks:
        grads = [p.grad for p in block.parameters() if p.grad is not None]
        norms.append(
            float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
        )
    return norms


class Trainer:
    """One training run. `run()` trains from the start or from the latest checkpoint.

    Building it checks every input and prepares everything the first step needs, in the
    order of `resstream.training.preparation`; `resume` continues the run in `out_dir` from its
    latest checkpoint; `progress` shows a progress bar and names slow set-up steps on `log`,
    which also receives the run's one-line notices. `resume_hint` ends the line a run stopped
    by Ctrl-C says: how to continue it.
    """

    def __init__(
        self,
        config: TrainConfig,
        out_dir: str | os.PathLike[str],
        *,
        resume: bool = False,
        progress: bool = True,
        log: Log = say,
        resume_hint: str = RESUME_HINT,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.resume = resume
        self.progress = progress
        self.log = log
        self.resume_hint = resume_hint
        self.checkpoint = checkpoint_to_resume(self.out_dir, resume)
        check_resume_steps(
            self.checkpoint.step if self.checkpoint else None, config.run.max_steps, self.out_dir
        )
        device_kind = resolve_device(config.run.device).type
        self.dist = init_distributed(device_kind)
        self.device = resolve_device(config.run.device, local_rank=self.dist.local_rank)
        check_training_budget(config, self.device, world=self.dist.world)
        if config.run.threads > 0:
            torch.set_num_threads(config.run.threads)
        check_batch_layout(config, self.dist.world)
        status = log if progress and self.dist.is_main else None  # names slow set-up steps
        self.corpus = open_corpus(config, status)
        self.store = store_directory(config) if isinstance(self.corpus, StoredCorpus) else None
        self.tokenizer = run_tokenizer(config, self.corpus, self.out_dir, resume, status)
        self.config = resolve_vocab(config, len(self.tokenizer))
        check_training_budget(self.config, self.device, world=self.dist.world)  # the real vocabulary
        check_resume_compatible(self.checkpoint, self.config, self.tokenizer, self.corpus)
        self.schedule_steps = schedule_steps(self.config, self.checkpoint)
        self.splits = token_splits(self.config, self.corpus, self.tokenizer, self.dist, status)
        check_enough_tokens(
            self.splits.train, self.config.model.block_size, "training", sequences=self.config.run.batch_size
        )
        check_enough_tokens(self.splits.val, self.config.model.block_size, "validation")
        with saying(model_task(self.config, self.checkpoint), status):
            self._build_model()

    # ----------------------------------------------------------------- set-up
    def _build_model(self) -> None:
        torch.manual_seed(self.config.run.seed)
        self.model = GPT(self.config.model).to(self.device)
        fused = self.device.type == "cuda"
        self.optimizer = make_optimizer(self.model, self.config.optim, fused=fused)
        self.start_step = 0
        self.unverified: int | None = None  # step of a saved checkpoint no step has run from yet
        if self.checkpoint is not None:
            ckpt.load_weights(self.model, self.checkpoint.model_state, self.checkpoint.path)
            self.optimizer.load_state_dict(self.checkpoint.optimizer_state)
            apply_optim_config(self.optimizer, self.config.optim)
            set_rng_state(self.checkpoint.rng_state, self.device)
            self.start_step = self.checkpoint.step
            self.unverified = None if self.checkpoint.verified else self.checkpoint.step
        self.forward_model: nn.Module = self.model
        if self._compile():
            compiled = torch.compile(self.model)
            assert isinstance(compiled, nn.Module), "torch.compile of a module is a module"
            self.forward_model = compiled
        self.ddp: DistributedDataParallel | None = None  # several processes: gradients all-reduced
        if self.dist.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.forward_model, device_ids=ids)
            self.forward_model = self.ddp
        self.amp_dtype = self._amp_dtype()
        self.peak = peak_flops(self.config, self.device)
        self.flops_per_token = self.model.flops_per_token()

    def _compile(self) -> bool:
        mode = self.config.run.compile
        return mode == "on" or (mode == "auto" and self.device.type == "cuda")

    def _amp_dtype(self) -> torch.dtype | None:
        dtype = self.config.run.dtype
        if dtype == "bfloat16" or (dtype == "auto" and self.device.type == "cuda"):
            return torch.bfloat16
        return None

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    # ------------------------------------------------------------------- steps
    def _batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.config.run
        x, y = micro_batch(
            self.splits.train,
            self.config.model.block_size,
            r.batch_size,
            seed=r.seed,
            step=step,
            micro=micro,
            grad_accum=r.grad_accum,
            rank=self.dist.rank,
            world=self.dist.world,
        )
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def train_step(self, step: int, *, layer_norms: bool = False) -> tuple[float, float, list[float] | None]:
        """Forward and backward of step `step` over the global batch, then gradient clipping.

        Returns the mean loss, the gradient norm before clipping and, when `layer_norms`,
        each block's gradient norm before clipping. The caller steps the optimizer.
        """
        r, o = self.config.run, self.config.optim
        set_lr(self.optimizer, self._lr_scale(step))
        total = torch.zeros((), device=self.device)
        for micro in range(r.grad_accum):
            x, y = self._batch(step, micro)
            last = micro == r.grad_accum - 1  # gradients are all-reduced in its backward only
            context = self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext()
            with context, self._autocast():
                _, loss = self.forward_model(x, y)
                (loss / r.grad_accum).backward()
            total += loss.detach() / r.grad_accum
        if self.dist.world > 1:
            dist.all_reduce(total, op=dist.ReduceOp.AVG)
        loss_value = float(total)
        if not math.isfinite(loss_value):
            self.optimizer.zero_grad(set_to_none=True)
            raise self._diverged(step, "training loss", str(loss_value))
        per_layer = layer_grad_norms(self.model) if layer_norms else None
        max_norm = o.grad_clip if o.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise self._diverged(step, "gradient norm", str(grad_norm))
        return loss_value, grad_norm, per_layer

    def _diverged(self, step: int, what: str, value: str) -> RunError:
        """The stop of a run whose step `step` (0-based) was computed from non-finite values.

        The weights it started from are those of checkpoint `step`, if one was saved: that
        checkpoint is marked diverged, so a resume continues from the newest good one.
        """
        reason = f"non-finite {what} ({value}) at step {step + 1}"
        if self.unverified == step and self.dist.is_main:
            ckpt.mark_diverged(self.out_dir, step, reason)
        return RunError(f"{reason}; stopped, {good_checkpoint_text(self.out_dir)}")

    def _verified(self, step: int, loss: float, grad_norm: float) -> None:
        """Step `step` ran from checkpoint `step`'s weights with finite values: it is good."""
        if self.unverified == step:
            if self.dist.is_main:
                ckpt.mark_verified(self.out_dir, step, loss=loss, grad_norm=grad_norm)
            self.unverified = None

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss over fixed, evenly spaced windows (the same for every run)."""
        r, block = self.config.run, self.config.model.block_size
        starts = eval_starts(len(self.splits.val), block, r.eval_batches * r.batch_size)
        mine = starts[self.dist.rank :: self.dist.world]
        self.model.eval()
        sums = torch.zeros(2, device=self.device, dtype=torch.float64)
        for chunk in mine.split(r.batch_size):
            x, y = windows(self.splits.val, chunk, block)
            with self._autocast():
                _, loss = self.model(x.to(self.device), y.to(self.device))
            sums += torch.tensor(
                [float(loss) * len(chunk), len(chunk)], device=self.device, dtype=torch.float64
            )
        self.model.train()
        if self.dist.world > 1:
            dist.all_reduce(sums)
        return float(sums[0] / sums[1])

    # --------------------------------------------------------------- the loop
    def run(self) -> TrainResult:
        """Train to `max_steps`, logging, evaluating and checkpointing on the way. A disk that
        fills up stops the run with one line (`_out_of_space`)."""
        try:
            return self._train()
        except OSError as exc:
            failure = out_of_space(exc, self.out_dir, self._checkpoint_bytes())
            if failure is None:
                raise
            raise failure from None

    def _train(self) -> TrainResult:
        r = self.config.run
        main = self.dist.is_main
        if main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._check_disk_space()
            ckpt.remove_leftovers(self.out_dir)  # also of a fresh run killed before its first checkpoint
            resumed = self.checkpoint.step if self.checkpoint is not None else None
            if resumed is not None and resumed != ckpt.latest_checkpoint_step(self.out_dir):
                ckpt.set_latest(self.out_dir, resumed)  # went back from a diverged checkpoint
            self._write_run_files()
            self._say_schedule()
        log = MetricsLog(self.out_dir / METRICS_FILE, main, self.checkpoint.step if self.checkpoint else None)
        tokens_per_step = r.batch_size * self.config.model.block_size
        losses: list[float] = []
        val_loss = self.checkpoint.state.get("val_loss", math.nan) if self.checkpoint else math.nan
        if self.start_step == r.max_steps:  # checkpointed at its last step: nothing to train
            val_loss = self._validation_loss(self.start_step)
        bar = tqdm(
            total=r.max_steps,
            initial=self.start_step,
            disable=not (self.progress and main),
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )
        self.model.train()
        window_time, window_tokens = 0.0, 0  # training time only: evals and saves excluded
        with stop_requests() as stop:
            for step in range(self.start_step, r.max_steps):
                done = step + 1
                logging = done % r.log_interval == 0 or done == r.max_steps
                started = time.perf_counter()
                loss, grad_norm, per_layer = self.train_step(step, layer_norms=logging)
                self._verified(step, loss, grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                losses.append(loss)
                window_time += time.perf_counter() - started
                window_tokens += tokens_per_step
                if logging:
                    tps = window_tokens / window_time
                    log.write(self._step_record(done, loss, grad_norm, per_layer, tps))
                    window_time, window_tokens = 0.0, 0
                    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tps:,.0f}")
                if done % r.eval_interval == 0 or done == r.max_steps:
                    val_loss = self._validation_loss(done)
                    log.write({"step": done, "val_loss": val_loss})
                    bar.set_postfix(loss=f"{loss:.3f}", val=f"{val_loss:.3f}")
                saved = done % r.checkpoint_interval == 0 or done == r.max_steps
                if saved:
                    self._save_checkpoint(done, val_loss)
                bar.update(1)
                if self._stop_agreed(stop):
                    bar.close()
                    self._stop(stop, done, val_loss, saved=saved)
        bar.close()
        if main:
            self._save_final(val_loss)
        records = run_metrics(self.out_dir)
        return TrainResult(
            self.out_dir,
            r.max_steps,
            val_loss,
            tuple(losses),
            mean_tokens_per_s(records),
            config=self.config.to_dict(),
            metrics=records,
        )

    def _stop_agreed(self, stop: StopRequests) -> bool:
        """Whether the run stops after this step: a stop was asked for (SIGINT or SIGTERM) in
        this process or, under torchrun, in any process (one all-reduce per step, only then)."""
        return any_rank(stop.requested, self.dist, self.device)

    def _stop(self, stop: StopRequests, done: int, val_loss: float, *, saved: bool) -> None:
        """Stop after step `done` as asked: checkpoint it (unless `saved` already), say so on
        `log` and raise `KeyboardInterrupt` in every process together."""
        if not saved:
            self._save_checkpoint(done, val_loss)
        if self.dist.world > 1:
            dist.barrier()  # no rank exits before rank 0 has saved
        if self.dist.is_main:
            self.log(
                f"stopped at step {done} of {self.config.run.max_steps}; checkpoint {done} saved; "
                f"{self.resume_hint}"
            )
        stop.stop()

    def _validation_loss(self, step: int) -> float:
        """`evaluate()`, stopping the run when the weights after step `step` give a non-finite loss."""
        val_loss = self.evaluate()
        if not math.isfinite(val_loss):
            raise RunError(
                f"non-finite validation loss ({val_loss}) at step {step}; stopped, "
                f"{good_checkpoint_text(self.out_dir)}"
            )
        return val_loss

    def _lr_scale(self, step: int) -> float:
        """The schedule's multiplier of the base learning rates at `step` (0-based)."""
        o = self.config.optim
        return lr_scale(
            step, warmup_steps=o.warmup_steps, max_steps=self.schedule_steps, min_ratio=o.min_lr / o.lr
        )

    def _say_schedule(self) -> None:
        """On a resume that changed `max_steps`, say which learning-rate schedule the run follows."""
        r, lr = self.config.run, self.config.optim.lr
        if self.checkpoint is None or r.max_steps == self.schedule_steps or self.start_step >= r.max_steps:
            return
        first, last = lr * self._lr_scale(self.start_step), lr * self._lr_scale(r.max_steps - 1)
        self.log(
            f"resuming at step {self.start_step} with `max_steps` {r.max_steps} (was {self.schedule_steps}): "
            f"the learning rate keeps the schedule of the original run (of {self.schedule_steps} steps), "
            f"{first:.3g} at step {self.start_step + 1} to {last:.3g} at step {r.max_steps}"
        )

    def _step_record(
        self, step: int, loss: float, grad_norm: float, per_layer: list[float] | None, tps: float
    ) -> dict[str, Any]:
        dist_p = self.model.gate.distribution()
        return {
            "step": step,
            "loss": loss,
            "lr": self.optimizer.param_groups[0]["lr"],
            "tokens_per_s": tps,  # over all processes
            "mfu": self.flops_per_token * tps / (self.peak * self.dist.world) if self.peak else None,
            "grad_norm": grad_norm,
            "grad_norm_layers": per_layer,
            "gate": dist_p.tolist() if dist_p is not None else None,
            "time": time.time(),
        }

    def _state(self, val_loss: float) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "tokenizer_fingerprint": tokenizer_fingerprint(self.tokenizer),
            "corpus_fingerprint": self.corpus.fingerprint,
            "tokens_fingerprint": self.splits.fingerprint,
            "val_loss": val_loss,
            "schedule_steps": self.schedule_steps,
        }

    def _save_checkpoint(self, step: int, val_loss: float) -> None:
        """Save checkpoint `step` (rank 0); non-finite weights or optimizer state stop the run,
        on every rank together (`_refuse_non_finite_state`), and so does a failed write on rank
        0 under torchrun (its error exchanged: no rank is left in the next all-reduce)."""
        self._refuse_non_finite_state(step)
        on_main_first(lambda: self._write_checkpoint(step, val_loss), self.dist)

    def _write_checkpoint(self, step: int, val_loss: float) -> None:
        """Write checkpoint `step` (the process that writes: rank 0)."""
        try:
            ckpt.save_checkpoint(
                self.out_dir,
                step=step,
                model_state=self.model.state_dict(),
                optimizer_state=self.optimizer.state_dict(),
                rng_state=rng_state(self.device),
                state=self._state(val_loss),
            )
        except ckpt.NonFiniteState as exc:
            raise self._non_finite_error(step, exc.part, exc.found) from None
        except OSError as exc:
            failure = out_of_space(exc, self.out_dir, self._checkpoint_bytes(), f"checkpoint {step}")
            if failure is None:
                raise
            raise failure from None
        self.unverified = step

    def _refuse_non_finite_state(self, step: int) -> None:
        """Before checkpoint `step` is saved, every rank checks its own copy of the weights and
        optimizer state (replicated, so they should agree) and the ranks exchange their verdicts
        (`resstream.distributed.exchange`, once per checkpoint): when any rank finds a
        non-finite value, every rank raises the same one-line `RunError`, the lowest such
        rank's, so no rank is left waiting at the next collective."""
        opt_tensors, _ = ckpt.flatten_optimizer(self.optimizer.state_dict())
        parts = {"weights": self.model.state_dict(), "optimizer state": opt_tensors}
        verdict: Failure | None = None
        try:
            ckpt.refuse_non_finite(f"checkpoint step {step}", parts)
        except ckpt.NonFiniteState as exc:
            where = f" on rank {self.dist.rank}" if self.dist.world > 1 else ""
            verdict = Failure(self.dist.rank, self._non_finite_error(step, f"{exc.part}{where}", exc.found))
        exchange(verdict, self.dist)

    def _non_finite_error(self, step: int, part: str, found: ckpt.NonFinite) -> RunError:
        """The stop for non-finite values in `part` when checkpoint `step` was to be saved."""
        return RunError(
            f"non-finite {part} ({found}) at step {step}; stopped, checkpoint {step} not "
            f"written, {good_checkpoint_text(self.out_dir)}"
        )

    def _weights_bytes(self) -> int:
        """Bytes of the model's weights (and buffers) as `model.safetensors` holds them."""
        return sum(t.numel() * t.element_size() for t in self.model.state_dict().values())

    def _checkpoint_bytes(self) -> int:
        """Bytes of one checkpoint: the weights and AdamW's two moments, each the weights' size."""
        return 3 * self._weights_bytes()

    def _check_disk_space(self) -> None:
        """Refuse to start a run whose checkpoints cannot fit: a fresh run keeps two checkpoints
        while writing a third, then the final weights; a resumed one adds one checkpoint."""
        checkpoints = 1 if self.checkpoint is not None else 3
        need = (3 * checkpoints + 1) * self._weights_bytes()
        check_free_space(self.out_dir, need, "out_dir")

    def _write_run_files(self) -> None:
        tok_dir = self.out_dir / ckpt.TOKENIZER_DIR
        if self.checkpoint is None or not tok_dir.is_dir():  # a fresh run replaces any leftover
            save_tokenizer(self.tokenizer, tok_dir)
        record = run_record(
            self.config.to_dict(),
            seed=self.config.run.seed,
            device=str(self.device),
            dataset_fingerprint=self.splits.fingerprint,
        )
        record.update(
            corpus={
                "name": self.corpus.name,
                "origin": self.corpus.origin,
                "fingerprint": self.corpus.fingerprint,
            },
            tokens={"train": len(self.splits.train), "val": len(self.splits.val)},
            token_store=None
            if self.store is None
            else {
                "directory": str(self.store.resolve()),
                "fingerprint": self.splits.fingerprint,
            },
            world_size=self.dist.world,
            parameters=self.model.num_params(),
            lr_schedule={
                "max_steps": self.schedule_steps,
                "rule": "linear warmup over warmup_steps, cosine to min_lr at step max_steps, min_lr "
                "after it; a resume with another max_steps keeps the original run's schedule",
            },
        )
        write_json(self.out_dir / ckpt.RUN_RECORD, record)

    def _save_final(self, val_loss: float) -> None:
        meta = {
            **self._state(val_loss),
            "steps": self.config.run.max_steps,
            "format": "resstream-gpt",
            "parameters": self.model.num_params(),
        }
        ckpt.save_model(self.out_dir, self.model.state_dict(), meta)


def completed_run(config: TrainConfig, out_dir: str | os.PathLike[str]) -> TrainResult | None:
    """The result of the run in `out_dir` when its final model already has `max_steps` steps
    (a resume then has nothing to train and writes nothing); None otherwise."""
    out_dir = Path(out_dir)
    if not (out_dir / ckpt.MODEL_FILE).is_file():
        return None
    meta, _ = ckpt.read_run(out_dir)
    steps = int(meta.get("steps", 0))
    if steps < config.run.max_steps:
        return None
    refuse_another_commands_run(out_dir, "train", "out_dir")
    saved = from_dict(meta["config"])
    if config.model.vocab_size == 0:  # "from the tokenizer": the run resolved it when it trained
        config = dataclasses.replace(
            config, model=dataclasses.replace(config.model, vocab_size=saved.model.vocab_size)
        )
    refuse_identity_changes(meta["config"], config)
    val_loss = float(meta["val_loss"]) if meta.get("val_loss") is not None else math.nan
    records = run_metrics(out_dir)
    return TrainResult(
        out_dir,
        steps,
        val_loss,
        (),
        mean_tokens_per_s(records),
        already_complete=True,
        config=meta["config"],
        metrics=records,
    )


def run_metrics(out_dir: Path) -> tuple[dict[str, Any], ...]:
    """The records of the run's metrics.jsonl (none when it has none)."""
    path = out_dir / METRICS_FILE
    return tuple(read_records(path)) if path.is_file() else ()


def mean_tokens_per_s(records: tuple[dict[str, Any], ...]) -> float:
    """The median throughput of the logged steps (NaN when none logged one)."""
    rates = [rec["tokens_per_s"] for rec in records if "tokens_per_s" in rec]
    return float(np.median(rates)) if rates else math.nan


class TrainerOptions(TypedDict, total=False):
    """How a `Trainer` runs, the keywords `train` hands it: ``resume`` (default False),
    ``progress`` (default True), ``log`` (default stderr) and ``resume_hint``, as the `Trainer`
    documents them."""

    resume: bool
    progress: bool
    log: Log
    resume_hint: str


def train(
    config: TrainConfig, out_dir: str | os.PathLike[str], **options: Unpack[TrainerOptions]
) -> TrainResult:
    """Train a resstream GPT as `config` says, writing the run into `out_dir`; `resume` the run
    there from its latest checkpoint, show `progress` (the `Trainer`'s keywords: `TrainerOptions`).

    Ctrl-C (SIGINT) or SIGTERM lets the current step finish, saves a checkpoint of it and raises
    `KeyboardInterrupt` after one line on `log` that ends with `resume_hint` (how to continue);
    a second Ctrl-C interrupts at once.

    The directory is locked for the whole run (`resstream.rundir`): a second process that
    trains, resumes or evaluates into it is refused until this one ends. `log` receives the
    run's one-line notices (default: stderr), such as which learning-rate schedule a resume
    with another `max_steps` follows, and, with `progress`, what is being prepared before the
    first step (corpus, tokenizer, token cache, model). A resume of a run whose final model
    already has `max_steps` steps trains nothing, writes nothing and returns a result with
    `already_complete` set.
    """
    with run_lock(out_dir, param="out_dir"):
        try:
            done = completed_run(config, out_dir) if options.get("resume") else None
            if done is not None:
                return done
            return Trainer(config, out_dir, **options).run()
        except OSError as exc:  # a full disk or lost permission while writing the run's files
            failure = write_failure(exc, Path(out_dir), "out_dir", kept="its complete checkpoints are kept")
            if failure is None:
                raise
            raise failure from None
