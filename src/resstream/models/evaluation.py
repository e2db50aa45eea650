"""Benchmark evaluation of any model `load_model` accepts: `evaluate_model(spec, benchmarks)`.

A resstream run (or the built-in reference model) is evaluated exactly as
`resstream.training.evaluate.evaluate_run` does; a Hugging Face causal LM (a local directory
or a hub name) becomes an `EvalModel` here: its logits without the key/value cache, its own
tokenizer (its eos token ends each document; see `EvalReport.to_dict`'s ``documents``), its
config's context (``n_positions`` / ``max_position_embeddings``) as the window length unless
`block_size` asks for less, and a fingerprint of what was scored (`model_fingerprint`).
Scoring itself (windows, LAMBADA, the estimate) is the one implementation of
`resstream.training.evaluate`; this module only loads. It sits in the model-loading layer
because it needs both `load_model` and the evaluator.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Unpack

import torch

from resstream.errors import UsageError
from resstream.io import file_fingerprint
from resstream.models.adapters.base import DynamicModule
from resstream.models.adapters.registry import context_of
from resstream.models.loading import HF_CONFIG, TOKENIZER_FILES, LoadedModel, ModelSpec, load_model
from resstream.training.evaluate import (
    BENCHMARKS,
    EvalModel,
    EvalOptions,
    EvalPlan,
    EvalReport,
    EvalSettings,
    prepare_model,
    resolve_block_size,
    run_eval_model,
    run_plan,
)

#: Files of a Hugging Face model directory that decide what an evaluation scores: its config,
#: its tokenizer and its weights (with their shard index), by name or by suffix.
FINGERPRINTED_NAMES = frozenset(
    {HF_CONFIG, *TOKENIZER_FILES, "special_tokens_map.json", "added_tokens.json", "merges.txt"}
)
FINGERPRINTED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
#: A file of the Hugging Face cache: `blobs/<its content hash>` (git sha1, or sha256 for LFS).
_CACHE_BLOB = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class CausalLogits(torch.nn.Module):
    """A Hugging Face causal LM as token ids -> logits, without building its key/value cache
    (which scoring never reads: for GPT-2 at batch 16 × 1024 it would be about 0.6 GB)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (batch, seq, vocab) of ids (batch, seq)."""
        return self.model(input_ids=idx, use_cache=False).logits


def directory_fingerprint(path: str | os.PathLike[str]) -> str:
    """sha256 (16 hex) over the name and content hash of every file of a Hugging Face model
    directory that decides its scores (`FINGERPRINTED_NAMES`, `FINGERPRINTED_SUFFIXES`).

    The weights are hashed in full: sizes, times and safetensors headers (names, shapes,
    offsets) are the same for two fine-tunes of one model, so nothing less tells them apart.
    A file that links into the Hugging Face cache (a snapshot) is named by its content hash
    there, which is used as it is, so hub downloads cost nothing to fingerprint.
    """
    root = Path(path)
    files = sorted(
        p
        for p in root.iterdir()
        if p.is_file() and (p.name in FINGERPRINTED_NAMES or p.name.endswith(FINGERPRINTED_SUFFIXES))
    )
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}\0{_content_hash(file)}\n".encode())
    return digest.hexdigest()[:16]


def _content_hash(file: Path) -> str:
    """The content hash the Hugging Face cache named the file by, else sha256 of its bytes."""
    if file.is_symlink():
        target = file.resolve()
        if target.parent.name == "blobs" and _CACHE_BLOB.fullmatch(target.name):
            return target.name
    return file_fingerprint(file)


def hub_revision(name: str) -> str | None:
    """The commit of hub model `name` that the local cache resolves to (the one just loaded),
    or None when its cache cannot say."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id=name, filename=HF_CONFIG)
    except Exception:  # an odd name or cache layout: the revision is not known
        return None
    if not isinstance(found, str):
        return None
    snapshot = Path(found).parent
    return snapshot.name if snapshot.parent.name == "snapshots" else None


def model_fingerprint(loaded: LoadedModel) -> str | None:
    """What identifies a loaded Hugging Face model's weights: `directory_fingerprint` of a
    local directory, the resolved revision of a hub name (None when not known)."""
    if loaded.source == "local" and loaded.where is not None:
        return directory_fingerprint(loaded.where)
    if loaded.source == "hub" and loaded.where is not None:
        revision = hub_revision(loaded.where)
        return f"{loaded.where}@{revision}" if revision else None
    return None


def eval_model(loaded: LoadedModel, *, block_size: int | None = None) -> EvalModel:
    """A loaded model as an `EvalModel`; `block_size` (default: the model's context) is
    refused above the context. A resstream run keeps its training corpus (the held-out-tail
    rule of `resstream.training.evaluate`)."""
    if loaded.run is not None:
        return run_eval_model(loaded.run, name=loaded.name, source=loaded.source, block_size=block_size)
    hf_model: DynamicModule = loaded.model  # a Hugging Face model: its config has no static type
    config = hf_model.config
    context = context_of(config)
    if context is None:
        if block_size is None:
            raise UsageError(
                f"model {loaded.name!r} states no context length (n_positions or "
                f"max_position_embeddings in its {HF_CONFIG}); give `block_size`"
            )
        context = block_size
    return EvalModel(
        forward=CausalLogits(loaded.model),
        tokenizer=loaded.tokenizer,
        block_size=resolve_block_size(block_size, context),
        context=context,
        name=loaded.name,
        fingerprint=model_fingerprint(loaded),
        source=loaded.source,
        config=config.to_dict(),
    )


def prepare_eval(
    model: ModelSpec, settings: EvalSettings, *, dtype: str = "auto", progress: bool = False
) -> EvalPlan:
    """Load the model (`load_model`, in `dtype`) and every benchmark text of `settings`; nothing
    is scored yet (`run_plan` scores)."""

    def load(torch_device: torch.device) -> EvalModel:
        loaded = load_model(model, dtype=dtype, device=str(torch_device), progress=progress)
        return eval_model(loaded, block_size=settings.block_size)

    return prepare_model(load, settings, progress=progress)


def evaluate_model(
    model: ModelSpec = None,
    benchmarks: str | Iterable[str] = BENCHMARKS,
    *,
    dtype: str = "auto",
    progress: bool = False,
    **options: Unpack[EvalOptions],
) -> EvalReport:
    """Loss, perplexity, top-1 accuracy (and LAMBADA last-word accuracy) of any model on
    `benchmarks`.

    `model` is what the analysis commands accept: None or "reference" (the built-in model),
    a resstream run directory, a local Hugging Face directory or a hub name. Windows are
    `block_size` tokens (default: the model's context; a resstream run's block_size, a Hugging
    Face config's n_positions / max_position_embeddings), advancing by `stride` (default
    block_size // 2), `batch_size` windows a forward pass (default 16) on `device` (default
    cpu); `max_tokens` caps each benchmark; `dtype` as `load_model` (auto: float32 on the CPU).
    The rules are those of `resstream.training.evaluate` (the settings are one
    `EvalSettings`); bad input is a one-line UsageError before anything is scored.
    """
    plan = prepare_eval(model, EvalSettings.of(benchmarks, **options), dtype=dtype, progress=progress)
    return run_plan(plan, progress=progress)


__all__ = [
    "CausalLogits",
    "directory_fingerprint",
    "eval_model",
    "evaluate_model",
    "hub_revision",
    "prepare_eval",
]
