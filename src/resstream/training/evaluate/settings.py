"""The settings of an evaluation, in one object: `EvalSettings`.

What is scored (`benchmarks`, read from `data_dir`) and how (windows of `block_size` tokens
advancing by `stride`, `batch_size` windows per forward pass, at most `max_tokens` tokens per
benchmark, on `device`). The settings are checked once, when the object is made, with the
messages every entry point (`resstream.evaluate_model`, `resstream eval`, sweeps and
comparisons) has always given; `block_size` and `stride` against the model's context are
checked once the model is known (`resolve_block_size`, `resolve_stride`). Which model is scored,
and whether progress bars are shown, are not settings: they are passed beside them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypedDict, Unpack

from resstream.checks import check_batch_size, check_max_tokens
from resstream.errors import UsageError
from resstream.training.evaluate.benchmarks import (
    BENCHMARKS,
    check_benchmarks,
    check_data_dir,
    parse_benchmarks,
)
from resstream.training.scoring import DEFAULT_BATCH_SIZE


class EvalOptions(TypedDict, total=False):
    """`EvalSettings` other than the benchmarks, as keyword arguments (`EvalSettings.of`)."""

    data_dir: str | os.PathLike[str] | None
    block_size: int | None
    stride: int | None
    batch_size: int
    max_tokens: int | None
    device: str


@dataclass(frozen=True)
class EvalSettings:
    """How an evaluation scores (see the module docstring); bad values are refused when it is
    made (UsageError naming the parameter). `benchmarks` may be empty (nothing to score)."""

    benchmarks: tuple[str, ...] = BENCHMARKS
    data_dir: str | os.PathLike[str] | None = None
    block_size: int | None = None  # default: the model's context
    stride: int | None = None  # default: block_size // 2
    batch_size: int = DEFAULT_BATCH_SIZE
    max_tokens: int | None = None  # default: every token
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "benchmarks", check_benchmarks(self.benchmarks))
        if self.block_size is not None and self.block_size < 2:
            raise UsageError(
                f"`block_size` must be >= 2 (a window of 1 token scores every token without context), "
                f"got {self.block_size}"
            )
        if self.stride is not None and self.stride < 1:
            raise UsageError(f"`stride` must be >= 1, got {self.stride}")
        check_batch_size(self.batch_size)
        if self.max_tokens is not None:
            check_max_tokens(self.max_tokens)
        check_data_dir(self.data_dir)

    @classmethod
    def of(cls, benchmarks: str | Iterable[str] = BENCHMARKS, **options: Unpack[EvalOptions]) -> EvalSettings:
        """Settings from the Python API's arguments: `benchmarks` comma-separated or a sequence,
        which must name at least one."""
        return cls(parse_benchmarks(benchmarks), **options)


def resolve_block_size(block_size: int | None, context: int) -> int:
    """The window length: `block_size`, or the model's `context` by default; UsageError
    when it is above the context."""
    if block_size is None:
        return context
    if block_size > context:
        raise UsageError(
            f"`block_size` {block_size} is above the model's context ({context} tokens); "
            f"allowed: 2 .. {context}"
        )
    return block_size


def resolve_stride(stride: int | None, block_size: int) -> int:
    """`stride`, or block_size // 2 by default; must lie in [1, block_size]."""
    if stride is None:
        return max(1, block_size // 2)
    if not 1 <= stride <= block_size:
        raise UsageError(f"`stride` {stride} is outside [1, {block_size}] (the model's block_size)")
    return stride
