"""`resstream.shift(...)`: layer-wise alignment with the input and the next token over a corpus."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

import torch

from resstream.analysis.shift.alignment import AlignmentAccumulator, AlignmentPart, AlignmentResult
from resstream.api.decoders import DecoderLike, DecoderSpec, decoder_specs
from resstream.api.inputs import CorpusRequest, check_top_k, measure_batches, sampled_models, takes_load_args
from resstream.api.state_memory import check_batches_fit, host_if_meta
from resstream.capture import residual_states
from resstream.data.sampling import SequenceSample
from resstream.display import Displayable
from resstream.errors import UsageError
from resstream.models import LoadArgs, LoadedModel, ModelLike, ModelView
from resstream.reporting.notebook import NotebookView, notebook_view, tidy_frame
from resstream.reprs import summary

if TYPE_CHECKING:
    import pandas
    from transformers import PreTrainedTokenizerBase

#: Tokens per window when `seq_len` is not given (clipped to the shortest model context).
DEFAULT_SEQ_LEN = 128


@dataclass(frozen=True)
class ShiftReport(Displayable):
    """`shift` over one or several models on one sample of sequences: one `AlignmentResult`
    per model and decoder, models first.

    `to_pandas()` columns: those of `AlignmentResult.to_pandas()` (`SHIFT_COLUMNS`: model,
    decoder, layer, depth, metric, value, ci_low, ci_high), the results' frames one after
    the other; shift.csv is this frame. In a notebook the report shows every result's values
    per layer and the figures `resstream shift` writes.
    """

    results: tuple[AlignmentResult, ...]
    dataset: str
    dataset_fingerprint: str | None
    num_seqs: int
    seq_len: int | None  # None for pinned rows of varying length

    @property
    def sample_rule(self) -> str | None:
        """How the windows were chosen, when every model had the same sample; None when models
        with different tokenizers drew their own (each result's `sample` says how)."""
        rules = {result.sample for result in self.results}
        return rules.pop() if len(rules) == 1 else None

    def __repr__(self) -> str:
        several = len({r.decoder for r in self.results}) > 1
        models = [f"{r.model}{f' ({r.decoder})' if several else ''}: {r.shift_text}" for r in self.results]
        return summary(self, *models, f"{self.num_seqs} × {self.seq_len} tokens of {self.dataset!r}")

    def to_dict(self) -> dict[str, Any]:
        """The content of shift.json (`sample` is None when models drew their own samples)."""
        return {
            "dataset": self.dataset,
            "sample": self.sample_rule,
            "dataset_fingerprint": self.dataset_fingerprint,
            "num_seqs": self.num_seqs,
            "seq_len": self.seq_len,
            "decoders": list(dict.fromkeys(r.decoder for r in self.results)),
            "models": [r.to_dict() for r in self.results],
        }


@tidy_frame.register(ShiftReport)
def _report_frame(report: ShiftReport) -> pandas.DataFrame:
    from resstream.reporting.shift import shift_frame  # matplotlib: only when drawn

    return shift_frame(report.results)


@notebook_view.register(ShiftReport)
def _report_view(report: ShiftReport) -> NotebookView:
    from resstream.reporting.shift import shift_view

    return shift_view(report.results)


@takes_load_args
def shift(
    models: ModelLike | Sequence[ModelLike] = (None,),
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dataset: str = "shakespeare",
    num_seqs: int = 64,
    seq_len: int | None = None,
    top_k: int = 5,
    decoder: DecoderLike | Sequence[DecoderLike] = "logit-lens",
    batch_size: int = 8,
    seed: int = 0,
    data_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    **load: Unpack[LoadArgs],
) -> ShiftReport:
    """Layer-wise alignment with the input and the next token over a corpus sample.

    `models` is one model or a sequence of them: a spec (run directory, Hugging Face
    directory or hub name, "reference", None for the built-in model) loaded with `dtype`,
    `device`, `device_map` and `trust_remote_code`, or a model in memory (a Hugging Face
    causal LM, resstream's GPT, a `ModelView` or a `LoadedModel`) with its `tokenizer`.
    Each model gets `num_seqs` windows of `seq_len` tokens sampled from `dataset` with `seed`
    by the same rule (see `resstream.data.sampling`) from its own tokenizer's token stream, so
    models that share a tokenizer see identical windows; or a `.jsonl` of `input_ids` rows used
    as given. Each model's entry records its own sample. `seq_len` None means 128 tokens, or
    the shortest context among the models when that is shorter (a `ResstreamNotice` says so);
    a `seq_len` given must fit every model. Models are loaded one at a time and
    freed before the next; `progress` shows a bar per model.

    `decoder` is one decoder or several: "logit-lens", "embedding", "tuned:DIR" (a lens
    written by `resstream tune-lens`, refused for a model it was not trained on) or a loaded
    `TunedLens`. Several decoders read the same residual states of one forward pass per
    batch; the report holds one result per model and decoder, models first.
    """
    decoders = decoder_specs(decoder)
    given = len(models) if isinstance(models, list | tuple) else 1
    if given > 1 and any(spec.lens is not None for spec in decoders):
        raise UsageError(
            f"a tuned lens belongs to one model, and `models` has {given}: "
            "run shift once per model with that model's lens"
        )
    corpus = CorpusRequest(dataset, num_seqs, seq_len, seed, data_dir, default_seq_len=DEFAULT_SEQ_LEN)
    results, lengths, count, fingerprint = [], set(), 0, None

    def check(view: ModelView) -> None:
        check_top_k(top_k, view.W_U.shape[0])
        for spec in decoders:
            spec.check(view)

    with sampled_models(
        models, corpus, load, tokenizer=tokenizer, progress=progress, batch_size=batch_size, check=check
    ) as each:
        for loaded, sample, fingerprint in each:  # noqa: B007 - the last one is reported
            count, lengths = len(sample.sequences), {len(s) for s in sample.sequences}
            results.extend(_align(loaded, sample, top_k, decoders, batch_size, progress))
            del loaded  # free this model before the next is loaded
    length = lengths.pop() if len(lengths) == 1 else None
    return ShiftReport(tuple(results), dataset, fingerprint, count, length)


def _align(
    loaded: LoadedModel,
    sample: SequenceSample,
    top_k: int,
    decoders: Sequence[DecoderSpec],
    batch_size: int,
    progress: bool,
) -> list[AlignmentResult]:
    """One AlignmentResult per decoder of one model over its sampled sequences (the states
    of each batch computed once and read by every decoder; under torchrun the batches are
    shared out among the ranks, `measure_batches`)."""
    view = loaded.view
    length = max(len(seq) for seq in sample.sequences)
    rows = min(batch_size, len(sample.sequences))
    # h_0..h_L of a batch in one buffer (`residual_states`) and, read by the deferred rank
    # block, each layer's decoder inputs: two residual-width values a token and layer
    devices = [host_if_meta(view.W_E.device)] * (view.n_layers + 1)
    check_batches_fit(view, rows, length, 2 * view.d_model, devices)
    accumulators = [
        AlignmentAccumulator(
            num_layers=view.n_layers,
            top_k=top_k,
            decoder=spec.build(view),
            W_E=view.W_E.detach(),
            W_U=view.W_U.detach(),
        )
        for spec in decoders
    ]

    def measure(batch: torch.Tensor) -> list[AlignmentPart]:
        with torch.inference_mode():
            batch = batch.to(view.W_E.device)
            states = residual_states(view, batch)
            return [accumulator.measure(states, batch) for accumulator in accumulators]

    def add(parts: list[AlignmentPart]) -> None:
        for accumulator, part in zip(accumulators, parts, strict=True):
            accumulator.add(part)

    desc = f"shift {loaded.name}"
    measure_batches(
        sample.sequences, batch_size, desc, progress, measure=measure, add=add, device=view.W_E.device
    )
    return [accumulator.result(loaded.name, sample=sample.rule) for accumulator in accumulators]
