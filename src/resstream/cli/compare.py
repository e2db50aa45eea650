"""`resstream compare`: baseline / best fixed cut / learned gate across benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from resstream.cli.common import check_max_eval_tokens, echo_err, split_names
from resstream.errors import UsageError


def compare(
    inputs: Annotated[
        list[Path],
        typer.Argument(metavar="RUN_OR_SWEEP_DIR", help="Sweep directories (or their seed-<s> folders)."),
    ],
    out: Annotated[Path, typer.Option("--out", help="Output directory (created if missing).")],
    benchmarks: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated benchmarks or 'all' (default: those already evaluated, else all)."
        ),
    ] = None,
    max_eval_tokens: Annotated[
        str | None, typer.Option(metavar="N", help="Cap on tokens per benchmark for runs evaluated now.")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Local benchmark data (else env RESSTREAM_DATA).")
    ] = None,
    device: Annotated[str, typer.Option(help="Device for runs evaluated now: auto, cpu, cuda.")] = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False,
) -> None:
    """Compare baseline, best fixed cut and learned gate; writes compare.md/.csv/.json and run.json."""
    from resstream.devices import resolve_device
    from resstream.io import run_record, write_json, write_text
    from resstream.reporting.tables import compare_table, saved_benchmarks
    from resstream.rundir import output_set
    from resstream.training import sweep as sw
    from resstream.training.evaluate import BENCHMARKS, check_benchmark_data, check_benchmarks
    from resstream.training.records import load_runs

    names = check_benchmarks(split_names(benchmarks), allow_all=True) if benchmarks is not None else None
    if names is not None and not names:
        raise UsageError(f"--benchmarks: {benchmarks!r} names no benchmark")
    max_tokens = check_max_eval_tokens(max_eval_tokens)
    with output_set(out, "compare") as outputs:
        dev = str(resolve_device(device))
        records = load_runs(inputs)
        if names is None:
            names = saved_benchmarks(records, BENCHMARKS) or BENCHMARKS
        check_benchmark_data(sw.missing_benchmarks(records, names), str(data_dir) if data_dir else None)
        records = sw.fill_evals(
            records,
            names,
            max_tokens=max_tokens,
            device=dev,
            data_dir=str(data_dir) if data_dir else None,
            progress=not quiet,
            log=None if quiet else echo_err,
        )
        table = compare_table(records, names)
        markdown = table.to_markdown()
        write_text(outputs / "compare.md", markdown)
        write_text(outputs / "compare.csv", table.to_csv())
        write_json(
            outputs / "compare.json",
            {**table.to_dict(), "inputs": [str(p) for p in inputs], "benchmarks": list(names)},
        )
        settings = {
            "command": "compare",
            "inputs": [str(p) for p in inputs],
            "benchmarks": list(names),
            "max_eval_tokens": max_tokens,
            "runs": len(records),
        }
        outputs.write_record(run_record(settings, seed=None, device=dev, dataset_fingerprint=None))
    typer.echo(markdown, nl=False)


def register(app: typer.Typer) -> None:
    """Add `compare` to the app."""
    app.command("compare")(compare)
