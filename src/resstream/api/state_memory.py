"""The memory check of captured states, made before any forward runs.

Loading checks the weights (`resstream.models.hf_sizes`); an analysis then records states
during its forwards, and those grow with the sample: `check_states_fit` estimates the bytes
one forward's records take — layers × sequences × positions × the values each layer keeps per
position, in the model's dtype, plus what a layer keeps per sequence beyond that (attention
probabilities) — and refuses, with one line naming the parameters that set the size, a
request that does not fit the memory of the device that holds them (a CUDA device's free
memory, else the host's). Blocks that a `device_map` spreads over devices record on their own
device: each device is checked for its own blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from resstream.models import ModelView
from resstream.resources import check_fits

#: What the message tells the user to lower, for a corpus analysis.
CORPUS_REMEDY = "lower `num_seqs`, `seq_len` or `batch_size`"


@dataclass(frozen=True)
class StateRequest:
    """One forward's records: `sequences` × `positions` tokens; per layer and position
    `values` numbers of the model's dtype, plus `per_sequence` numbers per layer and sequence
    (e.g. attention probabilities) and `kept` numbers per layer kept over the whole run (e.g.
    a score per sequence and neuron); `devices` the device of each layer's records."""

    sequences: int
    positions: int
    values: int
    devices: Sequence[torch.device]
    per_sequence: int = 0
    kept: int = 0


def internals_values(view: ModelView) -> int:
    """Numbers `capture.block_internals` keeps per layer and position: eight residual-width
    records (block input and output, attention input, raw output and what it adds, the same
    three of the MLP), the heads' results z and the neuron coefficients; an upper bound where
    a family adds no post-norm (what is added is then the raw output itself)."""
    block = view.blocks[0]
    return 8 * view.d_model + block.W_O.shape[0] * block.W_O.shape[1] + neuron_count(view)


def neuron_count(view: ModelView) -> int:
    """Neuron coefficients a block records per position (a mixture of experts: all its
    experts' neurons, flat); d_model where the view gives no MLP weights."""
    block = view.blocks[0]
    return block.read_mlp_weights().d_ff if block.mlp_weights is not None else view.d_model


def block_devices(view: ModelView) -> list[torch.device]:
    """The device each block computes on (its output projection's; the meta device of
    weights a `device_map` offloads counts as the host)."""
    return [host_if_meta(block.W_O.device) for block in view.blocks]


def host_if_meta(device: torch.device) -> torch.device:
    """`device`, or the host for the meta device (where offloaded weights wait)."""
    return torch.device("cpu") if device.type == "meta" else device


def check_states_fit(view: ModelView, request: StateRequest, what: str, remedy: str = CORPUS_REMEDY) -> None:
    """UsageError when one forward's records (`request`) exceed the memory of a device that
    holds them; `what` names the values that set the size (```batch_size` 8 × `seq_len`
    128 tokens``), `remedy` what to lower (module docstring)."""
    size = view.W_U.element_size()
    per_token = request.positions * request.values + request.per_sequence
    per_layer = (request.sequences * per_token + request.kept) * size
    by_device: dict[torch.device, int] = {}
    for device in request.devices:
        by_device[device] = by_device.get(device, 0) + per_layer
    for device, need in by_device.items():
        layers = sum(d == device for d in request.devices)
        check_fits(
            what,
            need,
            device,
            purpose=f"for the states captured from {layers} layer{'s' * (layers != 1)} "
            f"({request.values:,} values a token each)",
            remedy=remedy,
        )


def check_text_fits(view: ModelView, tokens: int, query_rows: int) -> None:
    """`check_states_fit` for `capture.block_internals` of one text of `tokens` tokens, with
    the attention probabilities of `query_rows` query positions (0: none recorded)."""
    heads = view.blocks[0].W_O.shape[0]
    request = StateRequest(
        1, tokens, internals_values(view), block_devices(view), heads * query_rows * tokens
    )
    check_states_fit(view, request, f"the text ({tokens:,} tokens)", remedy="use a shorter `text`")


def check_corpus_fits(view: ModelView, batches: Sequence[torch.Tensor], num_seqs: int) -> None:
    """`check_states_fit` for corpus attribution: `capture.block_internals` of the largest of
    `batches` (sequences, positions), and a neuron score per sequence, layer and neuron kept
    over the `num_seqs` sequences (`analysis.attribution.corpus`)."""
    rows, positions = max((tuple(b.shape) for b in batches), key=lambda shape: shape[0] * shape[1])
    kept = num_seqs * neuron_count(view)
    request = StateRequest(rows, positions, internals_values(view), block_devices(view), kept=kept)
    check_states_fit(
        view, request, f"`num_seqs` {num_seqs:,} × `seq_len` {positions:,} (`batch_size` {rows:,})"
    )


def check_batches_fit(
    view: ModelView, batch_size: int, seq_len: int, values: int, devices: Sequence[torch.device]
) -> None:
    """`check_states_fit` for a corpus analysis that records `values` numbers a token from
    one layer per entry of `devices` (where that layer's records are kept), `batch_size`
    sequences of `seq_len` tokens a forward."""
    request = StateRequest(batch_size, seq_len, values, devices)
    check_states_fit(view, request, f"`batch_size` {batch_size:,} × `seq_len` {seq_len:,}")


__all__ = [
    "CORPUS_REMEDY",
    "StateRequest",
    "block_devices",
    "check_batches_fit",
    "check_corpus_fits",
    "check_states_fit",
    "check_text_fits",
    "host_if_meta",
    "internals_values",
    "neuron_count",
]
