"""`resstream eval`: loss, perplexity and accuracy of a model on standard benchmarks.

The model is what the analysis commands take: a resstream run directory, the built-in
reference model (default), a local Hugging Face directory or a hub name
(`resstream.models.evaluation`).

Writes `eval.json` (results and the scoring method), `eval.csv` (one row per benchmark and
score: `EvalReport.to_pandas()`) and `run.json` into --out, and prints a table. Every input is
checked, the model and all benchmark texts are loaded before anything is written, so bad input
writes nothing; the three files appear together (`resstream.rundir.output_set`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from resstream.checks import check_batch_size
from resstream.cli import options
from resstream.cli.options import DtypeOption
from resstream.notices import say

if TYPE_CHECKING:
    from resstream.rundir import OutputSet
    from resstream.training.evaluate import EvalEstimate, EvalPlan, EvalReport


def table_text(report: EvalReport) -> str:
    """A small fixed-width table of the results for the terminal."""
    header = f"{'benchmark':<12} {'loss':>8} {'ppl':>10} {'acc %':>7} {'tokens':>10} {'word acc %':>10}"
    lines = [header, "-" * len(header)]
    for r in report.results:
        word = f"{r.last_word_accuracy:.2f}" if r.last_word_accuracy is not None else "-"
        lines.append(
            f"{r.name:<12} {r.loss:>8.4f} {r.perplexity:>10.2f} {r.accuracy:>7.2f} "
            f"{r.num_tokens:>10,} {word:>10}"
        )
    lines.append(f"(block_size {report.block_size}, stride {report.stride}; loss in nats per token)")
    return "\n".join(lines)


def estimate_lines(guess: EvalEstimate, plan: EvalPlan) -> list[str]:
    """What will be scored and about how long it takes; for a long run, the --max-tokens that
    brings it to about a minute."""
    from resstream.training.evaluate import duration_text

    sizes = ", ".join(f"{size.name} {size.scored:,}" for size in guess.sizes)
    lines = [
        f"eval: scoring {guess.scored:,} tokens ({sizes}); about {duration_text(guess.seconds())} "
        f"on {plan.device} (an estimate from timing a few batches, "
        f"{guess.tokens_per_s:,.0f} tokens/s fed)"
    ]
    cap = guess.suggested_cap()
    if cap is not None:
        lines.append(
            f"eval: --max-tokens {cap} scores the first {cap:,} tokens of each benchmark instead, "
            f"in about {duration_text(guess.seconds(cap))}"
        )
    return lines


def write_outputs(outputs: OutputSet, report: EvalReport, plan: EvalPlan, settings: dict[str, Any]) -> None:
    """Stage eval.json, eval.csv and run.json in the command's output set."""
    from resstream.io import write_json, write_text
    from resstream.reporting.evaluation import eval_csv
    from resstream.training.evaluate import datasets_fingerprint

    write_json(outputs / "eval.json", report.to_dict())
    write_text(outputs / "eval.csv", eval_csv(report))
    config = {**settings, "model_config": plan.model.config}
    datasets = {r.name: {"origin": r.origin, "fingerprint": r.fingerprint} for r in report.results}
    fingerprint = datasets_fingerprint(report.results)
    options.write_run_record(
        outputs,
        "eval",
        config,
        str(plan.device),
        None,
        fingerprint,
        datasets=datasets,
    )


def eval_command(
    out: options.OutOption,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Run dir of a finished `resstream train`, Hugging Face directory or hub name "
            "(default: the built-in reference model).",
        ),
    ] = None,
    benchmarks: Annotated[
        str | None,
        typer.Option(
            "--benchmarks",
            help="Comma-separated: wikitext-2, lambada, openwebtext, fineweb-edu, "
            "shakespeare (default: all).",
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="Local corpora (else env RESSTREAM_DATA, then Hugging Face)."),
    ] = None,
    block_size: Annotated[
        int | None,
        typer.Option(
            help="Window length in tokens, 2 .. the model's context (default: the context: a run's "
            "block_size, a Hugging Face config's n_positions / max_position_embeddings)."
        ),
    ] = None,
    stride: Annotated[
        int | None,
        typer.Option(help="Sliding-window stride in tokens, in [1, block_size] (default block_size // 2)."),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Windows per forward pass.")] = 16,
    max_tokens: Annotated[
        int | None, typer.Option(help="Score at most this many tokens per benchmark (quick runs).")
    ] = None,
    dtype: DtypeOption = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    quiet: options.QuietOption = False,
) -> None:
    """Evaluate a model (a run, the reference model or a Hugging Face model): loss, perplexity,
    top-1 accuracy (and LAMBADA last-word accuracy), each model with its own tokenizer.

    A run is scored on only the held-out tail of its own training corpus; for any other model
    shakespeare is the tail a run holds out by default (val_fraction 0.1), the rest is scored whole.
    """
    check_batch_size(batch_size)  # refused before the imports below (`EvalSettings` checks it too)
    from resstream.distributed import joined
    from resstream.models.evaluation import prepare_eval
    from resstream.training.evaluate import BENCHMARKS, EvalSettings, estimate, run_plan

    chosen = benchmarks if benchmarks is not None else ",".join(BENCHMARKS)
    with options.analysis_outputs(out, "eval", device) as outputs:
        # `resstream.evaluate_model` step by step: the estimate of its time is printed before scoring
        eval_settings = EvalSettings.of(
            chosen,
            data_dir=data_dir,
            block_size=block_size,
            stride=stride,
            batch_size=batch_size,
            max_tokens=max_tokens,
            device=device,
        )
        plan = prepare_eval(model, eval_settings, dtype=dtype, progress=not quiet)
        if not quiet and outputs is not None:
            for line in estimate_lines(estimate(plan), plan):
                say(line)
        report = run_plan(plan, progress=not quiet, ranks=joined(device))
        if outputs is None:  # another rank of a torchrun job: rank 0 writes
            return
        settings = {
            "model": plan.model.name,
            "model_source": plan.model.source,
            "model_fingerprint": plan.model.fingerprint,
            "benchmarks": [b.name for b in plan.benchmarks],
            "block_size": plan.model.block_size,
            "dtype": dtype,
            "stride": plan.stride,
            "batch_size": batch_size,
            "max_tokens": max_tokens,
            "data_dir": str(data_dir) if data_dir is not None else None,
        }
        write_outputs(outputs, report, plan, settings)
    typer.echo(table_text(report))
    for r in report.results:
        if r.note:
            typer.echo(f"note ({r.name}): {r.note}")
    typer.echo(f"wrote eval.json, eval.csv and run.json to {out}")


def register(app: typer.Typer) -> None:
    """Add `eval` to the app."""
    app.command("eval")(eval_command)
