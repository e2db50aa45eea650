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

from resstream.checks import check_integer, check_positive
from resstream.devices import resolve_device
from resstream.errors import UsageError, check_choice
from resstream.resources import (
    MAX_RUN_SECONDS,
    check_duration,
    format_bytes,
    host_available_bytes,
    usable_cpus,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "LAYERNORM_EPS",
    "SAMPLINGS",
    "Sampling",
    "SimulationConfig",
    "chunk_bytes",
    "layer_bytes",
    "simulation_work",
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

#: What a run keeps per layer beyond its chunk buffers: the fp64 accumulators of 2·n² features
#: on the device, and the layer's result (Python floats, then JSON) on the host. Measured:
#: ~23 KB per layer at 10 tokens, ~270 KB at 40, ~1.6 MB at 100 (`layer_bytes`).
_LAYER_FIXED_BYTES = 4_000
_LAYER_BYTES_PER_SCORE = 160

#: Per simulation and layer, the n²-sized steps (normalisation, softmax, the statistics of
#: 2·n² features) cost as much as this many n³ multiply-adds (measured on 2 CPU cores; they
#: dominate below ~500 tokens).
_SQUARE_STEP_WEIGHT = 512

#: Work units (`simulation_work`) per second that no machine exceeds, so that time estimates
#: are lower bounds: per usable CPU core, and per CUDA device. Measured at most (benchmarks/
#: bench_budget.py): 4e9 per core on 2 cores, 1e10 per core on 16, 7.8e11 on an H100.
WORK_RATE_PER_CPU_BOUND = 2e10
WORK_RATE_PER_GPU_BOUND = 5e12


def padded_to_16(count: int) -> int:
    """`count` rounded up to a multiple of 16 (the block size of torch's CPU normal sampler)."""
    return -(-count // 16) * 16


def _require(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise UsageError(f"`{name}` {value!r} is not allowed; allowed: {allowed}")


def _require_real(name: str, value: object, ok: bool, allowed: str) -> None:
    finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    _require(finite and ok, name, value, allowed)


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
        check_positive("layers", self.layers)
        check_integer("tokens", self.tokens, 2)
        check_integer("dim", self.dim, 2)
        check_positive("simulations", self.simulations)
        check_integer("seed", self.seed, 0, _MAX_SEED)
        _require_real("sigma", self.sigma, self.sigma > 0, "a number > 0")
        _require_real("gamma", self.gamma, 0 <= self.gamma < 1, "0 <= gamma < 1")
        _require_real("residual_scale", self.residual_scale, self.residual_scale > 0, "a number > 0")
        _require_real("threshold", self.threshold, self.threshold > 0, "a number > 0")
        _require(isinstance(self.layernorm, bool), "layernorm", self.layernorm, "True, False")
        _require(isinstance(self.residual, bool), "residual", self.residual, "True, False")
        if self.chunk_size is not None:
            check_positive("chunk_size", self.chunk_size)
        if self.memory_limit_bytes is not None:
            check_positive("memory_limit_bytes", self.memory_limit_bytes)
        check_choice("sampling", self.sampling, SAMPLINGS)
        _check_device(self.device)
        self._check_memory()
        self._check_duration()

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

    def _check_memory(self) -> None:
        """One simulation and every layer's statistics must fit; then one chunk of them."""
        limit, layers_need = self.memory_limit, self.layers * layer_bytes(self.tokens)
        single = chunk_bytes(self, 1)
        if single + layers_need > limit:
            if single + layer_bytes(self.tokens) <= limit:  # fewer layers would fit
                fitting = max((limit - single) // layer_bytes(self.tokens), 0)
                raise UsageError(
                    f"`layers` {self.layers} needs ~{format_bytes(layers_need)} for the statistics and "
                    f"results of every layer (tokens {self.tokens}), more than the memory limit of "
                    f"{format_bytes(limit)}; allowed: `layers` <= {fitting}"
                )
            raise UsageError(
                f"`tokens` {self.tokens} needs ~{format_bytes(single + layers_need)} for one simulation "
                f"(layers {self.layers}, dim {self.dim}, sampling {self.sampling!r}), more than the "
                f"memory limit of {format_bytes(limit)}; allowed: `tokens` <= {self._fitting_tokens(limit)}"
            )
        chunk = self.resolved_chunk_size
        need = chunk_bytes(self, chunk)
        if need + layers_need > limit:
            fitting = max((limit - layers_need) // single, 0)
            raise UsageError(
                f"`chunk_size` {chunk} needs ~{format_bytes(need)} of buffers per chunk "
                f"(tokens {self.tokens}, dim {self.dim}, sampling {self.sampling!r}), more than "
                f"the memory limit of {format_bytes(limit)}; allowed: chunk_size <= {fitting}"
            )

    def _fitting_tokens(self, limit: int) -> int:
        """The most tokens whose single simulation and layers fit in `limit` bytes (>= 1)."""

        def need(tokens: int) -> int:
            floats = simulation_floats(tokens, self.dim, self.sampling, self.layernorm)
            return floats * _FLOAT32_BYTES + self.layers * layer_bytes(tokens)

        low, high = 1, self.tokens  # need(high) > limit
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if need(middle) <= limit else (low, middle)
        return low

    def _check_duration(self) -> None:
        """Refuse a run whose lower-bound time (`simulation_work` at `WORK_RATE_BOUND`) is
        longer than `resstream.resources.MAX_RUN_SECONDS`."""
        device = resolve_device(self.device).type
        rate = WORK_RATE_PER_GPU_BOUND if device == "cuda" else WORK_RATE_PER_CPU_BOUND * usable_cpus()
        seconds = simulation_work(self) / rate
        fitting = int(self.simulations * MAX_RUN_SECONDS / seconds) if seconds else self.simulations
        check_duration(
            f"`simulations` {self.simulations} with `layers` {self.layers} and `tokens` {self.tokens}",
            seconds,
            basis=f"at <= {rate:.0e} work units/s on {device}",
            allowed=f"`simulations` <= {fitting}" if fitting >= 1 else "",
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field, plus the resolved chunk size and LayerNorm eps."""
        return {
            **asdict(self),
            "resolved_chunk_size": self.resolved_chunk_size,
            "layernorm_eps": LAYERNORM_EPS,
        }


def chunk_bytes(config: SimulationConfig, chunk: int) -> int:
    """Bytes of the float32 buffers that one chunk of `chunk` simulations allocates (at most):
    `chunk` × `simulation_floats` × 4. Accumulators and results are per layer (`layer_bytes`)."""
    floats = simulation_floats(config.tokens, config.dim, config.sampling, config.layernorm)
    return chunk * floats * _FLOAT32_BYTES


def simulation_floats(tokens: int, dim: int, sampling: str, layernorm: bool) -> int:
    """Float32 numbers one simulation of a chunk holds at most.

    The layer loop holds 3 tokens × tokens matrices (Gram, attention, product) and a few
    per-token vectors, the statistics 2·tokens² features and, for the trend statistics
    (`resstream.simulation.trend`), 3 more tokens² temporaries (the earlier scores, their row
    shares, the pairwise signs of the longest row); "gram" sampling adds its random numbers and
    triangular factor; "embeddings" sampling adds the (tokens + 1) × dim normals, the
    tokens × dim embeddings and their centred copy, and one more Gram matrix.
    """
    n, d = tokens, dim
    floats = 3 * n * n + 2 * n * n + 3 * n * n + 4 * n
    if sampling == "gram":
        rank = min(n, d - 1 if layernorm else d)
        return floats + padded_to_16(n * rank) + 2 * rank + n * rank
    return floats + padded_to_16((n + 1) * d) + 2 * n * d + n * n


def layer_bytes(tokens: int) -> int:
    """Bytes a run keeps for each layer, whatever the number of simulations: its statistics
    and its result (measured, see `_LAYER_BYTES_PER_SCORE`)."""
    return _LAYER_FIXED_BYTES + _LAYER_BYTES_PER_SCORE * tokens * tokens


def simulation_work(config: SimulationConfig) -> float:
    """Work units of a whole run, for time estimates: per simulation and layer n³ (the two
    triangular n × n products) plus `_SQUARE_STEP_WEIGHT`·n² (the n²-sized steps), plus
    drawing the inputs (n²·rank for "gram" sampling, n·(n + 1)·dim for "embeddings")."""
    n = config.tokens
    per_layer = n**3 + _SQUARE_STEP_WEIGHT * n * n
    inputs = n * n * min(n, config.dim) if config.sampling == "gram" else n * (n + 1) * config.dim
    return float(config.simulations) * (config.layers * per_layer + inputs)
