"""How long scoring a plan takes: its sizes, a measured speed, and the `max_tokens` to suggest.

`estimate` times a few full batches on the plan's model and device (`measure_speed`) and counts
the tokens each benchmark feeds through the model (`benchmark_size`); `EvalEstimate` turns both
into seconds and, for an evaluation longer than `LONG_EVAL_S`, a `max_tokens` that shortens it.
`RunsEstimate` adds up the estimates of several runs' evaluations (a comparison's, a sweep's), each
run's sizes and the speed of its model shape measured once (`resstream.training.sweep.estimate_evals`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resstream.training.evaluate.plan import EvalPlan, PreparedBenchmark

#: An evaluation estimated to take longer than this many seconds suggests `max_tokens`.
LONG_EVAL_S = 60.0
#: The `max_tokens` values a suggestion picks from (the largest that fits `LONG_EVAL_S`).
SUGGESTED_CAPS = (100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000)


@dataclass(frozen=True)
class BenchmarkSize:
    """How many tokens a prepared benchmark scores, feeds through the model, and caps
    (`max_tokens` counts `capped`: the text's tokens, or LAMBADA's passage tokens)."""

    name: str
    scored: int
    fed: int
    capped: int


def benchmark_size(plan: EvalPlan, bench: PreparedBenchmark) -> BenchmarkSize:
    """The sizes of one prepared benchmark under the plan's window settings."""
    from resstream.training.scoring import window_plan

    if bench.examples is not None:
        fed = sum(len(ex.ids) - 1 for ex in bench.examples)
        scored = sum(ex.num_target for ex in bench.examples)
        return BenchmarkSize(bench.name, scored, fed, fed + len(bench.examples))
    tokens = bench.stream()
    windows = window_plan(len(tokens), plan.model.block_size, plan.stride)
    return BenchmarkSize(bench.name, len(tokens) - 1, len(windows) * windows.length, len(tokens))


@dataclass(frozen=True)
class EvalEstimate:
    """How long scoring a plan should take, from a measured speed (tokens fed per second)."""

    sizes: tuple[BenchmarkSize, ...]
    tokens_per_s: float

    @property
    def scored(self) -> int:
        """Tokens scored over all benchmarks."""
        return sum(size.scored for size in self.sizes)

    def seconds(self, max_tokens: int | None = None) -> float:
        """Estimated seconds; with `max_tokens`, for the benchmarks cut to that many tokens."""
        fed = 0.0
        for size in self.sizes:
            share = 1.0 if max_tokens is None else min(1.0, max_tokens / size.capped)
            fed += size.fed * share
        return fed / self.tokens_per_s

    def suggested_cap(self) -> int | None:
        """For a long evaluation (over `LONG_EVAL_S`), the largest of `SUGGESTED_CAPS` that
        brings it within that time, else the smallest that shortens it; None when the
        evaluation is not long or no cap would shorten it."""
        if self.seconds() <= LONG_EVAL_S:
            return None
        shorter = [cap for cap in SUGGESTED_CAPS if self.seconds(cap) < self.seconds()]
        fitting = [cap for cap in shorter if self.seconds(cap) <= LONG_EVAL_S]
        if fitting:
            return max(fitting)
        return min(shorter) if shorter else None


@dataclass(frozen=True)
class RunsEstimate:
    """How long evaluating several runs takes: one `EvalEstimate` per run (runs of one model
    shape share one measured speed, `shapes` counts the speeds measured)."""

    runs: tuple[EvalEstimate, ...]
    shapes: int

    @property
    def scored(self) -> int:
        """Tokens scored over all runs and benchmarks."""
        return sum(run.scored for run in self.runs)

    @property
    def benchmarks(self) -> tuple[str, ...]:
        """The benchmarks some run is scored on, in order."""
        return tuple(dict.fromkeys(size.name for run in self.runs for size in run.sizes))

    def seconds(self) -> float:
        """Estimated seconds for all the runs."""
        return sum(run.seconds() for run in self.runs)

    def line(self, device: str) -> str:
        """What will be evaluated and about how long it takes, in one line."""
        runs, benchmarks = len(self.runs), len(self.benchmarks)
        speeds = sorted({run.tokens_per_s for run in self.runs})
        speed = " to ".join(f"{s:,.0f}" for s in (speeds[0], speeds[-1])[: min(2, len(speeds))])
        shapes = "one model" if self.shapes == 1 else f"one model of each of {self.shapes} shapes"
        return (
            f"evaluating {self.scored:,} tokens now ({runs} run{'s' * (runs != 1)} x {benchmarks} "
            f"benchmark{'s' * (benchmarks != 1)}; cached scores not counted): about "
            f"{duration_text(self.seconds())} on {device} (an estimate from timing a few batches of "
            f"{shapes}, {speed} tokens/s fed)"
        )


def measure_speed(plan: EvalPlan, *, min_batches: int = 3, min_seconds: float = 0.5) -> float:
    """Tokens per second the model takes in full batches of `batch_size` windows on the plan's
    device, each scored as the evaluation scores it (forward, then the loss of every token):
    after one warm-up batch, the mean over at least `min_batches` batches and `min_seconds`
    (at most 10 batches). Token ids are zeros: the cost does not depend on them."""
    import time

    batch = torch.zeros(plan.settings.batch_size, plan.model.block_size, dtype=torch.long, device=plan.device)
    timed, elapsed = 0, 0.0
    with torch.inference_mode():
        _score_once(plan, batch)  # warm-up
        while timed < 10 and (timed < min_batches or elapsed < min_seconds):
            started = time.perf_counter()
            _score_once(plan, batch)
            elapsed += time.perf_counter() - started
            timed += 1
    return timed * batch.numel() / max(elapsed, 1e-9)


def _score_once(plan: EvalPlan, batch: torch.Tensor) -> float:
    """The summed next-token loss of one batch (`.item()` waits for the device)."""
    from resstream.training.scoring import logits_of

    logits = logits_of(plan.model.forward, batch).float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.flatten(), reduction="sum").item()


def estimate(plan: EvalPlan) -> EvalEstimate:
    """The plan's sizes and a speed measured on its model (`measure_speed`)."""
    sizes = tuple(benchmark_size(plan, bench) for bench in plan.benchmarks)
    return EvalEstimate(sizes, measure_speed(plan))


def duration_text(seconds: float) -> str:
    """'45 s', '3 min 20 s', '2 h 5 min': an estimate, rounded as people say it."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if minutes < 10 and secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
