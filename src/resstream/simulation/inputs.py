"""Random inputs of the simulation, drawn chunk by chunk and independent of the chunk size.

Embeddings (per simulation, tokens i = 0..n−1, dimension d):

    x_i = σ·(√γ·s + √(1−γ)·z_i),   s, z_0, ..., z_{n−1} independent N(0, I_d).

So E[x_i·x_j] = σ²·d·γ for i ≠ j and E[|x_i|²] = σ²·d: γ is the expected cosine between two
tokens in the sense E[x_i·x_j] / E[|x_i|²] (the mean of the cosine itself is γ up to O(1/d)),
and γ = 0 gives i.i.d. N(0, σ²·I) embeddings. Each of the d features is an independent
N(0, σ²·Σ) vector over the tokens, Σ = (1−γ)·I + γ·11ᵀ.

Why a Gram matrix is enough. Every quantity of the attention stack depends on the embeddings
X (n × d) only through a Gram matrix (see `resstream.simulation.attention`): G = X·Xᵀ without
LayerNorm, and the Gram matrix of the centred embeddings G = X·C·Xᵀ (C = I − 11ᵀ/d removes
each token's mean over features) with it. Both are Wishart: G = σ²·R·W·Rᵀ with R·Rᵀ = Σ and
W ~ Wishart_n(k, I), k = d without LayerNorm and k = d − 1 with it (C is a projector of rank
d − 1, and Z·C·Zᵀ has the law of Z'·Z'ᵀ for Z' with d − 1 i.i.d. columns).

Two samplers, chosen by `SimulationConfig.sampling`:
* "gram" draws W by the Bartlett decomposition W = L·Lᵀ, L lower-triangular n × r with
  r = min(n, k): L_ii = √χ²_{k−i} (i < r), L_ij ~ N(0, 1) (j < i), 0 above the diagonal. For
  k < n this is the LQ decomposition of an n × k Gaussian matrix, so the singular case is
  exact too. n gamma variates and < n² normals per simulation, whatever d is.
* "embeddings" draws s and the z_i themselves ((n + 1)·d normals) and forms X·Xᵀ or X·C·Xᵀ.
  The per-simulation reference loop uses these very embeddings.

Independence of the chunk size. Generators are seeded once per run (gamma variates from seed
2·seed, normals from 2·seed + 1, so no two seeds share a stream) and chunks draw from them in
simulation order. torch's CPU normal sampler transforms uniforms in blocks of 16, so each
simulation draws a multiple of 16 normals (the unused tail is discarded) and every chunk
consumes exactly the stream a single chunk would: the inputs are bit-identical for any chunk
size (a test proves it). Inputs are always drawn on the CPU, so every device sees the same ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from resstream.simulation.batched import product_with_lower_transposed, simulations_last
from resstream.simulation.config import SimulationConfig, padded_to_16

__all__ = [
    "bartlett_factors",
    "chunk_sizes",
    "embedding_chunks",
    "gram_of_embeddings",
    "input_grams",
    "mix_tokens",
    "token_mixing",
    "wishart_grams",
]


def chunk_sizes(total: int, chunk: int) -> Iterator[int]:
    """Sizes of consecutive chunks covering `total` simulations: `chunk` each, the last smaller."""
    for start in range(0, total, chunk):
        yield min(chunk, total - start)


def token_mixing(tokens: int, gamma: float, sigma: float) -> tuple[float, float]:
    """(a, b) with R = a·I + b·11ᵀ and R·Rᵀ = σ²·((1−γ)·I + γ·11ᵀ), the symmetric square root.

    Σ has eigenvalue 1 − γ + n·γ on the all-ones direction and 1 − γ on its complement.
    """
    a = math.sqrt(1.0 - gamma)
    b = (math.sqrt(1.0 - gamma + tokens * gamma) - a) / tokens
    return sigma * a, sigma * b


def _normal_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(2 * seed + 1)


def _gamma_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(2 * seed)


def embedding_chunks(config: SimulationConfig) -> Iterator[Tensor]:
    """The embeddings x_i = σ·(√γ·s + √(1−γ)·z_i), chunk by chunk: (chunk, tokens, dim) fp32.

    Draws (tokens + 1)·dim normals per simulation, s first; the yielded tensor is a view of
    a buffer that the next chunk overwrites.
    """
    n, d, chunk = config.tokens, config.dim, config.resolved_chunk_size
    per_simulation = (n + 1) * d
    normals = torch.empty(chunk, padded_to_16(per_simulation))
    embeddings = torch.empty(chunk, n, d)
    generator = _normal_generator(config.seed)
    noise_scale = config.sigma * math.sqrt(1.0 - config.gamma)
    shared_scale = config.sigma * math.sqrt(config.gamma)
    for size in chunk_sizes(config.simulations, chunk):
        drawn = torch.randn(normals[:size].shape, generator=generator, out=normals[:size])
        z = drawn[:, :per_simulation].view(size, n + 1, d)
        x = torch.mul(z[:, 1:], noise_scale, out=embeddings[:size])
        if config.gamma > 0:
            x.add_(z[:, :1], alpha=shared_scale)
        yield x


def gram_of_embeddings(embeddings: Tensor, centred: bool) -> Tensor:
    """X·Xᵀ per simulation of (batch, tokens, dim) embeddings; X·C·Xᵀ (each token's mean over
    the features removed first) when `centred`, the Gram matrix that LayerNorm sees."""
    x = embeddings - embeddings.mean(dim=-1, keepdim=True) if centred else embeddings
    return torch.bmm(x, x.transpose(1, 2))


def _strictly_lower_index(tokens: int, rank: int) -> Tensor:
    """Flat indices into a tokens × rank matrix of the entries (i, j) with j < i."""
    rows, cols = torch.tril_indices(tokens, rank, offset=-1)
    return rows * rank + cols


def mix_tokens(gram: Tensor, a: float, b: float) -> Tensor:
    """R·W·Rᵀ in place for R = a·I + b·11ᵀ and (n, n, batch) Gram matrices W, simulations last:
    a²·W_ij + a·b·(u_i + u_j) + b²·Σu with u = W·1 (the row sums)."""
    if b == 0.0:
        return gram.mul_(a * a)
    row_sums = gram.sum(dim=1)
    total = row_sums.sum(dim=0)
    gram.mul_(a * a).add_(row_sums.unsqueeze(1), alpha=a * b).add_(row_sums.unsqueeze(0), alpha=a * b)
    return gram.add_(total, alpha=b * b)


def bartlett_factors(config: SimulationConfig) -> Iterator[Tensor]:
    """The lower-triangular (lower-trapezoidal when k < n) Bartlett factors L of W = L·Lᵀ,
    chunk by chunk: (tokens, r, chunk) fp32, simulations last (module docstring).

    Only copies of the draws and sqrt(2·gamma) (exactly rounded), so they are bit-identical
    for every chunk size."""
    n, chunk = config.tokens, config.resolved_chunk_size
    dof = config.dim - 1 if config.layernorm else config.dim
    rank = min(n, dof)
    lower = _strictly_lower_index(n, rank)
    shapes = torch.arange(dof, dof - rank, -1, dtype=torch.float32).div_(2).expand(chunk, rank)
    shapes = shapes.contiguous()
    normals = torch.empty(chunk, padded_to_16(lower.numel()))
    gamma_generator, normal_generator = (
        _gamma_generator(config.seed),
        _normal_generator(config.seed),
    )
    for size in chunk_sizes(config.simulations, chunk):
        chi_squared = torch._standard_gamma(shapes[:size], generator=gamma_generator)
        drawn = torch.randn(normals[:size].shape, generator=normal_generator, out=normals[:size])
        factor = torch.zeros(n, rank, size)
        factor.view(n * rank, size)[lower] = drawn[:, : lower.numel()].T
        torch.diagonal(factor, dim1=0, dim2=1).copy_(chi_squared.mul_(2.0).sqrt_())
        yield factor


def wishart_grams(config: SimulationConfig) -> Iterator[Tensor]:
    """Gram matrices σ²·R·L·Lᵀ·Rᵀ from `bartlett_factors`, chunk by chunk: (tokens, tokens,
    chunk) fp32, simulations last. Equal for every chunk size up to float rounding (the
    vectorised multiply-adds round differently in the last lanes of a batch)."""
    a, b = token_mixing(config.tokens, config.gamma, config.sigma)
    for factor in bartlett_factors(config):
        n, size = factor.shape[0], factor.shape[2]
        gram = product_with_lower_transposed(factor, factor, out=factor.new_empty(n, n, size))
        yield mix_tokens(gram, a, b)


def input_grams(config: SimulationConfig) -> Iterator[Tensor]:
    """The Gram matrices the attention stack starts from, chunk by chunk, by `config.sampling`:
    (tokens, tokens, chunk) fp32 on the CPU, simulations last."""
    if config.sampling == "gram":
        yield from wishart_grams(config)
        return
    for embeddings in embedding_chunks(config):
        yield simulations_last(gram_of_embeddings(embeddings, centred=config.layernorm))
