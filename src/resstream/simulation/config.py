"""The parameters of a simulation, checked on construction, and what one chunk of it costs.

`SimulationConfig` is the single description of a run: the CLI builds one from its options
and hands it to `simulate`. Every bad value raises `UsageError` with a one-line message that
names the value and what is allowed, so a config that exists is a config that can run
(including the memory that one chunk of simulations needs, see `chunk_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from resstream.devices import resolve_device
from resstream.errors import UsageError, check_choice
from resstream.resources import format_bytes, host_available_bytes

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "LAYERNORM_EPS",
    "SAMPLINGS",
    "Sampling",
    "SimulationConfig",
    "chunk_bytes",
]

#: eps of the parameter-free LayerNorm: (x − mean) / sqrt(biased variance + eps), per token
#: over the d features. The value is PyTorch's `nn.LayerNorm` default.
LAYERNORM_EPS = 1e-5

#: Simulations per chunk when `chunk_size` is not given: the fastest measured on 2 CPU cores
#: (benchmarks/bench_simulate.py); a chunk's buffers (a few KB per simulation) stay in cache.
DEFAULT_CHUNK_SIZE = 4096

Sampling = Literal["gram", "embeddings"]
#: How the inputs are drawn (see `resstream.simulation.inputs`): "gram" draws the n × n Gram
#: matrix of the embeddings directly (fast, O(n²) random numbers per simulation, any d);
#: "embeddings" draws the n × d embeddings themselves and forms their Gram matrix.
SAMPLINGS: tuple[str, ...] = ("gram", "embeddings")

_FLOAT32_BYTES = 4
_MAX_SEED = 2**62


def padded_to_16(count: int) -> int:
    """`count` rounded up to a multiple of 16 (the block size of torch's CPU normal sampler)."""
    return -(-count // 16) * 16


def _require(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise UsageError(f"`{name}` {value!r} is not allowed; allowed: {allowed}")


def _require_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    in_range = is_int and value >= minimum and (maximum is None or value < maximum)
    allowed = f"an integer >= {minimum}" if maximum is None else f"{minimum} <= {name} < {maximum}"
    _require(in_range, name, value, allowed)


def _require_real(name: str, value: object, ok: bool, allowed: str) -> None:
    is_real = isinstance(value, (int, float)) and not isinstance(value, bool)
    _require(is_real and math.isfinite(value) and ok, name, value, allowed)


def _check_device(device: str) -> None:
    """`device` must be a CPU or CUDA device present here (the simulation runs nowhere else)."""
    if resolve_device(device).type not in ("cpu", "cuda"):
        raise UsageError(f"`device` {device!r} is not allowed; allowed: cpu, cuda, cuda:N")


@dataclass(frozen=True)
class SimulationConfig:
    """A stack of parameter-free causal self-attention layers and the inputs to run it on.

    Per layer, from the states X (tokens × dim): Y = LN(X) (or Y = X without LayerNorm),
    A = softmax(causal_mask(Y·Yᵀ/√dim)), X ← A·Y + λ·X (the λ·X term only with `residual`).
    Inputs per simulation: x_i = σ·(√γ·s + √(1−γ)·z_i), i = 0..tokens−1, with one shared s and
    independent z_i, all N(0, I_dim); E[x_i·x_j] / E[|x_i|²] = γ for i ≠ j, and γ = 0 gives
    i.i.d. N(0, σ²·I) embeddings.

    `residual_scale` (λ) must be > 0 and is ignored when `residual` is off. `chunk_size`:
    simulations per vectorised chunk (None: `DEFAULT_CHUNK_SIZE`, at most `simulations`);
    results do not depend on it beyond float rounding. `threshold`: the z-score a step must
    reach for a recency/primacy verdict. `memory_limit_bytes`: refuse a chunk whose buffers
    need more (None: the memory available when the config is made).
    """

    layers: int = 6
    tokens: int = 10
    dim: int = 64
    simulations: int = 100_000
    sigma: float = 1.0
    gamma: float = 0.0
    layernorm: bool = True
    residual: bool = False
    residual_scale: float = 1.0
    seed: int = 0
    device: str = "cpu"
    chunk_size: int | None = None
    sampling: Sampling = "gram"
    threshold: float = 3.0
    memory_limit_bytes: int | None = None

    def __post_init__(self) -> None:
        _require_int("layers", self.layers, 1)
        _require_int("tokens", self.tokens, 2)
        _require_int("dim", self.dim, 2)
        _require_int("simulations", self.simulations, 1)
        _require_int("seed", self.seed, 0, _MAX_SEED)
        _require_real("sigma", self.sigma, self.sigma > 0, "a number > 0")
        _require_real("gamma", self.gamma, 0 <= self.gamma < 1, "0 <= gamma < 1")
        _require_real("residual_scale", self.residual_scale, self.residual_scale > 0, "a number > 0")
        _require_real("threshold", self.threshold, self.threshold > 0, "a number > 0")
        _require(isinstance(self.layernorm, bool), "layernorm", self.layernorm, "True, False")
        _require(isinstance(self.residual, bool), "residual", self.residual, "True, False")
        if self.chunk_size is not None:
            _require_int("chunk_size", self.chunk_size, 1)
        if self.memory_limit_bytes is not None:
            _require_int("memory_limit_bytes", self.memory_limit_bytes, 1)
        check_choice("sampling", self.sampling, SAMPLINGS)
        _check_device(self.device)
        self._check_chunk_memory()

    @property
    def resolved_chunk_size(self) -> int:
        """Simulations per chunk actually used: `chunk_size` (or the default), at most all."""
        return min(self.chunk_size or DEFAULT_CHUNK_SIZE, self.simulations)

    @property
    def residual_weight(self) -> float:
        """λ when the residual is on, else 0.0: the weight of X in X ← A·Y + λ·X."""
        return float(self.residual_scale) if self.residual else 0.0

    @property
    def memory_limit(self) -> int:
        """`memory_limit_bytes`, or the memory this process can allocate now when it is None
        (`resstream.resources.host_available_bytes`: chunks are drawn on the host)."""
        return self.memory_limit_bytes or host_available_bytes()

    def _check_chunk_memory(self) -> None:
        chunk, limit = self.resolved_chunk_size, self.memory_limit
        need = chunk_bytes(self, chunk)
        if need > limit:
            fitting = max(limit // chunk_bytes(self, 1), 0)
            raise UsageError(
                f"`chunk_size` {chunk} needs ~{format_bytes(need)} of buffers per chunk "
                f"(tokens {self.tokens}, dim {self.dim}, sampling {self.sampling!r}), more than "
                f"the memory limit of {format_bytes(limit)}; allowed: chunk_size <= {fitting}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field, plus the resolved chunk size and LayerNorm eps."""
        return {
            **asdict(self),
            "resolved_chunk_size": self.resolved_chunk_size,
            "layernorm_eps": LAYERNORM_EPS,
        }


def chunk_bytes(config: SimulationConfig, chunk: int) -> int:
    """Bytes of the float32 buffers that one chunk of `chunk` simulations allocates (at most).

    Per simulation: the layer loop holds 3 tokens × tokens matrices (Gram, attention, product)
    and a few per-token vectors, the statistics 2·tokens² features; "gram" sampling adds its
    random numbers and triangular factor; "embeddings" sampling adds the (tokens + 1) × dim
    normals, the tokens × dim embeddings and their centred copy, and one more Gram matrix.
    Accumulators (a few KB per layer) are not counted.
    """
    n, d = config.tokens, config.dim
    per_simulation = 3 * n * n + 2 * n * n + 4 * n
    if config.sampling == "gram":
        rank = min(n, d - 1 if config.layernorm else d)
        per_simulation += padded_to_16(n * rank) + 2 * rank + n * rank
    else:
        per_simulation += padded_to_16((n + 1) * d) + 2 * n * d + n * n
    return chunk * per_simulation * _FLOAT32_BYTES
