"""Evaluating a finished resstream run directory: `prepare` and `evaluate_run`.

`prepare_run` and `run_plan` take the `EvalSettings` as one object (sweeps and comparisons
build it once); `prepare` and `evaluate_run` are the same for the Python API, with the settings
as keyword arguments. Any other model: `resstream.evaluate_model`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Unpack

import torch

from resstream.training.evaluate.benchmarks import BENCHMARKS
from resstream.training.evaluate.model import EvalModel, run_eval_model
from resstream.training.evaluate.plan import EvalPlan, prepare_model
from resstream.training.evaluate.report import EvalReport, run_plan
from resstream.training.evaluate.settings import EvalOptions, EvalSettings


def prepare_run(
    run_dir: str | os.PathLike[str], settings: EvalSettings, *, progress: bool = False
) -> EvalPlan:
    """Load a run's final model and every benchmark text of `settings`; nothing is scored yet."""
    from resstream.training.checkpoint import load_run

    def load(torch_device: torch.device) -> EvalModel:
        return run_eval_model(load_run(run_dir, device=torch_device), block_size=settings.block_size)

    return prepare_model(load, settings, progress=progress)


def prepare(
    run_dir: str | os.PathLike[str],
    benchmarks: str | Iterable[str] = BENCHMARKS,
    *,
    progress: bool = False,
    **options: Unpack[EvalOptions],
) -> EvalPlan:
    """Validate every input, load a run's model and all benchmark texts; nothing is scored yet.
    `options` are the other `EvalSettings` (data_dir, block_size, stride, batch_size,
    max_tokens, device).

    Any other model: `resstream.models.evaluation.prepare_eval`."""
    return prepare_run(run_dir, EvalSettings.of(benchmarks, **options), progress=progress)


def evaluate_run(
    run_dir: str | os.PathLike[str],
    benchmarks: str | Iterable[str] = BENCHMARKS,
    *,
    progress: bool = True,
    **options: Unpack[EvalOptions],
) -> EvalReport:
    """Evaluate a run directory's final model on `benchmarks` (see the package docstring);
    `options` as `prepare`. Any other model: `resstream.evaluate_model`."""
    return run_plan(prepare(run_dir, benchmarks, progress=progress, **options), progress=progress)
