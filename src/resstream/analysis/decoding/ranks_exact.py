"""What an exact rank is, its float64 reference, and the checks every rank query makes.

A decoder turns an input vector x (a normed residual state) into scores over the vocabulary,
s_j = w_j · x (+ b_j), w_j the rows of a (vocab, d) matrix. The rank of token t is the number
of entries whose score is *strictly* greater than s_t, so t ∈ top-k ⇔ rank < k (ties are
inclusive).

Exact scores. A score is the dot product of x with a row of the matrix, plus the bias,
evaluated in float64 from the values as given (fp32, or bf16 for bf16 models). Products of
two fp32 numbers are exact in fp64 and the fp64 sum is within d·2^-53 of the real value, so
ranks do not depend on BLAS kernels, batch shapes or devices (a plain fp32 matmul differs by a
few ulps between kernels, so "the fp32 rank" is not well defined at near ties; the fp64
evaluation is the well-defined version of it).

`exact_ranks` is the straightforward reference (an fp64 matmul over every entry) that the
tests hold the fast scheme (`ranks.RankScreen`) to.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "check_bias",
    "check_ids",
    "check_inputs",
    "check_limit",
    "check_matrix",
    "check_rank_inputs",
    "exact_ranks",
]

DEFAULT_CHUNK_BYTES = 64 * 2**20  # one (positions × vocab) score block on a CPU (its caches)


def check_matrix(what: str, matrix: Tensor) -> None:
    """Refuse anything but a non-empty floating (vocab, d_model) tensor, named `what`."""
    if not isinstance(matrix, Tensor) or matrix.dim() != 2 or not matrix.is_floating_point():
        shape = tuple(matrix.shape) if isinstance(matrix, Tensor) else type(matrix).__name__
        raise ValueError(f"{what} must be a floating (vocab, d_model) tensor, got {shape}")
    if matrix.shape[0] < 1 or matrix.shape[1] < 1:
        raise ValueError(f"{what} is empty: shape {tuple(matrix.shape)}")


def check_bias(bias: Tensor | None, vocab: int) -> None:
    """Refuse a bias that is not one value per vocabulary entry."""
    if bias is not None and tuple(bias.shape) != (vocab,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({vocab},)")


def check_ids(what: str, ids: Tensor, shape: tuple[int, ...], vocab: int) -> None:
    """Refuse token ids that are not integers of `shape` inside the vocabulary."""
    if not isinstance(ids, Tensor) or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"{what} must be an integer tensor")
    if tuple(ids.shape) != shape:
        raise ValueError(f"{what} has shape {tuple(ids.shape)}, expected {shape}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(
            f"{what} holds ids from {int(ids.min())} to {int(ids.max())}; "
            f"allowed: 0 to {vocab - 1} (the decoder's vocabulary)"
        )


def check_limit(limit: int | None, vocab: int, what: str = "top_k") -> None:
    """Refuse a rank limit (or list length) `what` outside 1..vocab; None passes."""
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= vocab:
        raise ValueError(f"{what} = {limit!r}; allowed: an integer from 1 to the vocabulary size {vocab}")


def check_inputs(x: Tensor, d_model: int) -> None:
    """Refuse decoder inputs that are not (n, d_model)."""
    if x.dim() != 2 or x.shape[1] != d_model:
        raise ValueError(f"x has shape {tuple(x.shape)}, expected (n, {d_model}) to match the matrix")


def check_rank_inputs(x: Tensor, matrix: Tensor, bias: Tensor | None, token_ids: Tensor) -> int:
    """Check one rank query (`exact_ranks`, `fast_ranks`) and return the vocabulary size."""
    check_matrix("decoder matrix", matrix)
    vocab, d = matrix.shape
    check_inputs(x, d)
    check_bias(bias, vocab)
    check_ids("token_ids", token_ids, (x.shape[0],), vocab)
    return vocab


def exact_ranks(
    x: Tensor,
    matrix: Tensor,
    bias: Tensor | None,
    token_ids: Tensor,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Tensor:
    """Reference rank of `token_ids[i]` among the scores `matrix @ x[i] (+ bias)`.

    `x` (n, d) are decoder inputs (already normed); rank = number of vocabulary entries with a
    strictly greater score, scores evaluated in float64 (module docstring). Straightforward and
    slow: a float64 copy of the matrix and an fp64 matmul over every entry. Returns int64 (n,).
    """
    vocab = check_rank_inputs(x, matrix, bias, token_ids)
    w64 = matrix.to(torch.float64)
    b64 = bias.to(device=matrix.device, dtype=torch.float64) if bias is not None else None
    x64 = x.to(device=matrix.device, dtype=torch.float64)
    ids = token_ids.to(matrix.device)
    rows = max(1, chunk_bytes // (8 * vocab))
    out = []
    for start in range(0, x64.shape[0], rows):
        scores = x64[start : start + rows] @ w64.T
        if b64 is not None:
            scores += b64
        own = scores.gather(1, ids[start : start + rows, None])
        out.append((scores > own).sum(1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64, device=matrix.device)
