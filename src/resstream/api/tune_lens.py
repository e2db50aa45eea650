"""`resstream.tune_lens(...)` and `resstream.evaluate_lens(...)`: train a tuned lens for a model
and measure it against the logit lens on held-out text.

Budget: `steps` optimiser steps of `tokens` / `steps` tokens each. `steps` alone keeps the
recipe's tokens per step (`DEFAULT_TOKENS_PER_STEP`), so fewer steps make a shorter run;
`tokens` alone spreads them over the default 250 steps; both given divide, with a notice when
a step is then far (over 2×) from the recipe's size (`settle_budget`).

Data: the corpus is cut into windows of `seq_len` tokens by the sampling rule every analysis
uses (`resstream.data.sampling`); steps × k + `eval_seqs` windows are drawn with `seed` (k =
sequences per step, enough for `tokens` training tokens in all) and split by a seeded
permutation: the first `eval_seqs` are held out, the rest feed the steps in order, each window
once. `evaluate_lens` on the lens's own training corpus rebuilds that split from the lens's
training record and evaluates on the same held-out windows.

Training (`resstream.api.lens_trainer`): one forward pass per micro-batch of `batch_size`
sequences captures h_0..h_L without gradients; `LensObjective.backward` adds every layer's KL
gradient; one optimiser step per step (`LensOptimiser`: SGD, Nesterov momentum, linear decay).
With `checkpoint_dir` the run saves a checkpoint there every `checkpoint_every` steps, after the
last and when Ctrl-C asks it to stop; `resume=True` continues from it, bit for bit as if never
interrupted (`analysis.decoding.lens_checkpoint`). The checkpoint stays after the run: the
command line removes it once the lens is written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import torch
from tqdm.auto import tqdm

from resstream.analysis.decoding.lens_checkpoint import (
    CHECKPOINT_FILE,
    LensCheckpoint,
    check_same_settings,
    load_checkpoint,
    remove_checkpoint,
)
from resstream.analysis.decoding.lens_training import LayerSums, LensEvaluation, LensObjective, LensOptimiser
from resstream.analysis.decoding.tuned_lens import TunedLens, load_lens, model_signature
from resstream.api.inputs import (
    CorpusRequest,
    LoadOptions,
    check_batch_size,
    checked_models,
    each_model,
    settled_seq_len,
    takes_load_args,
)
from resstream.api.lens_data import Ranks, ranks, store_sampler
from resstream.api.lens_recipe import (
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_EVAL_SEQS,
    DEFAULT_SEQ_LEN,
    DEFAULT_STEPS,
    DEFAULT_TOKENS,
    DEFAULT_TOKENS_PER_STEP,
)
from resstream.api.lens_trainer import (
    CheckpointPlan,
    LensTrainer,
    batches,
    flat_states,
    train_lens,
    training_record,
)
from resstream.api.state_memory import check_batches_fit, host_if_meta
from resstream.checks import check_learning_rate, check_positive
from resstream.data.files import load_token_rows
from resstream.data.sampling import CorpusTooSmall, SequenceSample
from resstream.data.store_windows import TokenWindows
from resstream.display import Displayable
from resstream.distributed import joined, on_main_first, one_outcome, run_sharded
from resstream.errors import UsageError
from resstream.models import LoadArgs, LoadedModel, ModelLike, ModelView
from resstream.notices import notify
from resstream.reporting.notebook import NotebookView, notebook_view, tidy_frame
from resstream.reprs import summary
from resstream.rundir import locked_directory

if TYPE_CHECKING:
    import pandas
    from transformers import PreTrainedTokenizerBase

#: Tokens per step further than this factor from the recipe's are worth a notice.
FAR_FROM_RECIPE = 2.0


@dataclass(frozen=True)
class TuneLensReport(Displayable):
    """A trained lens, its held-out evaluation and its training curve (mean KL over layers
    0..L−1 per step, in bits).

    `to_pandas()` columns: those of the evaluation's (`EVALUATION_COLUMNS`: model, layer,
    lens, metric, value), the same frame (the training curve is `history`). In a notebook the
    report shows the evaluation's values per layer, bits_per_layer.png and training.png.
    """

    lens: TunedLens
    evaluation: LensEvaluation
    history: tuple[float, ...]

    @property
    def dataset_fingerprint(self) -> str | None:
        """The fingerprint of the corpus the lens was trained and evaluated on."""
        return self.evaluation.dataset_fingerprint

    def __repr__(self) -> str:
        return summary(self, f"{self.lens.model}: {len(self.history)} steps", self.evaluation.headline())

    def to_dict(self) -> dict[str, Any]:
        """What `resstream tune-lens` writes as evaluation.json (the evaluation), with the lens's
        metadata (lens.json's fields) under "lens" and the training curve under "history"."""
        return {**self.evaluation.to_dict(), "lens": self.lens.metadata(), "history": list(self.history)}


@tidy_frame.register(TuneLensReport)
def _report_frame(report: TuneLensReport) -> pandas.DataFrame:
    from resstream.reporting.tuned_lens import evaluation_frame  # matplotlib: only when drawn

    return evaluation_frame(report.evaluation)


@notebook_view.register(TuneLensReport)
def _report_view(report: TuneLensReport) -> NotebookView:
    from resstream.reporting.tuned_lens import evaluation_view

    return evaluation_view(report.evaluation, report.history)


@takes_load_args
def tune_lens(
    model: ModelLike = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dataset: str = "shakespeare",
    tokens: int | None = None,
    steps: int | None = None,
    seq_len: int | None = None,
    batch_size: int = 8,
    eval_seqs: int = DEFAULT_EVAL_SEQS,
    optimiser: LensOptimiser | None = None,
    seed: int = 0,
    data_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    resume: bool = False,
    **load: Unpack[LoadArgs],
) -> TuneLensReport:
    """Train one affine translator per layer of `model` (a spec or a model in memory with its
    `tokenizer`, as for `resstream.shift`) on `tokens` tokens of `dataset` in `steps` optimiser
    steps, then evaluate it against the logit lens on `eval_seqs` held-out windows (module
    docstring). `steps` alone (default 250) keeps the recipe's 2,048 tokens a step; `tokens`
    alone is spread over 250 steps. `optimiser` defaults to the tuned-lens paper's recipe.

    `checkpoint_dir`: a folder to keep the run's checkpoint in (locked while the run writes),
    saved every `checkpoint_every` steps, after the last step, and when the first Ctrl-C (or
    SIGTERM) stops the run after its current step (`KeyboardInterrupt`); `resume=True`
    continues the run from it, with the same settings (refused, naming the first that
    differs), and gives the lens an uninterrupted run would have given, bit for bit. A run
    without `resume` refuses a folder holding an unfinished run's checkpoint. Without
    `checkpoint_dir` nothing is written. Returns the lens (save it with
    `report.lens.save(dir)`), its evaluation and the curve.
    """
    budget = settle_budget(tokens, steps)
    check_positive("eval_seqs", eval_seqs)
    check_positive("checkpoint_every", checkpoint_every)
    check_batch_size(batch_size)
    optimiser = replace(optimiser or LensOptimiser(), steps=budget.steps)
    check_learning_rate("lr", optimiser.lr)
    options = LoadOptions.of(load, tokenizer=tokenizer, progress=progress)
    requested = _requested_settings(dataset, seed, seq_len, budget, eval_seqs, batch_size, optimiser)
    info = ranks(options.device)
    with (
        one_outcome(info.place),
        _checkpoints(checkpoint_dir, checkpoint_every, resume, requested, info) as checkpoints,
    ):
        held_out = CorpusRequest(dataset, eval_seqs, seq_len, seed, data_dir, DEFAULT_SEQ_LEN)
        each = _each_split(model, held_out, options, budget)
        with closing(each):
            for loaded, split in each:
                view = loaded.view
                devices = [host_if_meta(view.W_E.device)] * (view.n_layers + 1)  # `residual_states`
                check_batches_fit(view, batch_size, split.seq_len, view.d_model, devices)
                plan = checkpoints.plan(_run_settings(requested, loaded, split))
                lens, history = train_lens(
                    loaded, split, optimiser, batch_size, progress, plan, checkpoints.previous, info
                )
                resumed = plan.resumed if plan is not None else ()
                lens.record = training_record(split, optimiser, batch_size, history, budget.tokens, resumed)
                evaluation = _evaluate(loaded.view, lens, split, len(split.held_out), batch_size, progress)
                return TuneLensReport(lens, evaluation, tuple(history))
    raise AssertionError("no model was loaded")  # pragma: no cover - each_model yields one


# --------------------------------------------------------------------------- budget and checkpoints


@dataclass(frozen=True)
class LensBudget:
    """The training tokens in all and the optimiser steps they are spread over."""

    tokens: int
    steps: int
    note: str | None = None  # for a step size far from the recipe's, said once the data is drawn


def settle_budget(tokens: int | None, steps: int | None) -> LensBudget:
    """`tokens` and `steps` as the user gave them (None: not given) settled (module docstring)."""
    for name, value in (("tokens", tokens), ("steps", steps)):
        if value is not None:
            check_positive(name, value)
    if steps is None:
        return LensBudget(DEFAULT_TOKENS if tokens is None else tokens, DEFAULT_STEPS)
    if tokens is None:
        return LensBudget(steps * DEFAULT_TOKENS_PER_STEP, steps)
    return LensBudget(tokens, steps, _far_from_recipe(tokens, steps))


def _far_from_recipe(tokens: int, steps: int) -> str | None:
    """A notice when `tokens` / `steps` is over `FAR_FROM_RECIPE` times from the recipe's step."""
    per_step = tokens / steps
    ratio = per_step / DEFAULT_TOKENS_PER_STEP
    if 1 / FAR_FROM_RECIPE <= ratio <= FAR_FROM_RECIPE:
        return None
    size = f"{ratio:,.0f}× the recipe's" if ratio > 1 else f"1/{1 / ratio:,.0f} of the recipe's"
    return (
        f"`tokens` {tokens:,} over `steps` {steps:,}: {per_step:,.0f} tokens a step, {size} "
        f"{DEFAULT_TOKENS_PER_STEP:,} (`steps` alone keeps {DEFAULT_TOKENS_PER_STEP:,} tokens a step)"
    )


def _requested_settings(
    dataset: str,
    seed: int,
    seq_len: int | None,
    budget: LensBudget,
    eval_seqs: int,
    batch_size: int,
    optimiser: LensOptimiser,
) -> dict[str, Any]:
    """The settings a resume must repeat that are known before the model loads."""
    settings: dict[str, Any] = {
        "dataset": dataset,
        "seed": seed,
        "tokens": budget.tokens,
        "steps": budget.steps,
        "eval_seqs": eval_seqs,
        "batch_size": batch_size,
        "lr": optimiser.lr,
        "momentum": optimiser.momentum,
        "weight_decay": optimiser.weight_decay,
        "max_grad_norm": optimiser.max_grad_norm,
    }
    return settings if seq_len is None else {**settings, "seq_len": seq_len}


def _run_settings(requested: dict[str, Any], loaded: LoadedModel, split: Split) -> dict[str, Any]:
    """All the settings a resume must repeat: `requested` and the model's and the data's."""
    return {
        **requested,
        "model": model_signature(loaded.view)[0],
        "dtype": str(loaded.view.W_E.dtype).removeprefix("torch."),
        "seq_len": split.seq_len,
        "dataset_fingerprint": split.fingerprint,
    }


@dataclass(frozen=True)
class _Checkpoints:
    """Where a run keeps its checkpoint (None: nowhere) and the checkpoint it resumes from."""

    directory: Path | None
    every: int
    previous: LensCheckpoint | None

    def plan(self, settings: dict[str, Any]) -> CheckpointPlan | None:
        """How the run saves, once its settings are known (checked against `previous`)."""
        if self.directory is None:
            return None
        if self.previous is None:
            return CheckpointPlan(self.directory, self.every, settings)
        check_same_settings(self.previous, settings, repr(str(self.directory)))
        return CheckpointPlan(
            self.directory, self.every, settings, (*self.previous.resumed, self.previous.step)
        )


@contextmanager
def _checkpoints(
    directory: str | os.PathLike[str] | None,
    every: int,
    resume: bool,
    requested: dict[str, Any],
    info: Ranks | None = None,
) -> Iterator[_Checkpoints]:
    """Hold the checkpoint folder (`rundir.locked_directory`) and find the checkpoint to resume
    from, checking what can be checked before the model loads. Under torchrun rank 0 holds the
    folder and decides (it may remove a finished run's checkpoint); the other ranks then read
    the checkpoint it resumes from, if any."""
    info = info or Ranks()
    if directory is None:
        if resume:
            raise UsageError("`resume=True` needs `checkpoint_dir`: the folder the interrupted run saved in")
        yield _Checkpoints(None, every, None)
        return
    if not info.is_main:
        held = Path(directory)
        resumes = on_main_first(lambda: False, info.place)  # rank 0's answer
        yield _Checkpoints(held, every, load_checkpoint(held) if resumes else None)
        return
    with locked_directory(directory, "tune-lens", param=None) as held:
        previous = _previous_checkpoint(held, resume, requested)
        on_main_first(lambda: previous is not None, info.place)
        yield _Checkpoints(held, every, previous)


def _previous_checkpoint(directory: Path, resume: bool, requested: dict[str, Any]) -> LensCheckpoint | None:
    """The checkpoint a resume continues from (None for a fresh run, which replaces a finished
    run's checkpoint and refuses an unfinished one's)."""
    where = repr(str(directory))
    previous = load_checkpoint(directory)
    if resume:
        if previous is None:
            raise UsageError(
                f"nothing to resume in {where}: it holds no tune-lens checkpoint ({CHECKPOINT_FILE}); "
                "start the run without `resume=True`"
            )
        check_same_settings(previous, requested, where)
        return previous
    if previous is not None and not previous.finished:
        raise UsageError(
            f"{where} holds the checkpoint of an unfinished tune-lens run (step {previous.step} of "
            f"{previous.steps}); continue it with `resume=True` and its settings, or remove "
            f"{CHECKPOINT_FILE} from it to start again"
        )
    if previous is not None:
        remove_checkpoint(directory)
    return None


@takes_load_args
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
    progress: bool = False,
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
        with (
            one_outcome(ranks(options.device).place),  # under torchrun: a failure is every rank's
            closing(
                _each_sample(
                    model,
                    CorpusRequest(dataset, sum(sizes), length, seed, data_dir, DEFAULT_SEQ_LEN),
                    sizes[1],
                    options,
                    check=lens.check_model,
                )
            ) as each,
        ):
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


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Split:
    """Training windows (in the order steps use them) and held-out windows of one sample."""

    train: Sequence[torch.Tensor]  # windows read from the corpus's token store when used
    held_out: Sequence[torch.Tensor]
    dataset: str
    seq_len: int
    seed: int
    rule: str
    fingerprint: str | None


def _each_split(
    model: ModelLike, held_out: CorpusRequest, options: LoadOptions, budget: LensBudget
) -> Generator[tuple[LoadedModel, Split], None, None]:
    """The model and its split for the budget's tokens in its steps besides the `held_out`
    windows (the window length settled first, so a model with a shorter context still gets
    the tokens); the budget's notices are said once the windows are drawn."""
    tokens, steps, eval_seqs = budget.tokens, budget.steps, held_out.num_seqs
    length = settled_seq_len(held_out, checked_models(model, options))
    per_step = max(1, math.ceil(tokens / (steps * length)))
    corpus = replace(held_out, num_seqs=steps * per_step + eval_seqs, seq_len=length)
    try:
        for loaded, split in _each_sample(model, corpus, eval_seqs, options):
            if budget.note is not None:
                notify(budget.note)
            if steps * per_step * length != tokens:
                notify(
                    f"`tokens` {tokens:,}: training on {steps * per_step * length:,} ({steps} steps × "
                    f"{per_step} windows of {length} tokens)"
                )
            yield loaded, split
    except CorpusTooSmall as exc:
        needed, dataset = corpus.num_seqs, corpus.dataset
        raise UsageError(
            f"{dataset!r} is too small for `tokens` {tokens:,} in {steps} steps: that needs {needed:,} "
            f"sequences of {length} tokens ({steps} × {per_step} for training + {eval_seqs} held out), "
            f"and it holds {exc.available:,}; lower `tokens`, `steps` or `eval_seqs`, or use a larger corpus"
        ) from None


def _each_sample(
    model: ModelLike,
    corpus: CorpusRequest,
    eval_seqs: int,
    options: LoadOptions,
    check: Callable[[ModelView], None] | None = None,
) -> Generator[tuple[LoadedModel, Split], None, None]:
    """Load the model (passing `check`), draw the `corpus`'s windows and split them: the last
    `eval_seqs` of its count are held out."""
    dataset = corpus.dataset
    if corpus.pinned and Path(dataset).is_file() and load_token_rows(dataset) is not None:
        raise UsageError(
            f"{dataset!r} holds token rows (input_ids); tune-lens samples windows of a text corpus"
        )
    sampler = store_sampler(ranks(options.device), corpus.data_dir, options.progress)
    with closing(each_model(model, corpus, options, check=check, sampler=sampler)) as each:
        for loaded, sample, fingerprint in each:
            yield loaded, _split(sample, eval_seqs, dataset, corpus.seed, fingerprint)


def _split(sample: SequenceSample, eval_seqs: int, dataset: str, seed: int, fingerprint: str | None) -> Split:
    """Permute the windows with `seed`: the first `eval_seqs` are held out, the rest train."""
    order = torch.randperm(len(sample.sequences), generator=torch.Generator().manual_seed(seed)).tolist()
    windows = sample.sequences
    chosen = windows.take(order) if isinstance(windows, TokenWindows) else tuple(windows[i] for i in order)
    rule = f"{eval_seqs} held-out windows, split with seed {seed} from {sample.rule}"
    length = len(windows[0])
    return Split(chosen[eval_seqs:], chosen[:eval_seqs], dataset, length, seed, rule, fingerprint)


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
    sums: list[tuple[LayerSums, LayerSums]] = []

    def measure(batch: torch.Tensor) -> tuple[LayerSums, LayerSums]:
        states = flat_states(view, batch, slice(0, -1))
        targets = batch[:, 1:].reshape(-1)
        return objective.measure(None, states, targets), objective.measure(lens.translators, states, targets)

    def add(part: tuple[LayerSums, LayerSums]) -> None:
        sums[:] = [part if not sums else (sums[0][0] + part[0], sums[0][1] + part[1])]

    info = joined(view.W_U.device)  # under torchrun: the batches shared out, added in batch order
    shown = progress and info.is_main
    stacked = tqdm(batches(windows, batch_size), desc="evaluate lens", unit="batch", disable=not shown)
    run_sharded(stacked, measure, add, info)
    ((logit, tuned),) = sums
    evaluation = LensEvaluation.from_sums(lens.model, logit, tuned, sample)
    return replace(
        evaluation,
        dataset=split.dataset,
        dataset_fingerprint=split.fingerprint,
        num_sequences=len(windows),
        seq_len=split.seq_len,
        seed=split.seed,
    )


__all__ = [
    "DEFAULT_CHECKPOINT_EVERY",
    "DEFAULT_STEPS",
    "DEFAULT_TOKENS",
    "DEFAULT_TOKENS_PER_STEP",
    "LensBudget",
    "LensTrainer",
    "TuneLensReport",
    "evaluate_lens",
    "settle_budget",
    "tune_lens",
]
