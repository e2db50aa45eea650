"""Parameter-free stacks of causal self-attention, simulated in Gram space, vectorised in chunks.

The model (per layer, states X: n tokens × d features, layers numbered from 1):

    Y = LN(X)   (per token: subtract the mean over the d features, divide by
                 sqrt(biased variance + eps), eps = LAYERNORM_EPS = 1e-5), or Y = X without LN
    A = softmax(causal_mask(Y·Yᵀ / √d))          (keys j > query i get score 0)
    X ← A·Y + λ·X                                 (λ·X only with the residual; λ = 0 otherwise)

Gram-space evaluation (exact, not an approximation). Let C = I − 11ᵀ/d remove each token's
mean over the features; the stack starts from G = X·Xᵀ without LayerNorm and from the Gram
matrix of the centred embeddings G = (X·C)·(X·C)ᵀ with it. In every layer:

* Ĝ = Y·Yᵀ is G without LayerNorm and D·G·D with it, D = diag(1 / sqrt(G_ii / d + eps)):
  LayerNorm of a token is (its centred part) / (its standard deviation), and the centred part
  of every later state is a token mixture of X·C (centring is linear and idempotent);
* the scores are Ĝ / √d, so A follows from Ĝ alone;
* the next centred state is A·Y + λ·X·C = N·Y with N = A + λ·D⁻¹ (Y = D·X·C, so X·C = D⁻¹·Y;
  N = A + λ·I without LayerNorm), so its Gram matrix is G ← N·Ĝ·Nᵀ. The feature mean that
  the residual carries along never reaches a score: LayerNorm removes it first.

So a simulation needs only its n × n Gram matrix, whatever d is: per layer two n × n × n
products instead of two n × n × d ones, and the inputs can be drawn as a Wishart matrix
directly (`resstream.simulation.inputs`). `simulate_reference` (resstream.simulation.reference)
runs the definition above in feature space, one simulation at a time; the tests check that
both give the same attention on the same embeddings.

Speed. Simulations are processed in chunks of `SimulationConfig.resolved_chunk_size`, so a
chunk's buffers (a few KB per simulation) stay in cache. Each chunk is stored simulations last
(`resstream.simulation.batched`): every step is an in-place fp32 operation over the whole
chunk, and N·Ĝ·Nᵀ skips the zeros of the causal N. Statistics are reduced per chunk in fp32
and merged across chunks in fp64 (`resstream.simulation.statistics`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from resstream.devices import resolve_device
from resstream.errors import RunError, UsageError
from resstream.simulation.batched import (
    lower_triangular_product,
    product_with_lower_transposed,
    simulations_last,
)
from resstream.simulation.config import LAYERNORM_EPS, SimulationConfig
from resstream.simulation.inputs import gram_of_embeddings, input_grams
from resstream.simulation.results import SimulationResult
from resstream.simulation.statistics import (
    MomentAccumulator,
    attention_features,
    feature_width,
    summarise_layer,
)

__all__ = ["attention_layers", "attention_maps", "causal_mask", "simulate"]


def causal_mask(tokens: int, device: torch.device | str = "cpu") -> Tensor:
    """(tokens, tokens) bool, True where the key comes after the query (j > i)."""
    return torch.ones(tokens, tokens, dtype=torch.bool, device=device).triu_(diagonal=1)


def normalise_gram(gram: Tensor, dim: int) -> Tensor:
    """LayerNorm in Gram space: G ← D·G·D in place, D = diag(1 / sqrt(G_ii / d + eps)).

    `gram` holds the centred Gram matrices (n, n, batch); afterwards it holds the Gram
    matrices of the LayerNormed states. Returns the standard deviations sqrt(G_ii / d + eps)
    (n, batch), i.e. the diagonal of D⁻¹.
    """
    variances = torch.diagonal(gram, dim1=0, dim2=1).T.clamp(min=0.0).div_(dim)
    deviations = variances.add_(LAYERNORM_EPS).sqrt_()
    scales = deviations.reciprocal()
    gram.mul_(scales.unsqueeze(1)).mul_(scales.unsqueeze(0))
    return deviations


def causal_softmax(gram: Tensor, dim: int, masked: Tensor, out: Tensor) -> Tensor:
    """A = softmax(causal_mask(G / √d)) over the keys (dim 1) of the Gram matrices of the
    layer inputs Y, computed in `out`. `masked`: flat indices i·n + j of the keys j > i."""
    n, batch = gram.shape[0], gram.shape[2]
    torch.mul(gram, 1.0 / math.sqrt(dim), out=out)
    out.view(n * n, batch).index_fill_(0, masked, -math.inf)
    out.sub_(out.amax(dim=1, keepdim=True)).exp_()
    return out.div_(out.sum(dim=1, keepdim=True))


def advance_gram(
    gram: Tensor,
    attention: Tensor,
    deviations: Tensor | None,
    residual_weight: float,
    product: Tensor,
) -> None:
    """The Gram matrix of the next layer's input X ← A·Y + λ·X, in place of `gram`.

    `gram` holds the Gram matrices Ĝ of Y (after `normalise_gram` with LayerNorm). With
    Y = D·X·C, X·C = D⁻¹·Y, so A·Y + λ·X·C = N·Y with N = A + λ·D⁻¹ and the next Gram matrix
    is N·Ĝ·Nᵀ (N = A + λ·I without LayerNorm). N is lower-triangular (causal), which halves
    both products. `attention` is turned into N in place.
    """
    if residual_weight:
        diagonal = torch.diagonal(attention, dim1=0, dim2=1)
        if deviations is None:
            diagonal.add_(residual_weight)
        else:
            diagonal.add_(deviations.T, alpha=residual_weight)
    lower_triangular_product(attention, gram, out=product)
    product_with_lower_transposed(product, attention, out=gram)


def attention_layers(
    gram: Tensor, dim: int, layers: int, layernorm: bool, residual_weight: float
) -> Iterator[Tensor]:
    """The attention of layers 1..`layers` from the initial Gram matrices, simulations last.

    `gram`: (n, n, batch) X·Xᵀ, or the centred X·C·Xᵀ with `layernorm`; it is overwritten.
    Yields (n, n, batch) tensors A[i, j, s] (query i, key j, simulation s) that the caller
    must read, not modify, before asking for the next layer (they are reused).
    `residual_weight`: λ, 0 for no residual. See `resstream.simulation.batched` for the layout.
    """
    n = gram.shape[0]
    masked = causal_mask(n).flatten().nonzero().flatten().to(gram.device)
    attention, product = torch.empty_like(gram), torch.empty_like(gram)
    for layer in range(1, layers + 1):
        deviations = normalise_gram(gram, dim) if layernorm else None
        causal_softmax(gram, dim, masked, out=attention)
        yield attention
        if layer < layers:
            advance_gram(gram, attention, deviations, residual_weight, product)


def attention_maps(
    embeddings: Tensor, layers: int, layernorm: bool = True, residual_weight: float = 0.0
) -> Tensor:
    """Attention of every layer for given (batch, tokens, dim) embeddings: (layers, batch, n, n).

    Runs the same Gram-space stack as `simulate`, in the dtype of `embeddings`.
    """
    if embeddings.dim() != 3 or embeddings.shape[1] < 1 or embeddings.shape[2] < 1:
        raise UsageError(
            f"embeddings of shape {tuple(embeddings.shape)} are not allowed; allowed: (batch, tokens, dim)"
        )
    if not residual_weight >= 0:
        raise UsageError(f"`residual_weight` {residual_weight!r} is not allowed; allowed: >= 0")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise UsageError(f"`layers` {layers!r} is not allowed; allowed: an integer >= 1")
    gram = simulations_last(gram_of_embeddings(embeddings, centred=layernorm))
    stack = attention_layers(gram, embeddings.shape[2], layers, layernorm, residual_weight)
    return torch.stack([attention.permute(2, 0, 1).clone() for attention in stack])


def simulate(config: SimulationConfig, progress: Callable[[int], object] | None = None) -> SimulationResult:
    """Mean attention (± standard error) of every layer over `config.simulations` runs, with
    recency and primacy verdicts. Vectorised over chunks of simulations; the inputs, and so
    the results up to float rounding, do not depend on the chunk size.

    `progress`, if given, is called after each chunk with the number of simulations it held
    (e.g. a tqdm bar's `update`)."""
    device = resolve_device(config.device)
    n = config.tokens
    accumulators = [MomentAccumulator(feature_width(n), device) for _ in range(config.layers)]
    features = torch.empty(feature_width(n), config.resolved_chunk_size, device=device)
    for grams in input_grams(config):  # (n, n, batch), simulations last
        gram = grams.to(device)
        stack = attention_layers(gram, config.dim, config.layers, config.layernorm, config.residual_weight)
        for accumulator, attention in zip(accumulators, stack, strict=True):
            per_simulation = attention.permute(2, 0, 1)  # a view: (batch, n, n)
            accumulator.add(attention_features(per_simulation, out=features[:, : gram.shape[2]]))
        if progress is not None:
            progress(gram.shape[2])
    return build_result(config, accumulators, "vectorised")


def build_result(
    config: SimulationConfig, accumulators: list[MomentAccumulator], method: str
) -> SimulationResult:
    """The `SimulationResult` from one accumulator per layer; RunError if a score overflowed."""
    for number, accumulator in enumerate(accumulators, start=1):
        if not bool(torch.isfinite(accumulator.mean).all()):
            raise RunError(
                f"attention of layer {number} is not finite (the float32 scores overflowed); "
                "use fewer layers, a smaller sigma or residual_scale, or LayerNorm"
            )
    layers = tuple(
        summarise_layer(number, accumulator, config.tokens, config.threshold)
        for number, accumulator in enumerate(accumulators, start=1)
    )
    return SimulationResult(config=config, layers=layers, method=method)
