"""`resstream compare`: baseline / best fixed cut / learned gate across benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from resstream.cli import options
from resstream.cli.common import check_max_eval_tokens, split_names
from resstream.cli.flags import cli_message
from resstream.errors import UsageError
from resstream.notices import say


def compare(
    inputs: Annotated[
        list[Path],
        typer.Argument(metavar="RUN_OR_SWEEP_DIR", help="Sweep directories (or their seed-<s> folders)."),
    ],
    out: options.OutOption,
    benchmarks: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated benchmarks or 'all' (default: every benchmark whose data can be read "
            "here; the others are named as skipped)."
        ),
    ] = None,
    max_eval_tokens: Annotated[
        str | None,
        typer.Option(
            metavar="N",
            help="Tokens per benchmark (default: the sweep's own --max-eval-tokens, else all). "
            "A score cached in a run's eval.json is reused only if it was made with the same N, "
            "weights and benchmark data.",
        ),
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Local benchmark data (else env RESSTREAM_DATA).")
    ] = None,
    device: Annotated[str, typer.Option(help="Device for runs evaluated now: auto, cpu, cuda.")] = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False,
) -> None:
    """Compare baseline, best fixed cut and learned gate; writes compare.md/.csv/.json/.png and run.json."""
    from resstream.api.compare import compare as compare_runs
    from resstream.io import write_json, write_text
    from resstream.reporting.plots import plot_compare
    from resstream.rundir import output_set
    from resstream.training.evaluate import check_benchmarks

    names = check_benchmarks(split_names(benchmarks), allow_all=True) if benchmarks is not None else None
    if names is not None and not names:
        raise UsageError(f"--benchmarks: {benchmarks!r} names no benchmark")
    max_tokens = check_max_eval_tokens(max_eval_tokens)
    with output_set(out, "compare") as outputs:
        result = compare_runs(
            inputs,
            names,
            max_eval_tokens=max_tokens,
            data_dir=data_dir,
            device=device,
            progress=not quiet,
            log=lambda line: say(cli_message(line, "compare")),
        )
        markdown = result.table.to_markdown()
        write_text(outputs / "compare.md", markdown)
        write_text(outputs / "compare.csv", result.table.to_csv())
        plot_compare(result.table, outputs / "compare.png")
        write_json(outputs / "compare.json", result.to_dict())
        settings = {
            "inputs": list(result.inputs),
            "benchmarks": list(result.benchmarks),
            "max_eval_tokens": result.max_eval_tokens,
            "runs": len(result.runs),
        }
        options.write_run_record(outputs, "compare", settings, result.device)
    typer.echo(markdown, nl=False)


def register(app: typer.Typer) -> None:
    """Add `compare` to the app."""
    app.command("compare")(compare)
