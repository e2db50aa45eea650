"""resstream.simulation: parameter-free causal self-attention stacks (torch only).

How causal attention and LayerNorm create a positional (recency) bias, measured by Monte
Carlo: `simulate(SimulationConfig(...))` returns the mean attention matrix of every layer with
standard errors, its trend with key position (`AttentionTrend`: row rank correlation and band
ratios to uniform causal attention with 95% intervals, `resstream.simulation.trend`) and the
strict recency / primacy verdicts (`SimulationResult`, JSON-ready with `to_dict()`);
`SimulationRun` holds labelled results (what `resstream.simulate` returns).
`simulate_reference` is the slow per-simulation loop that the tests and the benchmark compare
against; `attention_maps` runs the stack on given embeddings.

Conventions: layers are numbered from 1 (layer 1 is computed from the embeddings), token
positions from 0; LayerNorm is parameter-free with eps `LAYERNORM_EPS` = 1e-5.
"""

from resstream.simulation.attention import attention_maps, simulate
from resstream.simulation.config import (
    DEFAULT_CHUNK_SIZE,
    LAYERNORM_EPS,
    SAMPLINGS,
    SimulationConfig,
    chunk_bytes,
)
from resstream.simulation.reference import simulate_reference
from resstream.simulation.results import (
    DIRECTIONS,
    AttentionTrend,
    BandRatio,
    LayerAttention,
    RowTrend,
    SimulationResult,
    SimulationRun,
    TrendVerdict,
    trend_verdict,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DIRECTIONS",
    "LAYERNORM_EPS",
    "SAMPLINGS",
    "AttentionTrend",
    "BandRatio",
    "LayerAttention",
    "RowTrend",
    "SimulationConfig",
    "SimulationResult",
    "SimulationRun",
    "TrendVerdict",
    "attention_maps",
    "chunk_bytes",
    "simulate",
    "simulate_reference",
    "trend_verdict",
]
