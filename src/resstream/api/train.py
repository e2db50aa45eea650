"""`resstream.train(...)`: train one model into a run folder, as `resstream train` does.

The config is a preset with config fields set by name (every field of `resstream train
--help`: `max_steps=40`, `n_layer=4`, ...). The run is `resstream.training.loop.train`'s; then,
as the command does, loss_curve.png and (for a learned or router gate) gate.png are written
into the folder (`resstream.reporting.plots.write_run_figures`). `train_into` is that sequence,
shared with the command, which builds its config from flags and a YAML file instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from resstream.errors import UsageError, closest
from resstream.notices import say
from resstream.training.config import FIELDS, TrainConfig, build_config, flatten
from resstream.training.records import TrainResult

#: Config fields that only mean something for the fixed gate.
FIXED_GATE_FIELDS = ("alpha", "cut_layer")
#: Where a run's one-line notices go.
Log = Callable[[str], None]
#: Builds a run's config from the saved one of the run it resumes (None for a fresh run).
Configure = Callable[[dict[str, Any] | None], TrainConfig]


def check_field_names(fields: Mapping[str, Any], parameters: Iterable[str]) -> None:
    """Refuse a keyword that is neither one of the function's `parameters` nor a config field,
    suggesting the closest of either."""
    for name in fields:
        if name not in FIELDS:
            known = [*parameters, *FIELDS]
            raise UsageError(
                f"unknown parameter `{name}`{closest(name, known)}; allowed: the function's parameters "
                f"and the config fields (`resstream.training.config.FIELDS`), e.g. max_steps=40"
            )


def check_fixed_gate_options(gate: str, given: Iterable[str]) -> None:
    """`alpha` and `cut_layer` (those of them `given`) only mean something for the fixed gate:
    refuse them for another."""
    named = [f"`{name}`" for name in FIXED_GATE_FIELDS if name in given]
    if named and gate != "fixed":
        raise UsageError(f"{' and '.join(named)} only apply to `gate` fixed (the gate is {gate!r})")


def train_into(
    out_dir: str | os.PathLike[str],
    configure: Configure,
    *,
    resume: bool,
    progress: bool,
    log: Log | None = None,
    resume_hint: str | None = None,
) -> TrainResult:
    """Train the run `configure` builds into `out_dir` (`resume`: from its latest checkpoint,
    `configure` then given the saved config) and write its figures, as `resstream train` does.

    The folder is locked from reading the checkpoint to the last figure; its entries are
    checked before training (a folder named like a figure would fail the run at its end).
    `log` and `resume_hint` are `resstream.training.loop.train`'s (default: its own).
    """
    from resstream.reporting.plots import RUN_FIGURES, write_run_figures
    from resstream.training import checkpoint as ckpt
    from resstream.training import loop
    from resstream.training.distributed import launched_rank, run_lock

    out = Path(out_dir)
    with run_lock(out, param="out_dir"):
        ckpt.check_run_folders(out, RUN_FIGURES)
        saved = ckpt.resume_state(out)[1]["config"] if resume else None
        config = configure(saved)
        result = loop.train(
            config,
            out,
            resume=resume,
            progress=progress,
            log=log or say,
            resume_hint=resume_hint or loop.RESUME_HINT,
        )
        if not result.already_complete and launched_rank() == 0:
            write_run_figures(out, config.model.gate)
    return result


def train(
    out_dir: str | os.PathLike[str],
    *,
    preset: str | None = "tiny",
    gate: str | None = None,
    resume: bool = False,
    progress: bool = False,
    **fields: Any,
) -> TrainResult:
    """Train a resstream GPT into the run folder `out_dir`, as `resstream train` does: the
    weights, tokenizer, run.json, metrics.jsonl, model.json, checkpoints/, loss_curve.png and,
    for a learned or router `gate`, gate.png.

    The config is `preset` (tiny, laptop, reference, gpt2-124m, paper; None: the base config)
    with `gate` (none, fixed, learned, router) and any other config field set by name:
    `resstream.train("runs/x", gate="fixed", alpha=0.5, cut_layer=1, max_steps=100)`.
    `alpha` and `cut_layer` are refused for a gate other than fixed. `resume=True` continues
    the run in `out_dir` from its latest checkpoint with its saved config, which `gate` and
    `fields` may change where a resume allows it (e.g. a larger `max_steps`); `preset` is then
    not used. `progress` shows a progress bar and what is prepared before the first step;
    one-line notices (a stop by Ctrl-C, a resume's learning-rate schedule) go to stderr.

    Ctrl-C finishes the current step, saves a checkpoint and raises `KeyboardInterrupt`
    (`resume=True` continues from it). Returns the run's `TrainResult`, which displays its
    loss curve and gate in a notebook.
    """
    check_field_names(fields, ("out_dir", "preset", "gate", "resume", "progress"))
    overrides = {**fields, **({"gate": gate} if gate is not None else {})}

    def configure(saved: dict[str, Any] | None) -> TrainConfig:
        if saved is not None:
            config = build_config(flatten(saved, "saved config"), overrides)
        else:
            config = build_config(overrides, preset=preset)
        check_fixed_gate_options(config.model.gate, overrides)
        return config

    return train_into(out_dir, configure, resume=resume, progress=progress)


__all__ = [
    "FIXED_GATE_FIELDS",
    "Configure",
    "Log",
    "check_field_names",
    "check_fixed_gate_options",
    "train",
    "train_into",
]
