"""Scoring a prepared plan: `run_plan` gives the `EvalReport` written to eval.json.

Each benchmark is scored by `resstream.training.scoring` (sliding windows over a text's token
stream, or LAMBADA by its last word); the report carries the settings it was scored under, so
a score kept in eval.json is reused only when they match (`resstream.training.sweep.stale_reason`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from resstream.display import Displayable
from resstream.distributed import Distributed
from resstream.reprs import summary
from resstream.training.evaluate.plan import EvalPlan, PreparedBenchmark
from resstream.training.scoring import (
    DEFAULT_BATCH_SIZE,
    LAMBADA_DOC,
    ONE_PROCESS,
    SLIDING_WINDOW_DOC,
    BenchmarkResult,
    ScoreSums,
    score_lambada,
    score_tokens,
)


@dataclass(frozen=True)
class EvalReport(Displayable, renderer="resstream.reporting.evaluation"):
    """All benchmark results of one model, with the window settings they were scored under.

    `to_pandas()` columns (`resstream.reporting.evaluation.EVAL_COLUMNS`; eval.csv is this
    frame), one row per benchmark and score: model — the model's name; benchmark; metric —
    loss (nats per token), perplexity, accuracy (next-token top-1, percent) and, for LAMBADA,
    last_word_accuracy (percent of passages); value — as in eval.json (NaN where it holds
    null); n — the tokens (passages for last_word_accuracy) the value is a mean over.
    """

    model: str
    results: tuple[BenchmarkResult, ...]
    stride: int
    block_size: int
    batch_size: int = DEFAULT_BATCH_SIZE
    max_tokens: int | None = None
    device: str = "cpu"
    model_fingerprint: str | None = None  # of the weights scored (`EvalModel.fingerprint`)
    model_source: str = "resstream"  # `EvalModel.source`
    context: int | None = None  # the model's own context in tokens (block_size <= context)
    end_of_text: str | None = None  # the token after each document (None: the tokenizer has none)

    def __repr__(self) -> str:
        windows = f"windows of {self.block_size} tokens, stride {self.stride}"
        return summary(self, f"model {self.model!r}", *map(_headline, self.results), windows)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form written to eval.json. Every benchmark entry also carries what it was
        scored under (`max_tokens`, `stride`, `model_fingerprint`; its corpus `fingerprint` is its
        own), so an entry kept from an earlier call is reused only when they match
        (`resstream.training.sweep.stale_reason`)."""
        provenance = {
            "max_tokens": self.max_tokens,
            "stride": self.stride,
            "model_fingerprint": self.model_fingerprint,
        }
        return {
            "model": self.model,
            "stride": self.stride,
            "block_size": self.block_size,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "device": self.device,
            "method": {
                "sliding_window": SLIDING_WINDOW_DOC,
                "lambada": LAMBADA_DOC,
                "loss": "mean next-token cross-entropy in nats; perplexity = exp(loss); "
                "accuracy = next-token top-1 in percent",
            },
            "model_fingerprint": self.model_fingerprint,
            "model_source": self.model_source,
            "context": self.context,
            "end_of_text": self.end_of_text,
            "documents": documents_rule(self.end_of_text),
            "benchmarks": [{**r.to_dict(), **provenance} for r in self.results],
        }


def _headline(result: BenchmarkResult) -> str:
    """One benchmark's scores in a line: 'lambada: perplexity 91.9, accuracy 22.6%, 1,000
    tokens, last word 12.0% of 50 passages'."""
    line = (
        f"{result.name}: perplexity {result.perplexity:.4g}, accuracy {result.accuracy:.1f}%, "
        f"{result.num_tokens:,} tokens"
    )
    if result.last_word_accuracy is not None:
        line += f", last word {result.last_word_accuracy:.1f}% of {result.num_examples or 0:,} passages"
    return line


def documents_rule(end_of_text: str | None) -> str:
    """How documents are joined and LAMBADA contexts begin, for a tokenizer whose end-of-text
    token is `end_of_text` (None: it has none)."""
    if end_of_text is None:
        return (
            "the tokenizer has no end-of-text token: documents are joined with nothing between "
            "them and LAMBADA contexts start without a start token"
        )
    return f"{end_of_text!r} after each document and before each LAMBADA context"


def score_benchmark(
    plan: EvalPlan, bench: PreparedBenchmark, *, progress: bool, ranks: Distributed = ONE_PROCESS
) -> BenchmarkResult:
    """Score one prepared benchmark (its batches shared out among `ranks` under torchrun)."""
    model, block = plan.model.forward, plan.model.block_size
    extra = {"origin": bench.origin, "fingerprint": bench.fingerprint, "note": bench.note}
    if bench.examples is not None:
        sums: ScoreSums = score_lambada(
            model,
            bench.examples,
            batch_size=plan.settings.batch_size,
            device=plan.device,
            progress=progress,
            desc=bench.name,
            ranks=ranks,
        )
    else:
        sums = score_tokens(
            model,
            bench.stream(),
            block_size=block,
            stride=plan.stride,
            batch_size=plan.settings.batch_size,
            device=plan.device,
            progress=progress,
            desc=bench.name,
            ranks=ranks,
        )
    return sums.result(bench.name, **extra)


def run_plan(
    plan: EvalPlan,
    *,
    progress: bool = True,
    ranks: Distributed = ONE_PROCESS,
    starting: Callable[[PreparedBenchmark], None] | None = None,
) -> EvalReport:
    """Score every benchmark of a prepared plan. `ranks`: the processes of a torchrun job, which
    share every benchmark's batches out and all get the report one process gets (each must call
    this with the same plan; `resstream.distributed.run_sharded`). `starting` is called with
    each benchmark before it is scored (a progress line)."""
    results = []
    for bench in plan.benchmarks:
        if starting is not None:
            starting(bench)
        results.append(score_benchmark(plan, bench, progress=progress, ranks=ranks))
    return EvalReport(
        model=plan.model.name,
        results=tuple(results),
        stride=plan.stride,
        block_size=plan.model.block_size,
        batch_size=plan.settings.batch_size,
        max_tokens=plan.settings.max_tokens,
        device=str(plan.device),
        model_fingerprint=plan.model.fingerprint,
        model_source=plan.model.source,
        context=plan.model.context,
        end_of_text=plan.model.end_of_text,
    )


def datasets_fingerprint(results: Iterable[BenchmarkResult]) -> str:
    """One fingerprint over the corpora of all benchmarks (sha256 of name:fingerprint lines)."""
    text = "\n".join(f"{r.name}:{r.fingerprint}" for r in results)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
