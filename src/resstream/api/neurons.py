"""`resstream.neurons(...)`: FFN neurons of one layer as key -> value memories over a corpus."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Unpack

import torch

from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.memories.neurons import (
    DEFAULT_WINDOW,
    RANK_RULE,
    VALUE_RULE,
    KeySide,
    KeySideAccumulator,
    NeuronsResult,
    added_values,
    mentioned_tokens,
    neuron_reports,
    promoted_tokens,
)
from resstream.api.inputs import (
    CorpusRequest,
    check_top_k,
    each_batch,
    measure_batches,
    one_sampled_model,
    takes_load_args,
)
from resstream.api.state_memory import block_devices, check_batches_fit, neuron_count
from resstream.api.tokenizers import tokenizer_of
from resstream.capture import run_forward
from resstream.capture.hooks import check_input_ids
from resstream.data.sampling import SequenceSample
from resstream.data.tokenizer import token_text
from resstream.errors import UsageError
from resstream.models import LoadArgs, ModelLike, ModelView
from resstream.models.adapters.base import BlockView

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Tokens per window when `seq_len` is not given (as `shift`; clipped to the model's context).
DEFAULT_SEQ_LEN = 128


@takes_load_args
def neurons(
    model: ModelLike = None,
    *,
    layer: int,
    neurons: Sequence[int] | None = None,
    top: int | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dataset: str = "shakespeare",
    num_seqs: int = 64,
    seq_len: int | None = None,
    contexts: int = 10,
    value_tokens: int = 10,
    window: int = DEFAULT_WINDOW,
    batch_size: int = 8,
    seed: int = 0,
    data_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    **load: Unpack[LoadArgs],
) -> NeuronsResult:
    """FFN neurons of block `layer` (0-based) as key -> value memories.

    Give the `neurons` (indices 0..d_ff−1) or `top` = N: the N neurons of the layer with the
    largest activation over the corpus. For each neuron: the `value_tokens` tokens its value
    vector W_out[k] promotes and suppresses most, read through the final norm's gain
    (`resstream.analysis.memories.neurons.value_logits`), and its `contexts` largest coefficients m_k
    over the corpus with the `window` tokens before each. The corpus is sampled as for
    `resstream.shift` (`num_seqs` windows of `seq_len` tokens of `dataset` with `seed`, or
    a `.jsonl` of input_ids rows used as given); `model` is a spec or a model in memory with
    its `tokenizer`, loaded with `dtype`, `device`, `device_map`, `trust_remote_code`.
    """
    chosen = _check_request(neurons, top, contexts, value_tokens, window)
    corpus = CorpusRequest(dataset, num_seqs, seq_len, seed, data_dir, default_seq_len=DEFAULT_SEQ_LEN)

    def check(view: ModelView) -> None:
        check_layer_and_neurons(view, layer, chosen, top)
        check_top_k(value_tokens, view.W_U.shape[0], "value_tokens")

    with one_sampled_model(
        model,
        corpus,
        load,
        tokenizer=tokenizer,
        progress=progress,
        batch_size=batch_size,
        check=check,
        reads_blocks=True,
    ) as (loaded, sample, fingerprint):
        view = loaded.view
        length = max(len(seq) for seq in sample.sequences)
        rows = min(batch_size, len(sample.sequences))
        check_batches_fit(view, rows, length, neuron_count(view), [block_devices(view)[layer]])
        accumulator = KeySideAccumulator(neurons=chosen, top=top, keep=contexts, window=window)
        measure_batches(
            sample.sequences,
            batch_size,
            f"neurons {loaded.name}",
            progress,
            measure=lambda batch: accumulator.measure(*batch_coefficients(view, layer, batch)),
            add=accumulator.add,
            device=view.W_E.device,
        )
        key = accumulator.result()
        selection = "the neurons given" if top is None else f"top {top}: {RANK_RULE}"
        return _result(
            loaded.name,
            view,
            layer,
            key,
            selection,
            value_tokens,
            sample,
            dataset,
            fingerprint,
            tokenizer_of(loaded),
        )


def _check_request(
    neurons: Sequence[int] | None, top: int | None, contexts: int, value_tokens: int, window: int
) -> list[int] | None:
    """The request's own rules, checked before any model loads; the neurons without repeats."""
    if (neurons is None or len(neurons) == 0) == (top is None):
        raise UsageError(
            "give exactly one of `neurons` (neuron indices) or `top` (the top N neurons of the layer)"
        )
    if top is not None and top < 1:
        raise UsageError(f"`top` {top} must be >= 1")
    for name, value, least in (
        ("contexts", contexts, 1),
        ("value_tokens", value_tokens, 1),
        ("window", window, 0),
    ):
        if value < least:
            raise UsageError(f"`{name}` {value} must be >= {least}")
    if top is not None or neurons is None:  # the check above: `top` None means neurons given
        return None
    return list(dict.fromkeys(int(k) for k in neurons))


def check_layer_and_neurons(
    view: ModelView, layer: int, neurons: Sequence[int] | None, top: int | None
) -> None:
    """UsageError for a `layer` outside the model's blocks, a neuron outside the layer's
    d_ff, or a `top` over d_ff, each naming the allowed range."""
    if not 0 <= layer < view.n_layers:
        raise UsageError(
            f"`layer` {layer} is out of range; allowed: 0..{view.n_layers - 1} ({view.n_layers} blocks)"
        )
    neuron_block(view, layer)
    d_ff = view.blocks[layer].d_ff
    for neuron in neurons or ():
        if not 0 <= neuron < d_ff:
            raise UsageError(
                f"`neurons` {neuron} is out of range for layer {layer}; "
                f"allowed: 0..{d_ff - 1} ({d_ff} neurons)"
            )
    if top is not None and top > d_ff:
        raise UsageError(f"`top` {top} is more than layer {layer}'s {d_ff} neurons; allowed: 1..{d_ff}")


def neuron_block(view: ModelView, layer: int) -> BlockView:
    """Block `layer`, whose neuron coefficients `BlockView.hook_coefficients` reads; UsageError
    for a block whose adapter exposes no MLP neurons (no weights, no projection or experts)."""
    block = view.blocks[layer]
    if block.mlp_weights is None or not block.has_coefficients:
        raise UsageError(f"the {view.family} adapter exposes no MLP neurons for block {layer}")
    return block


def layer_coefficients(
    view: ModelView, layer: int, sample: SequenceSample, batch_size: int, progress: bool, desc: str
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, m) per batch of the sample: the batch's token ids and the neuron coefficients m
    (batch, seq, d_ff) of block `layer`, as its MLP's output projection receives them (one
    forward of the model per batch, one hook)."""
    for batch in each_batch(sample.sequences, batch_size, desc, progress):
        yield batch_coefficients(view, layer, batch)


def batch_coefficients(view: ModelView, layer: int, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, m) of one batch (`layer_coefficients`): its token ids on the model's device and
    block `layer`'s neuron coefficients there (one forward, one hook)."""
    block = neuron_block(view, layer)
    check_input_ids(view, batch)
    batch = batch.to(view.W_E.device)
    seen: list[torch.Tensor] = []
    handles = block.hook_coefficients(seen.append)
    try:
        with torch.inference_mode():
            run_forward(view, batch)
    finally:
        for handle in handles:
            handle.remove()
    if len(seen) != 1:
        raise RuntimeError(f"expected block {layer}'s MLP to run once per forward, got {len(seen)}")
    return batch, seen[0]


def _result(
    name: str,
    view: ModelView,
    layer: int,
    key: KeySide,
    selection: str,
    value_tokens: int,
    sample: SequenceSample,
    dataset: str,
    fingerprint: str | None,
    tokenizer: PreTrainedTokenizerBase,
) -> NeuronsResult:
    """The key side joined with the value side of the same neurons, every token's text kept."""
    weights = view.blocks[layer].read_mlp_weights()
    rows = added_values(view, layer, torch.tensor(key.neurons, dtype=torch.long))
    values = promoted_tokens(decoder_of(view), rows, value_tokens)
    reports = neuron_reports(key, values)
    return NeuronsResult(
        model=name,
        layer=layer,
        num_layers=view.n_layers,
        d_ff=weights.d_ff,
        gated=weights.gated,
        selection=selection,
        value_rule=VALUE_RULE,
        dataset=dataset,
        sample=sample.rule,
        dataset_fingerprint=fingerprint,
        num_seqs=len(sample.sequences),
        num_positions=key.num_positions,
        neurons=reports,
        texts=mentioned_tokens(reports, lambda token: token_text(tokenizer, token)),
    )


__all__ = ["DEFAULT_SEQ_LEN", "RANK_RULE", "check_layer_and_neurons", "layer_coefficients", "neurons"]
