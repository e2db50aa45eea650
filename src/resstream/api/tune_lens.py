"""`resstream.tune_lens(...)` and `resstream.evaluate_lens(...)`: train a tuned lens for a model
and measure it against the logit lens on held-out text.

Data: the corpus is cut into windows of `seq_len` tokens by the sampling rule every analysis
uses (`resstream.data.sampling`); steps × k + `eval_seqs` windows are drawn with `seed` (k =
sequences per step, enough for `tokens` training tokens in all) and split by a seeded
permutation: the first `eval_seqs` are held out, the rest feed the steps in order, each window
once. `evaluate_lens` on the lens's own training corpus rebuilds that split from the lens's
training record and evaluates on the same held-out windows.

Training: one forward pass per micro-batch of `batch_size` sequences captures h_0..h_L without
gradients; `LensObjective.backward` adds every layer's KL gradient; one optimiser step per step
(`LensOptimiser`: SGD, Nesterov momentum, linear decay).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import torch
from tqdm.auto import tqdm

from resstream.analysis.decoding.lens_training import LayerSums, LensEvaluation, LensObjective, LensOptimiser
from resstream.analysis.decoding.tuned_lens import TunedLens, load_lens
from resstream.api.inputs import (
    CorpusRequest,
    LoadOptions,
    check_batch_size,
    checked_models,
    each_model,
    settled_seq_len,
    takes_load_args_on_one_device,
)
from resstream.capture import residual_states
from resstream.data.files import load_token_rows
from resstream.data.sampling import CorpusTooSmall, SequenceSample
from resstream.errors import RunError, UsageError
from resstream.models import LoadArgs, LoadedModel, ModelLike, ModelView
from resstream.notices import notify

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Defaults: the tuned-lens paper's 250 steps; tokens sized for a laptop (2 × 8 × 128 per step).
DEFAULT_STEPS = 250
DEFAULT_TOKENS = DEFAULT_STEPS * 2 * 8 * 128
DEFAULT_EVAL_SEQS = 32
DEFAULT_SEQ_LEN = 128


@dataclass(frozen=True)
class TuneLensReport:
    """A trained lens, its held-out evaluation and its training curve (mean KL over layers
    0..L−1 per step, in bits)."""

    lens: TunedLens
    evaluation: LensEvaluation
    history: tuple[float, ...]

    @property
    def dataset_fingerprint(self) -> str | None:
        """The fingerprint of the corpus the lens was trained and evaluated on."""
        return self.evaluation.dataset_fingerprint

    def __repr__(self) -> str:
        ev = self.evaluation
        logit = sum(ev.logit_kl[:-1]) / max(1, len(ev.layers) - 1)
        tuned = sum(ev.tuned_kl[:-1]) / max(1, len(ev.layers) - 1)
        return (
            f"TuneLensReport({self.lens.model}: {len(self.history)} steps; held-out KL to the final "
            f"distribution, mean over layers 0..{len(ev.layers) - 2}: logit lens {logit:.3f} bits, "
            f"tuned lens {tuned:.3f} bits, on {ev.num_tokens:,} positions)"
        )


@takes_load_args_on_one_device
def tune_lens(
    model: ModelLike = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dataset: str = "shakespeare",
    tokens: int = DEFAULT_TOKENS,
    steps: int = DEFAULT_STEPS,
    seq_len: int | None = None,
    batch_size: int = 8,
    eval_seqs: int = DEFAULT_EVAL_SEQS,
    optimiser: LensOptimiser | None = None,
    seed: int = 0,
    data_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    **load: Unpack[LoadArgs],
) -> TuneLensReport:
    """Train one affine translator per layer of `model` (a spec or a model in memory with its
    `tokenizer`, as for `resstream.shift`) on about `tokens` tokens of `dataset` in `steps`
    optimiser steps, then evaluate it against the logit lens on `eval_seqs` held-out windows
    (module docstring). `optimiser` defaults to the tuned-lens paper's recipe with `steps`.
    Returns the lens (save it with `report.lens.save(dir)`), its evaluation and the curve.
    """
    check_positive("steps", steps)
    check_positive("tokens", tokens)
    check_positive("eval_seqs", eval_seqs)
    check_batch_size(batch_size)
    optimiser = replace(optimiser or LensOptimiser(), steps=steps)
    check_learning_rate(optimiser.lr)
    options = LoadOptions.of(load, tokenizer=tokenizer, progress=progress)
    with closing(
        _each_split(model, dataset, seq_len, seed, data_dir, options, tokens, steps, eval_seqs)
    ) as each:
        for loaded, split in each:
            lens, history = _train(loaded, split, optimiser, batch_size, progress)
            lens.record = _record(split, optimiser, batch_size, history)
            evaluation = _evaluate(loaded.view, lens, split, len(split.held_out), batch_size, progress)
            return TuneLensReport(lens, evaluation, tuple(history))
    raise AssertionError("no model was loaded")  # pragma: no cover - each_model yields one


@takes_load_args_on_one_device
def evaluate_lens(
    lens: TunedLens | str | os.PathLike[str],
    model: ModelLike = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dataset: str | None = None,
    eval_seqs: int | None = None,
    seq_len: int | None = None,
    batch_size: int = 8,
    seed: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    **load: Unpack[LoadArgs],
) -> LensEvaluation:
    """Per-layer KL and cross-entropy of the logit lens and of `lens` (a directory or a loaded
    lens) on held-out text of `model`. `dataset`, `seq_len` and `seed` left None come from the
    lens's training record.

    On the lens's own training corpus only the windows its training held out are evaluated (the
    first `eval_seqs` of them, default all): the split is rebuilt from the record, and refused
    when `seq_len` or `seed` differ from the training run's (other windows could overlap the
    training text) or when the corpus has changed since (its fingerprint). Any other corpus
    gets `eval_seqs` fresh windows (default 32)."""
    lens = lens if isinstance(lens, TunedLens) else load_lens(lens)
    trained = lens.record
    dataset = dataset or trained.get("dataset") or "shakespeare"
    if eval_seqs is not None:
        check_positive("eval_seqs", eval_seqs)
    options = LoadOptions.of(load, tokenizer=tokenizer, progress=progress)
    plan: tuple[int | None, int, tuple[int, int], int]  # (seq_len, seed, sizes, keep): `_held_out_plan`
    if "train_seqs" in trained and dataset == trained.get("dataset"):
        plan = _held_out_plan(trained, seq_len, seed, eval_seqs)
    else:
        count = eval_seqs or DEFAULT_EVAL_SEQS
        plan = (
            seq_len or trained.get("seq_len"),
            trained.get("seed", 0) if seed is None else seed,
            (0, count),
            count,
        )
    length, seed, sizes, keep = plan
    try:
        with closing(
            _each_sample(model, dataset, length, seed, data_dir, options, sizes, check=lens.check_model)
        ) as each:
            for loaded, split in each:
                if sizes[0]:
                    _check_unchanged(dataset, split.fingerprint, trained.get("dataset_fingerprint"))
                return _evaluate(loaded.view, lens, split, keep, batch_size, progress)
    except CorpusTooSmall as exc:
        raise UsageError(
            f"`eval_seqs` {sizes[1]} is more than {dataset!r} holds: it has {exc.available:,} windows "
            f"of {length or DEFAULT_SEQ_LEN} tokens"
        ) from None
    raise AssertionError("no model was loaded")  # pragma: no cover


def _held_out_plan(
    trained: dict[str, Any], seq_len: int | None, seed: int | None, eval_seqs: int | None
) -> tuple[int, int, tuple[int, int], int]:
    """(seq_len, seed, (train, held-out) windows to draw, windows to keep) that rebuild the
    training run's split of its own corpus; UsageError for settings that would not."""
    wanted = {"seq_len": seq_len, "seed": seed}
    for name, value in wanted.items():
        if value is not None and value != trained.get(name):
            raise UsageError(
                f"the lens was trained on {trained['dataset']!r}: on it only the windows training held out "
                f"are evaluated, which needs the training run's `{name}` {trained.get(name)!r}, not "
                f"{value!r}; leave `{name}` out, or give another `dataset` for fresh text"
            )
    held_out = trained["eval_seqs"]
    if eval_seqs is not None and eval_seqs > held_out:
        raise UsageError(
            f"`eval_seqs` {eval_seqs} is more than the {held_out} windows the lens's training held out of "
            f"{trained['dataset']!r}; ask for at most {held_out}, or give another `dataset` for fresh text"
        )
    sizes = (trained["train_seqs"], held_out)
    return trained["seq_len"], trained["seed"], sizes, eval_seqs or held_out


def _check_unchanged(dataset: str, found: str | None, recorded: str | None) -> None:
    """UsageError when the training corpus no longer has the fingerprint the lens recorded."""
    if recorded is not None and found != recorded:
        raise UsageError(
            f"{dataset!r} has changed since the lens was trained (fingerprint {found}, the lens recorded "
            f"{recorded}): its held-out windows cannot be rebuilt; give another `dataset`, or train again"
        )


def check_positive(name: str, value: int) -> None:
    """UsageError unless `value` is an integer ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"`{name}` {value!r} is not allowed; allowed: an integer >= 1")


def check_learning_rate(value: float) -> None:
    """UsageError unless `value` is a finite number > 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UsageError(f"`lr` {value!r} is not allowed; allowed: a finite number > 0")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Split:
    """Training windows (in the order steps use them) and held-out windows of one sample."""

    train: tuple[torch.Tensor, ...]
    held_out: tuple[torch.Tensor, ...]
    dataset: str
    seq_len: int
    seed: int
    rule: str
    fingerprint: str | None


def _each_split(
    model: ModelLike,
    dataset: str,
    seq_len: int | None,
    seed: int,
    data_dir: Any,
    options: LoadOptions,
    tokens: int,
    steps: int,
    eval_seqs: int,
) -> Generator[tuple[LoadedModel, Split], None, None]:
    """The model and its split for `tokens` training tokens in `steps` steps (the window
    length settled first, so a model with a shorter context still gets `tokens` tokens)."""
    request = CorpusRequest(dataset, 1, seq_len, seed, data_dir, DEFAULT_SEQ_LEN)
    length = seq_len = settled_seq_len(request, checked_models(model, options))
    per_step = max(1, math.ceil(tokens / (steps * length)))
    try:
        for loaded, split in _each_sample(
            model, dataset, seq_len, seed, data_dir, options, (steps * per_step, eval_seqs)
        ):
            if steps * per_step * length != tokens:
                notify(
                    f"`tokens` {tokens:,}: training on {steps * per_step * length:,} ({steps} steps × "
                    f"{per_step} windows of {length} tokens)"
                )
            yield loaded, split
    except CorpusTooSmall as exc:
        needed = steps * per_step + eval_seqs
        raise UsageError(
            f"{dataset!r} is too small for `tokens` {tokens:,} in {steps} steps: that needs {needed:,} "
            f"sequences of {length} tokens ({steps} × {per_step} for training + {eval_seqs} held out), "
            f"and it holds {exc.available:,}; lower `tokens` or `eval_seqs`, or use a larger corpus"
        ) from None


def _each_sample(
    model: ModelLike,
    dataset: str,
    seq_len: int | None,
    seed: int,
    data_dir: Any,
    options: LoadOptions,
    sizes: tuple[int, int],
    check: Callable[[ModelView], None] | None = None,
) -> Generator[tuple[LoadedModel, Split], None, None]:
    """Load the model (passing `check`), draw train + held-out windows and split them."""
    train_seqs, eval_seqs = sizes
    corpus = CorpusRequest(dataset, train_seqs + eval_seqs, seq_len, seed, data_dir, DEFAULT_SEQ_LEN)
    if corpus.pinned and Path(dataset).is_file() and load_token_rows(dataset) is not None:
        raise UsageError(
            f"{dataset!r} holds token rows (input_ids); tune-lens samples windows of a text corpus"
        )
    with closing(each_model(model, corpus, options, check=check)) as each:
        for loaded, sample, fingerprint in each:
            yield loaded, _split(sample, train_seqs, eval_seqs, dataset, seed, fingerprint)


def _split(
    sample: SequenceSample, train_seqs: int, eval_seqs: int, dataset: str, seed: int, fingerprint: str | None
) -> Split:
    """Permute the windows with `seed`: the first `eval_seqs` are held out, the rest train."""
    order = torch.randperm(len(sample.sequences), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen = [sample.sequences[i] for i in order]
    rule = f"{eval_seqs} held-out windows, split with seed {seed} from {sample.rule}"
    length = len(sample.sequences[0])
    return Split(
        tuple(chosen[eval_seqs:]), tuple(chosen[:eval_seqs]), dataset, length, seed, rule, fingerprint
    )


# --------------------------------------------------------------------------- training


class LensTrainer:
    """One model's lens and its optimiser: `step(windows)` is one optimiser step on a list of
    token windows (micro-batches of `batch_size` sequences, one forward each)."""

    def __init__(
        self, view: ModelView, lens: TunedLens, optimiser: LensOptimiser, batch_size: int = 8
    ) -> None:
        self.view = view
        self.lens = lens
        self.objective = LensObjective(view)
        self.optimiser = optimiser
        self.optim, self.schedule = optimiser.build(lens.translators)
        self.batch_size = batch_size
        self.steps_done = 0

    def step(self, windows: Sequence[torch.Tensor]) -> torch.Tensor:
        """One optimiser step; the step's mean KL per layer (L,) in nats (before the step)."""
        self.optim.zero_grad(set_to_none=False)
        total = sum(len(w) for w in windows)
        sums = torch.zeros(self.view.n_layers, dtype=torch.float64)
        for batch in _batches(windows, self.batch_size):
            states = _flat_states(self.view, batch)
            sums += self.objective.backward(self.lens.translators, states, total).cpu()
        kl = sums / total
        _check_finite(kl, self.steps_done)
        self.optimiser.clip(self.lens.translators)
        self.optim.step()
        self.schedule.step()
        self.steps_done += 1
        return kl


def _train(
    loaded: LoadedModel, split: Split, optimiser: LensOptimiser, batch_size: int, progress: bool
) -> tuple[TunedLens, list[float]]:
    """The lens of `loaded` trained on the split's training windows, and the KL curve."""
    trainer = LensTrainer(loaded.view, TunedLens.zero(loaded.view, loaded.name), optimiser, batch_size)
    per_step = len(split.train) // optimiser.steps
    history: list[float] = []
    desc = f"tune-lens {loaded.name}"
    with tqdm(total=optimiser.steps, desc=desc, unit="step", disable=not progress) as bar:
        for step in range(optimiser.steps):
            kl = trainer.step(split.train[step * per_step : (step + 1) * per_step])
            history.append(float(kl.mean()) / math.log(2))
            bar.set_postfix(kl_bits=f"{history[-1]:.3f}")
            bar.update()
    return trainer.lens, history


def _check_finite(kl: torch.Tensor, step: int) -> None:
    if not bool(torch.isfinite(kl).all()):
        layer = int((~torch.isfinite(kl)).nonzero()[0])
        raise RunError(
            f"tune-lens diverged at step {step + 1}: the KL of layer {layer} is not finite; "
            "try a lower learning rate (`--lr`)"
        )


def _batches(windows: Sequence[torch.Tensor], batch_size: int) -> Iterator[torch.Tensor]:
    for start in range(0, len(windows), batch_size):
        yield torch.stack(list(windows[start : start + batch_size]))


def _flat_states(view: ModelView, batch: torch.Tensor, positions: slice = slice(None)) -> torch.Tensor:
    """h_0..h_L of a batch, (L+1, batch·positions, d): one forward without gradients."""
    with torch.inference_mode():
        states = residual_states(view, batch.to(view.W_E.device))[:, :, positions]
    return states.reshape(states.shape[0], -1, states.shape[-1])


def _record(split: Split, optimiser: LensOptimiser, batch_size: int, history: list[float]) -> dict[str, Any]:
    """The training record kept in lens.json (what `evaluate_lens` rebuilds the split from)."""
    return {
        "dataset": split.dataset,
        "dataset_fingerprint": split.fingerprint,
        "seq_len": split.seq_len,
        "seed": split.seed,
        "train_seqs": len(split.train),
        "eval_seqs": len(split.held_out),
        "sequences_per_step": len(split.train) // optimiser.steps,
        "train_tokens": sum(len(w) for w in split.train),
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
    }


# --------------------------------------------------------------------------- evaluation


def _evaluate(
    view: ModelView, lens: TunedLens, split: Split, keep: int, batch_size: int, progress: bool
) -> LensEvaluation:
    """Logit lens and tuned lens side by side on the first `keep` held-out windows of `split`
    (positions with a next token), labelled with the split's sample, corpus and fingerprint."""
    windows = split.held_out[:keep]
    sample = split.rule if keep == len(split.held_out) else f"the first {keep} of {split.rule}"
    objective = LensObjective(view)
    lens.translators.to(view.W_U.device)
    logit = tuned = None
    batches = list(_batches(windows, batch_size))
    for batch in tqdm(batches, desc="evaluate lens", unit="batch", disable=not progress):
        states = _flat_states(view, batch, slice(0, -1))
        targets = batch[:, 1:].reshape(-1)
        logit = _add(logit, objective.measure(None, states, targets))
        tuned = _add(tuned, objective.measure(lens.translators, states, targets))
    assert logit is not None and tuned is not None
    evaluation = LensEvaluation.from_sums(lens.model, logit, tuned, sample)
    return replace(
        evaluation,
        dataset=split.dataset,
        dataset_fingerprint=split.fingerprint,
        num_sequences=len(windows),
        seq_len=split.seq_len,
        seed=split.seed,
    )


def _add(total: LayerSums | None, part: LayerSums) -> LayerSums:
    return part if total is None else total + part


__all__ = ["DEFAULT_STEPS", "DEFAULT_TOKENS", "LensTrainer", "TuneLensReport", "evaluate_lens", "tune_lens"]
