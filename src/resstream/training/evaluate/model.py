"""The model an evaluation scores: `EvalModel`, and a finished resstream run as one.

Any other model (a Hugging Face causal LM) is made an `EvalModel` by
`resstream.models.evaluation`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from resstream.training.evaluate.settings import resolve_block_size

if TYPE_CHECKING:
    from resstream.training.checkpoint import TrainedModel


@dataclass(frozen=True)
class TrainingText:
    """The corpus a resstream run trained on (`dataset`, and its text's `fingerprint` when the
    run saved it) and the share of its tokens the trainer held out (`val_fraction`)."""

    dataset: str
    val_fraction: float
    fingerprint: str | None = None


@dataclass(frozen=True)
class EvalModel:
    """What an evaluation needs of a model.

    `forward` maps token ids (batch, seq) to logits (or a tuple / output object holding them,
    see `scoring.logits_of`), in eval mode; `tokenizer` is the model's own (its eos token ends
    each document); windows are `block_size` tokens, at most the model's `context`; `name`
    labels the results, `fingerprint` identifies the weights; `source` is where the model came
    from (`resstream.models.LoadedModel.source`); `config` its configuration as plain data
    (recorded in run.json); `training` the run's own corpus (None: not a resstream run).
    """

    forward: torch.nn.Module
    tokenizer: Any
    block_size: int
    context: int
    name: str
    fingerprint: str | None
    source: str
    config: dict[str, Any]
    training: TrainingText | None = None

    @property
    def end_of_text(self) -> str | None:
        """The token put after each document, or None when the tokenizer has no eos."""
        return getattr(self.tokenizer, "eos_token", None) if self.tokenizer.eos_token_id is not None else None


def run_eval_model(
    trained: TrainedModel,
    *,
    name: str | None = None,
    source: str = "resstream",
    block_size: int | None = None,
) -> EvalModel:
    """A finished resstream run as an `EvalModel` (its context is its config's block_size;
    its fingerprint is that of its weights file, `checkpoint.weights_fingerprint`)."""
    from resstream.training.checkpoint import weights_fingerprint

    data = trained.config.data
    context = trained.config.model.block_size
    return EvalModel(
        forward=trained.model,
        tokenizer=trained.tokenizer,
        block_size=resolve_block_size(block_size, context),
        context=context,
        name=name if name is not None else str(trained.path),
        fingerprint=weights_fingerprint(trained.path),
        source=source,
        config=trained.config.to_dict(),
        training=TrainingText(data.dataset, data.val_fraction, trained.meta.get("corpus_fingerprint")),
    )
