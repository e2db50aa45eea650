"""Result objects of a simulation: the trend statistics and the strict recency / primacy
verdicts (pure Python, JSON-ready).

The trend (`AttentionTrend`, computed in `resstream.simulation.trend`) is the headline: band
ratios to uniform causal attention and the mean row rank correlation, with 95% intervals. The
strict verdict below is the secondary, all-or-nothing test.

Conventions: layers are numbered from 1 (layer 1 is the first attention layer, computed from
the embeddings); token positions (query i, key j) from 0, so row i has the keys j = 0..i.

Verdict. A *step* of row i is the per-simulation difference A[i][j+1] − A[i][j] (j < i); its
mean and standard error come from the per-simulation differences themselves (the two scores
are strongly correlated, so the marginal standard errors would be wrong). Row i shows

* recency when every step is positive with z = mean / stderr ≥ threshold (default 3): the
  score strictly increases with the key position over all keys j ≤ i, self included;
* primacy when every step is negative with −z ≥ threshold: the score strictly decreases.

Row 0 has a single key and is not testable; row 1 has one step (the query against itself
versus token 0). A layer verdict `holds` when every testable row holds. The margin of a row is
its weakest step in the tested direction (`min_margin`, and `min_z` in standard errors).
Every step must pass on its own, so a row "holds" by chance only if all its steps are ≥ 3
standard errors off by chance; a weak true trend can instead fail on its noisiest step.

`SimulationResult` and `SimulationRun` display themselves in a notebook and give a DataFrame
(`SIMULATION_COLUMNS`), drawn by `resstream.reporting.attention`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from resstream.display import Displayable
from resstream.errors import UsageError, check_choice, closest
from resstream.io import jsonable
from resstream.reprs import summary
from resstream.simulation.config import SimulationConfig
from resstream.simulation.intervals import Estimate

__all__ = [
    "DIRECTIONS",
    "SIMULATION_COLUMNS",
    "AttentionTrend",
    "BandRatio",
    "Direction",
    "LayerAttention",
    "RowTrend",
    "SimulationResult",
    "SimulationRun",
    "TrendVerdict",
    "configuration_label",
    "row_trend",
    "trend_verdict",
]

Direction = Literal["recency", "primacy"]
DIRECTIONS: tuple[str, ...] = ("recency", "primacy")

Matrix = tuple[tuple[float, ...], ...]

#: The columns of `SimulationResult.to_pandas()` and `SimulationRun.to_pandas()`, in order.
SIMULATION_COLUMNS = ("configuration", "layer", "query", "key", "distance", "value", "stderr")


def _log(value: float) -> float:
    """Natural log, −inf for 0 (a band that got no attention), nan stays nan."""
    if math.isnan(value):
        return math.nan
    return math.log(value) if value > 0 else -math.inf


#: A distance band whose ratio to uniform attention is within this of 1 does not count as a
#: bias (`AttentionTrend.direction`): 5%, the size of a plainly visible tilt in a distance plot.
NEGLIGIBLE_RATIO = 0.05


@dataclass(frozen=True)
class BandRatio:
    """Attention on the distances `first`..`last` (i − j) relative to uniform causal attention:
    `ratio` is 1 for uniform attention (`resstream.simulation.trend`), with its 95% interval."""

    first: int
    last: int
    ratio: Estimate

    @property
    def log_ratio(self) -> Estimate:
        """The natural log of the ratio and of its interval's ends (0: as uniform)."""
        return Estimate(_log(self.ratio.value), _log(self.ratio.low), _log(self.ratio.high))

    @property
    def label(self) -> str:
        """ "self", "δ 1" or "δ 1–3"."""
        if self.last == 0:
            return "self"
        return f"δ {self.first}" if self.first == self.last else f"δ {self.first}–{self.last}"

    def to_dict(self) -> dict[str, Any]:
        """{"distances": [first, last], "log_ratio": {...}, "ratio": {...}}."""
        return {
            "distances": [self.first, self.last],
            "log_ratio": self.log_ratio.to_dict(),
            "ratio": self.ratio.to_dict(),
        }


@dataclass(frozen=True)
class AttentionTrend:
    """The trend of one layer's attention with key position, over `samples` simulations or
    sequences: `spearman` (mean row rank correlation of the scores of earlier keys with their
    position, 95% interval) and `bands` (ratio to uniform causal attention per distance band,
    self first). See `resstream.simulation.trend`."""

    spearman: Estimate
    bands: tuple[BandRatio, ...]
    samples: int

    @property
    def direction(self) -> str:
        """ "recency" when the 95% interval of ρ lies above 0, "primacy" when below, "none"
        when it holds 0 or when every distance band (δ ≥ 1) is within `NEGLIGIBLE_RATIO` of
        uniform attention (a consistent ordering too small to matter: ρ ranks, so differences
        of a fraction of a percent can still give |ρ| ≈ 0.5), "untestable" without an interval
        (one sample, or fewer than 3 tokens)."""
        low, high = self.spearman.low, self.spearman.high
        if math.isnan(low) or len(self.bands) < 2 or self.bands[-1].last < 2:
            return "untestable"
        if not (low > 0 or high < 0) or not self.departs_from_uniform:
            return "none"
        return "recency" if low > 0 else "primacy"

    @property
    def departs_from_uniform(self) -> bool:
        """Whether some distance band (δ ≥ 1) differs from uniform attention by at least
        `NEGLIGIBLE_RATIO` (a ratio outside [0.95, 1.05])."""
        return any(abs(band.ratio.value - 1.0) >= NEGLIGIBLE_RATIO for band in self.bands[1:])

    @property
    def near(self) -> BandRatio | None:
        """The nearest band after self (δ 1–3), None with a single token."""
        return self.bands[1] if len(self.bands) > 1 else None

    @property
    def far(self) -> BandRatio | None:
        """The farthest band when it is not the near one (None for fewer than 5 tokens)."""
        return self.bands[-1] if len(self.bands) > 2 else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the direction, ρ and every band."""
        return jsonable(
            {
                "direction": self.direction,
                "spearman": self.spearman.to_dict(),
                "bands": [band.to_dict() for band in self.bands],
                "samples": self.samples,
                "level": 0.95,
            }
        )

    def __repr__(self) -> str:
        return summary(self, f"{self.direction}, ρ {self.spearman.value:+.3f}, {self.samples} samples")


@dataclass(frozen=True)
class RowTrend:
    """Whether one query row orders its keys in one direction, and by how much at worst.

    `min_margin`: the smallest step in the tested direction (positive when every step points
    that way); `min_z`: the smallest step / standard error ratio; `weakest_key`: j of the step
    with that ratio (keys j → j + 1). nan / None for the untestable row 0.
    """

    query: int
    testable: bool
    holds: bool
    min_margin: float
    min_z: float
    weakest_key: int | None


@dataclass(frozen=True)
class TrendVerdict:
    """Recency or primacy of every query row of one layer (module docstring)."""

    layer: int
    direction: Direction
    threshold: float
    rows: tuple[RowTrend, ...]

    @property
    def holding_rows(self) -> tuple[int, ...]:
        """Queries whose scores are strictly ordered in `direction`."""
        return tuple(r.query for r in self.rows if r.holds)

    @property
    def failing_rows(self) -> tuple[int, ...]:
        """Testable queries whose scores are not (decisively) ordered in `direction`."""
        return tuple(r.query for r in self.rows if r.testable and not r.holds)

    @property
    def untestable_rows(self) -> tuple[int, ...]:
        """Queries with a single key (row 0)."""
        return tuple(r.query for r in self.rows if not r.testable)

    @property
    def holds(self) -> bool:
        """True when every testable row holds."""
        return not self.failing_rows

    @property
    def min_z(self) -> float:
        """The smallest `min_z` over testable rows (nan if any is nan)."""
        return _nan_min(r.min_z for r in self.rows if r.testable)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (None instead of nan/inf), with the summary properties."""
        return jsonable(
            {
                **asdict(self),
                "holds": self.holds,
                "holding_rows": self.holding_rows,
                "failing_rows": self.failing_rows,
                "untestable_rows": self.untestable_rows,
                "min_z": self.min_z,
            }
        )


def _nan_min(values: Any) -> float:
    values = list(values)
    if not values or any(math.isnan(v) for v in values):
        return math.nan
    return min(values)


def _z_score(mean: float, stderr: float) -> float:
    """mean / stderr; ±inf for a certain nonzero step (stderr 0), nan when untestable (a nan
    stderr, e.g. from a single sample, or a zero step with zero stderr)."""
    if math.isnan(stderr) or math.isnan(mean):
        return math.nan
    if stderr > 0:
        return mean / stderr
    return math.nan if mean == 0 else math.copysign(math.inf, mean)


def row_trend(
    query: int, steps: Sequence[float], stderrs: Sequence[float], direction: str, threshold: float
) -> RowTrend:
    """The verdict of one row from its step means and standard errors (module docstring)."""
    check_choice("direction", direction, DIRECTIONS)
    if not steps:
        return RowTrend(query, False, False, math.nan, math.nan, None)
    sign = 1.0 if direction == "recency" else -1.0
    margins = [sign * s for s in steps]
    zs = [_z_score(m, e) for m, e in zip(margins, stderrs, strict=True)]
    if any(math.isnan(z) for z in zs):
        weakest = next(j for j, z in enumerate(zs) if math.isnan(z))
    else:
        weakest = min(range(len(zs)), key=zs.__getitem__)
    min_z = _nan_min(zs)
    holds = not math.isnan(min_z) and min_z >= threshold
    return RowTrend(query, True, holds, min(margins), min_z, weakest)


def trend_verdict(
    layer: int,
    step_mean: Sequence[Sequence[float]],
    step_stderr: Sequence[Sequence[float]],
    direction: str,
    threshold: float = 3.0,
) -> TrendVerdict:
    """Recency or primacy verdict of a layer from its steps (`LayerAttention.step_mean`,
    `.step_stderr`: row i holds the i steps A[i][j+1] − A[i][j], j < i)."""
    check_choice("direction", direction, DIRECTIONS)
    checked: Direction = "recency" if direction == "recency" else "primacy"
    rows = tuple(
        row_trend(i, steps, errs, checked, threshold)
        for i, (steps, errs) in enumerate(zip(step_mean, step_stderr, strict=True))
    )
    return TrendVerdict(layer, checked, threshold, rows)


@dataclass(frozen=True)
class LayerAttention:
    """Mean attention of one layer over the simulations, with standard errors and verdicts.

    `mean[i][j]`, `stderr[i][j]`: score of key j for query i (0 for j > i). `step_mean[i][j]`,
    `step_stderr[i][j]` (j < i, so row i has i entries): A[i][j+1] − A[i][j].
    `spread_mean[i]`, `spread_stderr[i]`: A[i][i−1] − A[i][0], the most recent earlier token
    minus the first token (self excluded), nan for rows 0 and 1.
    """

    layer: int
    mean: Matrix
    stderr: Matrix
    step_mean: Matrix
    step_stderr: Matrix
    spread_mean: tuple[float, ...]
    spread_stderr: tuple[float, ...]
    recency: TrendVerdict
    primacy: TrendVerdict
    trend: AttentionTrend

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists, None instead of nan): the layer, its trend first, then the
        matrices and the strict verdicts."""
        fields = {"layer": self.layer, "trend": self.trend.to_dict()}
        fields.update({k: getattr(self, k) for k in self.__dataclass_fields__ if k not in fields})
        fields["recency"], fields["primacy"] = self.recency.to_dict(), self.primacy.to_dict()
        return jsonable(fields)

    def __repr__(self) -> str:
        return summary(self, f"layer {self.layer}, {len(self.mean)} tokens, trend {self.trend!r}")


@dataclass(frozen=True)
class SimulationResult(Displayable, renderer="resstream.reporting.attention"):
    """Per-layer mean attention of a simulated stack (`layers[0]` is layer 1).

    `method`: "vectorised" (`simulate`) or "reference loop" (`simulate_reference`).

    `to_pandas()` columns (`SIMULATION_COLUMNS`; one row per layer and pair of positions
    key <= query): configuration — the configuration's label (`configuration_label`); layer —
    from 1; query, key — the positions i and j (from 0); distance — i − j; value — the mean
    attention of query i to key j over the simulations; stderr — its standard error (NaN with
    one simulation). The mean attention δ tokens back is the mean of `value` over the queries
    at each distance: `frame.groupby(["configuration", "layer", "distance"])["value"].mean()`.
    """

    config: SimulationConfig
    layers: tuple[LayerAttention, ...]
    method: str

    @property
    def mean_attention(self) -> tuple[Matrix, ...]:
        """mean_attention[l][i][j]: mean score of key j for query i in layer l + 1."""
        return tuple(layer.mean for layer in self.layers)

    @property
    def stderr(self) -> tuple[Matrix, ...]:
        """stderr[l][i][j]: standard error of mean_attention[l][i][j]."""
        return tuple(layer.stderr for layer in self.layers)

    def layer(self, number: int) -> LayerAttention:
        """The layer with 1-based `number`."""
        if not 1 <= number <= len(self.layers):
            raise UsageError(f"layer {number} does not exist; allowed: 1..{len(self.layers)}")
        return self.layers[number - 1]

    def __repr__(self) -> str:
        c = self.config
        setup = (
            f"{c.layers} layers × {c.tokens} tokens, {c.simulations:,} simulations, "
            f"{'LayerNorm' if c.layernorm else 'no LayerNorm'}, γ = {c.gamma:g}"
            f"{', residual' if c.residual else ''}"
        )
        return summary(self, setup, trend_summary(self.layers))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the config, the method and every layer."""
        return jsonable(
            {
                "config": self.config.to_dict(),
                "method": self.method,
                "layers": [layer.to_dict() for layer in self.layers],
            }
        )


def configuration_label(config: SimulationConfig) -> str:
    """A configuration's label: "LayerNorm, γ = 0.5" (and ", residual λ = 1" with the residual)."""
    parts = ["LayerNorm" if config.layernorm else "no LayerNorm", f"γ = {config.gamma:g}"]
    if config.residual:
        parts.append(f"residual λ = {config.residual_scale:g}")
    return ", ".join(parts)


def trend_summary(layers: Sequence[LayerAttention]) -> str:
    """ "ρ by layer +0.01, +0.12, …": the mean row rank correlation of each layer, for reprs."""
    values = ", ".join(f"{layer.trend.spearman.value:+.2f}" for layer in layers)
    return f"ρ by layer {values}"


@dataclass(frozen=True, repr=False)
class SimulationRun(Displayable, Mapping[str, SimulationResult], renderer="resstream.reporting.attention"):
    """What `resstream.simulate` returns: one or (with `grid`) the four standard
    configurations, each `SimulationResult` under its label, in the order they ran.

    A mapping from label to result (`run["no LayerNorm"]`, `list(run)` the labels,
    `run.items()`); `results` holds the (label, result) pairs. `to_dict()` is the content of
    simulate.json: the one configuration's entry, or `{"configurations": [...]}` for a grid.

    `to_pandas()` columns: those of `SimulationResult.to_pandas()` (`SIMULATION_COLUMNS`),
    every configuration's rows one after the other, `configuration` its label here.
    """

    results: tuple[tuple[str, SimulationResult], ...]
    grid: bool = False

    def __getitem__(self, label: str) -> SimulationResult:
        for name, result in self.results:
            if name == label:
                return result
        hint = closest(label, self) if isinstance(label, str) else " (by position: `.results[i]`)"
        raise KeyError(f"no configuration {label!r}{hint}; allowed: {', '.join(map(repr, self))}")

    def __iter__(self) -> Iterator[str]:
        return (label for label, _ in self.results)

    def __len__(self) -> int:
        return len(self.results)

    def to_dict(self) -> dict[str, Any]:
        """The content of simulate.json: per configuration its label, the trend of every layer,
        the config, the method, mean_attention[layer][query][key], stderr and every layer."""
        entries = [_entry(label, result) for label, result in self.results]
        return {"configurations": entries} if self.grid else entries[0]

    def __repr__(self) -> str:
        sizes = {
            f"{c.layers} layers × {c.tokens} tokens, {c.simulations:,} simulations"
            for c in (result.config for _, result in self.results)
        }
        trends = [f"{label}: {trend_summary(result.layers)}" for label, result in self.results]
        return summary(self, "; ".join(sorted(sizes)), *trends)


def _entry(label: str, result: SimulationResult) -> dict[str, Any]:
    """One configuration in simulate.json: the trend of every layer first, then
    mean_attention[layer][query][key], stderr and per layer the strict verdicts."""
    data = result.to_dict()
    return {
        "label": label,
        "trend": [layer["trend"] for layer in data["layers"]],
        "config": data["config"],
        "method": data["method"],
        "mean_attention": [layer["mean"] for layer in data["layers"]],
        "stderr": [layer["stderr"] for layer in data["layers"]],
        "layers": data["layers"],
    }
