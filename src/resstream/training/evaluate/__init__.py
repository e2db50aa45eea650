"""Benchmark evaluation of a model: loss, perplexity, top-1 accuracy, LAMBADA.

The model is an `EvalModel`: something that gives logits for token ids, with its tokenizer,
the window length it is scored with (`block_size`, at most its context), a display name and a
fingerprint of its weights. A finished resstream run becomes one with `run_eval_model`; any
other model (a Hugging Face causal LM) is made one by `resstream.models.evaluation`.

Benchmarks (`BENCHMARKS`): ``wikitext-2`` (test split), ``lambada`` (OpenAI test set),
``openwebtext`` (sample), ``fineweb-edu`` (sample) and ``shakespeare``: the held-out tail of the
built-in corpus, cut by the rule the trainer uses
(``split_tokens(tokenize_documents(corpus.documents, tokenizer), config.data.val_fraction)``).
It is held-out text only for a run that trained on ``shakespeare``; the result says so either way.
The same rule applies to any benchmark whose text is the run's own training corpus (same
fingerprint, e.g. ``fineweb-edu`` for the ``gpt2-124m`` preset): only its validation tail is scored.
A model that is not a resstream run has no training corpus known here: every benchmark is scored
whole, except ``shakespeare``, which is the same tail (the trainer's default `val_fraction`, cut
in the model's own tokens), so its score sits beside the runs' (`shakespeare_tail_note`).

Every benchmark reports loss (nats), perplexity, top-1 accuracy and the number of tokens scored;
text benchmarks are scored with sliding windows, LAMBADA by its last word
(`resstream.training.scoring` defines both). What is scored, and how, is one `EvalSettings`,
checked when it is made. `prepare_model` loads the model and all texts before anything is
scored; `run_plan` scores them.

The modules, in the order an evaluation meets them: `benchmarks` (names, reading the texts),
`settings`, `model` (`EvalModel`), `plan` (the texts tokenised, the held-out-tail rule),
`timing` (how long it will take), `report` (scoring, `EvalReport`) and `runs` (a resstream run
directory evaluated).
"""

from resstream.training.evaluate.benchmarks import (
    BENCHMARKS,
    BenchmarkData,
    check_benchmark_data,
    check_benchmarks,
    find_benchmark_data,
    parse_benchmarks,
)
from resstream.training.evaluate.model import EvalModel, TrainingText, run_eval_model
from resstream.training.evaluate.plan import (
    EvalPlan,
    PreparedBenchmark,
    prepare_model,
)
from resstream.training.evaluate.report import EvalReport, datasets_fingerprint, run_plan
from resstream.training.evaluate.runs import evaluate_run, prepare, prepare_run
from resstream.training.evaluate.settings import EvalOptions, EvalSettings, resolve_block_size
from resstream.training.evaluate.timing import (
    BenchmarkSize,
    EvalEstimate,
    RunsEstimate,
    benchmark_size,
    duration_text,
    estimate,
    measure_speed,
)

__all__ = [
    "BENCHMARKS",
    "BenchmarkData",
    "BenchmarkSize",
    "EvalEstimate",
    "EvalModel",
    "EvalOptions",
    "EvalPlan",
    "EvalReport",
    "EvalSettings",
    "PreparedBenchmark",
    "RunsEstimate",
    "TrainingText",
    "benchmark_size",
    "check_benchmark_data",
    "check_benchmarks",
    "datasets_fingerprint",
    "duration_text",
    "estimate",
    "evaluate_run",
    "find_benchmark_data",
    "measure_speed",
    "parse_benchmarks",
    "prepare",
    "prepare_model",
    "prepare_run",
    "resolve_block_size",
    "run_eval_model",
    "run_plan",
]
