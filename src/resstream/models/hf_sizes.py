"""Whether a Hugging Face model fits in memory, judged from its config before any weight is read.

`check_hf_sizes(config, ...)` refuses a config whose sizes are not positive integers, or whose
weights (a lower bound computed from those sizes) cannot fit on the host, where
`from_pretrained` reads them, or on the CUDA device they are then moved to. Each refusal
names the config keys that drive the estimate.
"""

from __future__ import annotations

from typing import Any

import torch

from resstream.errors import UsageError
from resstream.models.loaded import DTYPES, dtype_name
from resstream.resources import check_fits
from resstream.training.budget import Cost, largest, named_drivers

#: Memory of one Hugging Face decoder layer beyond its tensors (module objects), measured on
#: the meta device: 7 KB (Llama) to 38 KB (GPT-2); the smaller, so no real model is refused.
HF_LAYER_OVERHEAD_BYTES = 7_000
#: Families whose position embeddings are a learned (positions × width) table.
LEARNED_POSITION_FAMILIES = ("gpt2",)
#: Size fields every config must hold, by their standard names (a family's own spelling, such
#: as GPT-2's n_layer for num_hidden_layers, comes from the config's attribute_map).
_HF_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
#: Size fields a config may leave out (None): they then take their family's default.
_HF_OPTIONAL_SIZES = (
    "intermediate_size",
    "n_inner",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


def _hf_sizes(config: Any, source: str) -> dict[str, tuple[str, int]]:
    """Standard name -> (the file's key, value) of every size the config gives; UsageError
    for one that is not a positive integer."""
    sizes = {}
    for field in _HF_SIZES + _HF_OPTIONAL_SIZES:
        key = getattr(config, "attribute_map", {}).get(field, field)
        value = getattr(config, field, None)
        if value is None and field in _HF_OPTIONAL_SIZES:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{source} has {key} {value!r}; allowed: an integer >= 1")
        sizes[field] = (key, value)
    return sizes


def _hf_parameter_costs(config: Any, sizes: dict[str, tuple[str, int]]) -> list[Cost]:
    """Parameters of a Hugging Face causal LM per part (layers, embeddings, positions), each
    with the config keys that drive it: a lower bound computed from the config's `sizes`
    alone (q, k, v, o projections and a two-matrix MLP per layer, no norms or biases), so
    that a refusal never blocks a real model."""
    (layers_key, layers), (width_key, d) = sizes["num_hidden_layers"], sizes["hidden_size"]
    heads = sizes["num_attention_heads"][1]
    head_dim = sizes.get("head_dim", (None, d // heads or 1))[1]
    kv_heads = sizes.get("num_key_value_heads", (None, heads))[1]
    mlp_size = sizes.get("intermediate_size") or sizes.get("n_inner")  # default: 4 × width
    mlp = mlp_size[1] if mlp_size else 4 * d
    attention = 2 * d * head_dim * (heads + kv_heads)
    vocab_key, vocab = sizes["vocab_size"]
    tied = bool(getattr(config, "tie_word_embeddings", True))
    positions = sizes.get("max_position_embeddings")
    learned = getattr(config, "model_type", None) in LEARNED_POSITION_FAMILIES
    width = (width_key, d)
    return [
        Cost(
            layers * (attention + 2 * d * mlp),
            ((layers_key, layers), width, *([mlp_size] if mlp_size else [])),
        ),
        Cost(vocab * d * (1 if tied else 2), ((vocab_key, vocab), width)),
        Cost(positions[1] * d, (positions, width)) if positions is not None and learned else Cost(0, ()),
    ]


def _param_dtype(config: Any, dtype: str, device: str, device_map: str | None) -> torch.dtype:
    """The dtype the weights are loaded in (`hf_load.load_hf_model`): the one asked for; with
    "auto", float32 on the CPU, else the checkpoint's own (bfloat16 when it names none)."""
    chosen = DTYPES[dtype]
    if chosen is not None:
        return chosen
    if device_map is None and device.startswith("cpu"):
        return torch.float32
    # transformers 4.x stores `torch_dtype`; 5.x `dtype`, where reading `torch_dtype` warns
    saved = getattr(config, "dtype", None) or vars(config).get("torch_dtype")
    saved = getattr(torch, saved, None) if isinstance(saved, str) else saved
    return saved if isinstance(saved, torch.dtype) else torch.bfloat16


def check_hf_sizes(config: Any, source: str, dtype: str, device: str, device_map: str | None) -> None:
    """Refuse a config whose sizes are not positive integers, or whose weights cannot fit:
    on the host, where from_pretrained reads them (with every layer's module objects), and
    on a CUDA `device` they are then moved to. With a `device_map` only the layers' objects
    are judged (the weights are spread over devices and the host). `source` names the config
    file in messages."""
    sizes = _hf_sizes(config, source)
    costs = _hf_parameter_costs(config, sizes)
    torch_dtype = _param_dtype(config, dtype, device, device_map)
    weights = sum(cost.amount for cost in costs) * torch_dtype.itemsize
    objects = sizes["num_hidden_layers"][1] * HF_LAYER_OVERHEAD_BYTES
    what = f"{source} with {named_drivers(largest(costs), marked=False)}"
    purpose = f"for the weights ({dtype_name(torch_dtype)})"
    check_fits(what, objects + (weights if device_map is None else 0), "cpu", purpose=purpose)
    if device_map is None and device.startswith("cuda"):
        check_fits(what, weights, device, purpose=purpose)


__all__ = ["HF_LAYER_OVERHEAD_BYTES", "LEARNED_POSITION_FAMILIES", "check_hf_sizes"]
