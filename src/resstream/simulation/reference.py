"""The straightforward reference: the definition run in feature space, one simulation at a time.

No Gram-space algebra and no batching: for each simulation and layer, LayerNorm of the n × d
states, Y·Yᵀ/√d, the causal softmax and A·Y + λ·X, exactly as written in
`resstream.simulation.attention`. It draws the same embeddings as `simulate` with
`sampling="embeddings"` (`resstream.simulation.inputs.embedding_chunks`), so the two agree
simulation by simulation up to float rounding; the tests check it, and the benchmark uses it as
the per-simulation loop yardstick. Only the statistics at the end are computed in one go, by
the same accumulator as `simulate`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from resstream.simulation.attention import build_result, causal_mask
from resstream.simulation.config import LAYERNORM_EPS, SimulationConfig
from resstream.simulation.inputs import embedding_chunks
from resstream.simulation.results import SimulationResult
from resstream.simulation.statistics import (
    MomentAccumulator,
    attention_features,
    feature_width,
)

__all__ = ["layer_norm", "reference_attention", "simulate_reference"]


def layer_norm(x: Tensor, eps: float = LAYERNORM_EPS) -> Tensor:
    """Parameter-free LayerNorm over the last dimension: (x − mean) / sqrt(biased var + eps)."""
    variance, mean = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(variance + eps)


def reference_attention(embeddings: Tensor, layers: int, layernorm: bool, residual_weight: float) -> Tensor:
    """Attention of every layer for one simulation's (tokens, dim) embeddings: (layers, n, n)."""
    tokens, dim = embeddings.shape
    mask = causal_mask(tokens, embeddings.device)
    x, maps = embeddings, []
    for _ in range(layers):
        y = layer_norm(x) if layernorm else x
        scores = (y @ y.T / math.sqrt(dim)).masked_fill(mask, -math.inf)
        attention = torch.softmax(scores, dim=-1)
        maps.append(attention)
        x = attention @ y + residual_weight * x if residual_weight else attention @ y
    return torch.stack(maps)


def simulate_reference(config: SimulationConfig) -> SimulationResult:
    """`simulate` by a Python loop over simulations (slow; for tests and the benchmark).

    Always draws explicit embeddings, so the result's config says `sampling="embeddings"`
    whatever `config.sampling` is. Runs on the CPU.
    """
    maps = torch.empty(config.simulations, config.layers, config.tokens, config.tokens)
    index = 0
    for chunk in embedding_chunks(config):
        for embeddings in chunk:
            maps[index] = reference_attention(
                embeddings, config.layers, config.layernorm, config.residual_weight
            )
            index += 1
    accumulators = []
    for layer in range(config.layers):
        accumulator = MomentAccumulator(feature_width(config.tokens))
        accumulator.add(attention_features(maps[:, layer]))
        accumulators.append(accumulator)
    used = replace(config, sampling="embeddings", device="cpu")
    return build_result(used, accumulators, "reference loop")
