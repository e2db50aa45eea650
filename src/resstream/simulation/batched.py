"""Many small n × n matrices stored simulations last, and their products.

One n × n matrix per simulation (n ≈ 10) is far too small for batched BLAS, so the simulation
code stores a chunk of them as one (n, n, batch) tensor: entry [i, j, s] is row i, column j
of simulation s. Every step is then an elementwise operation over the batch, contiguous in
memory, and a matrix product is a short loop of multiply-adds over whole (rows, cols, batch)
blocks. The products here also skip the zeros of causal (lower-triangular) factors.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["lower_triangular_product", "product_with_lower_transposed", "simulations_last"]


def simulations_last(matrices: Tensor) -> Tensor:
    """(batch, n, m) → contiguous (n, m, batch)."""
    return matrices.permute(1, 2, 0).contiguous()


def lower_triangular_product(lower: Tensor, right: Tensor, out: Tensor) -> Tensor:
    """out = lower·right per simulation: (n, n, batch) lower-triangular times (n, m, batch).

    One multiply-add over the batch per column j of `lower`, touching only its rows i ≥ j.
    """
    torch.mul(lower[:, :1], right[:1], out=out)
    for j in range(1, lower.shape[1]):
        out[j:].addcmul_(lower[j:, j : j + 1], right[j : j + 1])
    return out


def product_with_lower_transposed(left: Tensor, lower: Tensor, out: Tensor) -> Tensor:
    """out = left·lowerᵀ per simulation: (n, r, batch) times the transpose of an (m, r, batch)
    lower-triangular (or lower-trapezoidal, r < m) matrix, giving (n, m, batch).

    One multiply-add per column c of `lower`, touching only the output columns k ≥ c.
    """
    torch.mul(left[:, :1], lower[None, :, 0], out=out)
    for col in range(1, lower.shape[1]):
        out[:, col:].addcmul_(left[:, col : col + 1], lower[None, col:, col])
    return out
