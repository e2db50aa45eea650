"""The training loop: data, model, AdamW, schedule, logging, checkpoints, resume, DDP.

Single process: `train(config, out_dir)`. Several processes: launch the same command with
`torchrun --nproc_per_node N` (`resstream.training.distributed`); only rank 0 writes files.
The metrics log is `resstream.training.metrics`.

Good checkpoints (`resstream.training.checkpoint`): a step's loss is computed from the weights
of the checkpoint saved just before it, so that step verifies the checkpoint (finite loss and
gradient norm) or marks it diverged. A stop for non-finite values names the newest good
checkpoint, which `resume=True` continues from.

The learning-rate schedule (warmup, then cosine to `min_lr`) is a function of the run's
`max_steps`. A resume that changes `max_steps` keeps the schedule of the original run
(`schedule_steps`: cosine over the original `max_steps`, `min_lr` after it), so the steps
already taken and the ones to come follow one schedule; the run says so on `log` and records
it in run.json (`lr_schedule`), the checkpoints and model.json (`schedule_steps`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from resstream.data import (
    CorpusStream,
    build_token_cache,
    cached_bpe,
    load_tokenizer,
    save_tokenizer,
    stream_corpus,
)
from resstream.data.shards import (
    StoredCorpus,
    check_store_tokenizer,
    is_shard_store,
    store_splits,
    stored_corpus,
)
from resstream.data.tokenizer import tokenizer_fingerprint
from resstream.data.tokens import TokenSplits, check_cache_dir
from resstream.devices import resolve_device
from resstream.errors import RunError, UsageError
from resstream.io import final_name, run_record, write_json
from resstream.resources import format_bytes
from resstream.rundir import (
    DISK_FULL,
    check_free_space,
    free_bytes,
    mount_point,
    refuse_another_commands_run,
    write_failure,
)
from resstream.training import checkpoint as ckpt
from resstream.training.budget import check_training_budget
from resstream.training.config import TrainConfig, from_dict, identity_diff
from resstream.training.data import check_enough_tokens, eval_starts, micro_batch, windows
from resstream.training.distributed import check_batch_layout, init_distributed, run_lock
from resstream.training.metrics import METRICS_FILE, MetricsLog, read_records
from resstream.training.model import GPT
from resstream.training.optim import apply_optim_config, lr_scale, make_optimizer, set_lr

#: A step of a run's set-up (corpus, tokenizer, token cache, model) that takes longer than
#: this many seconds says what it does (`Trainer._preparing`).
STATUS_DELAY_S = 0.5

#: Dense bf16 peak FLOP/s of known accelerators, for the MFU estimate.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


@dataclass(frozen=True)
class TrainResult:
    """What a finished run reports."""

    run_dir: Path
    steps: int
    final_val_loss: float
    train_losses: tuple[float, ...]  # losses of the steps this call ran
    tokens_per_s: float
    already_complete: bool = False  # a resume found the final model of `steps` >= max_steps

    @property
    def steps_run(self) -> int:
        """Optimizer steps this call took (0 for a run that was already complete)."""
        return len(self.train_losses)


def default_cache_dir(config: TrainConfig) -> Path:
    """Where token caches live: `cache_dir`, env RESSTREAM_CACHE, or ~/.cache/resstream."""
    if config.run.cache_dir:
        return Path(config.run.cache_dir)
    return Path(os.environ.get("RESSTREAM_CACHE", Path.home() / ".cache" / "resstream"))


def prepare_tokenizer(config: TrainConfig, corpus: CorpusStream | StoredCorpus, out_dir: Path, resume: bool):
    """The run's tokenizer: the saved one when resuming, else trained (`bpe`) or loaded."""
    saved = out_dir / ckpt.TOKENIZER_DIR
    if resume and saved.is_dir():
        return load_tokenizer(str(saved))
    if config.tokenizer.tokenizer == "bpe":
        return cached_bpe(corpus, config.tokenizer.bpe_vocab_size, default_cache_dir(config))
    return load_tokenizer(config.tokenizer.tokenizer, data_dir=config.run.data_dir)


def refuse_bpe_for_a_store(config: TrainConfig, store: Path, stored: StoredCorpus) -> None:
    """A `bpe` tokenizer is trained on the corpus, so it cannot be known before a shard store of
    the corpus exists: a run on a store names the store's tokenizer instead."""
    if config.tokenizer.tokenizer == "bpe":
        raise UsageError(
            f"`tokenizer` 'bpe' trains a tokenizer on the corpus, but the shard store {str(store)!r} "
            f"holds ids of tokenizer {stored.tokenizer!r} already: pass `tokenizer` {stored.tokenizer!r}"
        )


def tokenizer_task(config: TrainConfig, out_dir: Path, resume: bool) -> str:
    """What `prepare_tokenizer` is about to do, in words."""
    if resume and (out_dir / ckpt.TOKENIZER_DIR).is_dir():
        return "loading the run's saved tokenizer"
    if config.tokenizer.tokenizer == "bpe":
        return f"training a {config.tokenizer.bpe_vocab_size}-token byte-level BPE tokenizer on the corpus"
    return f"loading the tokenizer {config.tokenizer.tokenizer!r}"


def model_task(config: TrainConfig, checkpoint: ckpt.Checkpoint | None) -> str:
    """What `Trainer._build_model` is about to do, in words."""
    m = config.model
    shape = f"{m.n_layer} layers x {m.d_model} wide, gate {m.gate!r}"
    if checkpoint is not None:
        return f"building the model ({shape}) from checkpoint step {checkpoint.step}"
    return f"building the model ({shape})"


def resolve_vocab(config: TrainConfig, tokenizer_size: int) -> TrainConfig:
    """Fill in `vocab_size` from the tokenizer (0), or check a padded one is large enough."""
    vocab = config.model.vocab_size
    if vocab == 0:
        vocab = tokenizer_size
    elif vocab < tokenizer_size:
        raise UsageError(f"`vocab_size` {vocab} is smaller than the tokenizer's {tokenizer_size} tokens")
    return dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=vocab))


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


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The random-number state that dropout draws from."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def refuse_identity_changes(saved: dict[str, Any], config: TrainConfig, extra: list[str] = ()) -> None:
    """Refuse to resume with a model, data or tokenizer section other than the saved one."""
    diffs = identity_diff(from_dict(saved), config) + list(extra)
    if diffs:
        raise UsageError(
            "cannot resume: the checkpoint was trained with a different config: " + "; ".join(diffs)
        )


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
    return TrainResult(out_dir, steps, val_loss, (), math.nan, already_complete=True)


def say_on_stderr(line: str) -> None:
    """The default `log` of a run: one line on stderr."""
    print(line, file=sys.stderr, flush=True)


def schedule_steps(config: TrainConfig, checkpoint: ckpt.Checkpoint | None) -> int:
    """The `max_steps` the learning-rate schedule runs over: the run's own, or, on resume, the
    one of the original run (saved with its checkpoints; older checkpoints: their config's)."""
    if checkpoint is None:
        return config.run.max_steps
    saved = checkpoint.state.get("schedule_steps")
    return int(saved) if saved is not None else int(checkpoint.state["config"]["run"]["max_steps"])


class Trainer:
    """One training run. `run()` trains from the start or from the latest checkpoint."""

    def __init__(
        self,
        config: TrainConfig,
        out_dir: str | os.PathLike[str],
        *,
        resume: bool = False,
        progress: bool = True,
        log: Callable[[str], None] = say_on_stderr,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.resume = resume
        self.progress = progress
        self.log = log
        self.checkpoint = self._check_out_dir()
        device_kind = resolve_device(config.run.device).type
        self.dist = init_distributed(device_kind)
        self.device = resolve_device(config.run.device, local_rank=self.dist.local_rank)
        check_training_budget(config, self.device, world=self.dist.world)
        if config.run.threads > 0:
            torch.set_num_threads(config.run.threads)
        check_batch_layout(config, self.dist.world)
        self.store = Path(config.data.dataset).expanduser() if is_shard_store(config.data.dataset) else None
        if self.store is None:
            check_cache_dir(default_cache_dir(config))
            # streamed: memory holds a piece of the corpus, not all of it; one reading pass checks
            # the text and gives its fingerprint before any tokenising
            with self._preparing(f"reading the corpus {config.data.dataset!r}"):
                self.corpus = stream_corpus(config.data.dataset, data_dir=config.run.data_dir)
                self.corpus.scan()
        else:
            self.corpus = stored_corpus(self.store)
            refuse_bpe_for_a_store(config, self.store, self.corpus)
        with self._preparing(tokenizer_task(config, self.out_dir, resume)):
            self.tokenizer = prepare_tokenizer(config, self.corpus, self.out_dir, resume)
        if self.store is not None:
            check_store_tokenizer(self.store, self.corpus, self.tokenizer, config.tokenizer.tokenizer)
        self.config = resolve_vocab(config, len(self.tokenizer))
        check_training_budget(self.config, self.device, world=self.dist.world)  # the real vocabulary
        self._check_resume_compatible()
        self.schedule_steps = schedule_steps(self.config, self.checkpoint)
        self.splits = self._token_splits()
        check_enough_tokens(
            self.splits.train, self.config.model.block_size, "training", sequences=self.config.run.batch_size
        )
        check_enough_tokens(self.splits.val, self.config.model.block_size, "validation")
        with self._preparing(model_task(self.config, self.checkpoint)):
            self._build_model()

    def _token_splits(self) -> TokenSplits:
        """The training and validation ids: the shard store's, or the single-file cache's
        (the corpus is tokenised into it on first use)."""
        val_fraction = self.config.data.val_fraction
        if self.store is not None:
            with self._preparing(
                f"opening the shard store {str(self.store)!r} (checking each shard's sha256)"
            ):
                return store_splits(
                    self.store,
                    val_fraction,
                    cache_dir=default_cache_dir(self.config),
                    rank=self.dist.rank,
                    world=self.dist.world,
                )
        cache = default_cache_dir(self.config)
        with self._preparing(f"the token cache in {str(cache)!r} (the corpus is tokenised on first use)"):
            return build_token_cache(self.corpus, self.tokenizer, cache, val_fraction=val_fraction)

    @contextlib.contextmanager
    def _preparing(self, what: str) -> Iterator[None]:
        """Say "preparing: <what>" on `log` if this step of the set-up lasts longer than
        `STATUS_DELAY_S` (only with `progress`, only on rank 0): a slow step is named while it
        runs, and bad input refused at once still gets its one line and nothing else."""
        if not (self.progress and self.dist.is_main):
            yield
            return
        line = f"preparing: {what}"
        if STATUS_DELAY_S <= 0:
            self.log(line)
            yield
            return
        timer = threading.Timer(STATUS_DELAY_S, self.log, args=(line,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    # ----------------------------------------------------------------- set-up
    def _check_out_dir(self) -> ckpt.Checkpoint | None:
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise UsageError(f"`out_dir` {str(self.out_dir)!r} is a file; give a directory")
        ckpt.check_run_folders(self.out_dir)
        has_run = (
            ckpt.latest_checkpoint_step(self.out_dir) is not None or (self.out_dir / ckpt.MODEL_FILE).exists()
        )
        refuse_another_commands_run(self.out_dir, "train", "out_dir")
        if self.resume:
            return ckpt.load_checkpoint(self.out_dir)
        if has_run:
            raise UsageError(
                f"`out_dir` {str(self.out_dir)!r} already holds a run; pass `resume=True` to continue "
                f"it or choose another `out_dir`"
            )
        return None

    def _check_resume_compatible(self) -> None:
        if self.checkpoint is None:
            return
        state = self.checkpoint.state
        diffs = []
        if state.get("tokenizer_fingerprint") not in (None, tokenizer_fingerprint(self.tokenizer)):
            diffs.append("tokenizer fingerprint differs")
        if state.get("corpus_fingerprint") not in (None, self.corpus.fingerprint):
            diffs.append("corpus text differs (fingerprint)")
        refuse_identity_changes(state["config"], self.config, diffs)

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
            self.forward_model = torch.compile(self.model)
        if self.dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.forward_model = DDP(self.forward_model, device_ids=ids)
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

    def _autocast(self) -> contextlib.AbstractContextManager:
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
            sync = micro == r.grad_accum - 1 or self.dist.world == 1
            context = contextlib.nullcontext() if sync else self.forward_model.no_sync()
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
        return RunError(f"{reason}; stopped, {self._good_checkpoint_text()}")

    def _good_checkpoint_text(self) -> str:
        good = ckpt.newest_good_checkpoint(self.out_dir)
        if good is not None:
            where = str(good.path)
            return f"last good checkpoint: step {good.step} in {where!r} (`resume=True` continues from it)"
        if ckpt.latest_checkpoint_step(self.out_dir) is None:
            return "no checkpoint had been saved yet"
        return "no good checkpoint (none was followed by a finite step): start again with a lower `lr`"

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
            failure = self._out_of_space(exc)
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
        if self.start_step >= r.max_steps:  # resuming a finished run: nothing to train
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
            if done % r.checkpoint_interval == 0 or done == r.max_steps:
                self._save_checkpoint(done, val_loss)
            bar.update(1)
        bar.close()
        if main:
            self._save_final(val_loss)
        return TrainResult(self.out_dir, r.max_steps, val_loss, tuple(losses), self._mean_tokens_per_s())

    def _validation_loss(self, step: int) -> float:
        """`evaluate()`, stopping the run when the weights after step `step` give a non-finite loss."""
        val_loss = self.evaluate()
        if not math.isfinite(val_loss):
            raise RunError(
                f"non-finite validation loss ({val_loss}) at step {step}; stopped, "
                f"{self._good_checkpoint_text()}"
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
        self, step: int, loss: float, grad_norm: float, per_layer: list[float], tps: float
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

    def _mean_tokens_per_s(self) -> float:
        path = self.out_dir / METRICS_FILE
        if not path.exists():
            return math.nan
        rates = [rec["tokens_per_s"] for rec in read_records(path) if "tokens_per_s" in rec]
        return float(np.median(rates)) if rates else math.nan

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
        """Save checkpoint `step` (rank 0); non-finite weights or optimizer state stop the run."""
        if not self.dist.is_main:
            return
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
            raise RunError(
                f"non-finite {exc.part} ({exc.found}) at step {step}; stopped, checkpoint {step} not "
                f"written, {self._good_checkpoint_text()}"
            ) from None
        except OSError as exc:
            failure = self._out_of_space(exc, f"checkpoint {step}")
            if failure is None:
                raise
            raise failure from None
        self.unverified = step

    def _out_of_space(self, exc: OSError, written: str | None = None) -> RunError | None:
        """The one line for a disk that filled up while writing `written` (default: the file the
        error names): what a checkpoint needs, what is free, and the checkpoint a resume
        continues from; None for another error."""
        reason = DISK_FULL.get(exc.errno or -1)
        if reason is None:
            return None
        if written is None:
            name = final_name(Path(os.fsdecode(exc.filename)).name) if exc.filename else None
            written = repr(name) if name else "the run's files"
        return RunError(
            f"{reason} on {mount_point(self.out_dir)} while writing {written} in `out_dir` "
            f"{str(self.out_dir)!r}: a checkpoint needs ~{format_bytes(self._checkpoint_bytes())}, "
            f"{format_bytes(free_bytes(self.out_dir))} free; stopped, {self._resume_point_text()}"
        )

    def _resume_point_text(self) -> str:
        """Which checkpoint `resume=True` continues from, after a stop that is not a divergence."""
        try:
            path, state = ckpt.resume_state(self.out_dir)
        except UsageError:
            return f"no checkpoint to resume from; {self._good_checkpoint_text()}"
        which = "last good checkpoint" if (path / ckpt.VERIFIED).is_file() else "last complete checkpoint"
        return f"{which}: step {state['step']} in {str(path)!r} (`resume=True` continues from it)"

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


def train(
    config: TrainConfig,
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = say_on_stderr,
) -> TrainResult:
    """Train a resstream GPT as `config` says, writing the run into `out_dir`.

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
            done = completed_run(config, out_dir) if resume else None
            if done is not None:
                return done
            return Trainer(config, out_dir, resume=resume, progress=progress, log=log).run()
        except OSError as exc:  # a full disk or lost permission while writing the run's files
            failure = write_failure(exc, Path(out_dir), "out_dir", kept="its complete checkpoints are kept")
            if failure is None:
                raise
            raise failure from None
