"""`resstream compare`: baseline / best fixed cut / learned gate across benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from resstream.cli import options
from resstream.cli.common import check_max_eval_tokens, split_names
from resstream.cli.flags import cli_message
from resstream.errors import UsageError
from resstream.notices import say
from resstream.training.records import DEFAULT_MAX_EVAL_TOKENS


def compare_cap(value: str | None) -> int | Literal["all"] | None:
    """--max-eval-tokens: 'all', an integer >= 2, or None (the default)."""
    if value is not None and value.strip().lower() == "all":
        return "all"
    if value is not None and not value.strip().lstrip("+-").isdigit():
        raise UsageError(f"--max-eval-tokens: {value!r} is not an integer or 'all'")
    return check_max_eval_tokens(value)


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
            metavar="N|all",
            help="Tokens per benchmark, or 'all' for the full sets (default: the sweep's own "
            f"--max-eval-tokens when it evaluated benchmarks or set one, else {DEFAULT_MAX_EVAL_TOKENS:,}). "
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
    max_tokens = compare_cap(max_eval_tokens)  # refused before the imports below
    from resstream.api.compare import compare as compare_runs
    from resstream.io import write_json, write_text
    from resstream.reporting.plots import plot_compare
    from resstream.rundir import output_set
    from resstream.training.evaluate import check_benchmarks

    names = check_benchmarks(split_names(benchmarks), allow_all=True) if benchmarks is not None else None
    if names is not None and not names:
        raise UsageError(f"--benchmarks: {benchmarks!r} names no benchmark")
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
            "max_eval_tokens_from": result.max_eval_tokens_from,
            "runs": len(result.runs),
        }
        options.write_run_record(outputs, "compare", settings, result.device)
    typer.echo(markdown, nl=False)


def register(app: typer.Typer) -> None:
    """Add `compare` to the app."""
    app.command("compare")(compare)
