"""`resstream.recency(...)`: measured attention by query and key position of trained models."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Unpack

from resstream.analysis.recency.measured import RecencyAccumulator, RecencyReport, RecencyResult
from resstream.api.inputs import CorpusRequest, measure_batches, sampled_models, takes_load_args
from resstream.capture import attention_probs
from resstream.data.sampling import SequenceSample
from resstream.errors import UsageError
from resstream.models import LoadArgs, LoadedModel, ModelLike

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Tokens per sequence when `seq_len` is not given (clipped to the shortest model context).
DEFAULT_SEQ_LEN = 64

__all__ = ["DEFAULT_SEQ_LEN", "RecencyReport", "RecencyResult", "recency"]


@takes_load_args
def recency(
    models: ModelLike | Sequence[ModelLike] = (None,),
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dataset: str = "shakespeare",
    num_seqs: int = 64,
    seq_len: int | None = None,
    batch_size: int = 8,
    seed: int = 0,
    threshold: float = 3.0,
    data_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    **load: Unpack[LoadArgs],
) -> RecencyReport:
    """Mean attention by query and key position, per layer and head, over a corpus sample.

    Models are given as for `resstream.shift`, and the sample is drawn the same way (all
    sequences must have one length: pinned rows of different lengths are refused); `seq_len`
    None means 64 tokens, clipped to the shortest model context as `resstream.shift` clips.
    Each sequence is one sample of the statistics, so the verdicts are the simulation's
    (`resstream.analysis.recency.measured`); `threshold` is the z-score a verdict needs.
    """
    if not threshold > 0:
        raise UsageError(f"`threshold` {threshold} must be > 0 (standard errors)")
    corpus = CorpusRequest(dataset, num_seqs, seq_len, seed, data_dir, default_seq_len=DEFAULT_SEQ_LEN)
    results, fingerprint, length = [], None, seq_len or DEFAULT_SEQ_LEN
    with sampled_models(
        models, corpus, load, tokenizer=tokenizer, progress=progress, batch_size=batch_size
    ) as each:
        for loaded, sample, fingerprint in each:  # noqa: B007 - the last one is reported
            length = _one_length(sample, dataset)
            results.append(_attention_by_position(loaded, sample, length, threshold, batch_size, progress))
            del loaded  # free this model before the next is loaded
    return RecencyReport(tuple(results), dataset, fingerprint, length)


def _attention_by_position(
    loaded: LoadedModel,
    sample: SequenceSample,
    length: int,
    threshold: float,
    batch_size: int,
    progress: bool,
) -> RecencyResult:
    """The RecencyResult of one model over its sampled sequences."""
    view = loaded.view
    accumulator = RecencyAccumulator(
        num_layers=view.n_layers, num_heads=view.n_heads, seq_len=length, threshold=threshold
    )
    measure_batches(
        sample.sequences,
        batch_size,
        f"recency {loaded.name}",
        progress,
        measure=lambda batch: accumulator.measure(attention_probs(view, batch)),
        add=accumulator.add,
        device=view.W_E.device,
    )
    return accumulator.result(loaded.name, sample=sample.rule, notes=view.notes)


def _one_length(sample: SequenceSample, dataset: str) -> int:
    """The one length of the sampled sequences (recency averages position by position)."""
    lengths = {len(s) for s in sample.sequences}
    if len(lengths) != 1:
        raise UsageError(
            f"{dataset!r}: pinned rows have {len(lengths)} different lengths; recency "
            f"averages position by position and needs one length"
        )
    return lengths.pop()
