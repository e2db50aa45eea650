"""`resstream compare`: baseline / best fixed cut / learned gate across benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from resstream.cli import options
from resstream.cli.common import check_max_eval_tokens, echo_err, split_names
from resstream.errors import UsageError

if TYPE_CHECKING:
    from resstream.training.evaluate import BenchmarkData


def skipped_line(data: BenchmarkData, data_dir: Path | None) -> str | None:
    """One line naming the benchmarks left out of the default set, and why."""
    from resstream.data.sources import data_dir as local_data_dir

    if not data.unavailable:
        return None
    names = ", ".join(data.unavailable)
    messages = list(data.unavailable.values())
    if all("is not in the data directory" in m for m in messages):
        where = local_data_dir(data_dir)
        reason = (
            "no data directory is set (give --data-dir or set RESSTREAM_DATA) "
            "and Hugging Face could not be reached"
            if where is None
            else f"they are not in the data directory {str(where)!r} and Hugging Face could not be reached"
        )
    else:
        reason = messages[0]
    kept = ", ".join(data.fingerprints) or "none"
    return f"compare: skipped {names}: {reason}; comparing validation loss and {kept}"


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
    from resstream.devices import resolve_device
    from resstream.io import write_json, write_text
    from resstream.reporting.plots import plot_compare
    from resstream.reporting.tables import compare_table
    from resstream.rundir import output_set
    from resstream.training import sweep as sw
    from resstream.training.evaluate import BENCHMARKS, EvalSettings, check_benchmarks, find_benchmark_data
    from resstream.training.records import load_runs, sweep_max_eval_tokens

    names = check_benchmarks(split_names(benchmarks), allow_all=True) if benchmarks is not None else None
    if names is not None and not names:
        raise UsageError(f"--benchmarks: {benchmarks!r} names no benchmark")
    max_tokens = check_max_eval_tokens(max_eval_tokens)
    local = str(data_dir) if data_dir else None
    with output_set(out, "compare") as outputs:
        dev = str(resolve_device(device))
        records = load_runs(inputs)
        if max_eval_tokens is None:
            max_tokens = sweep_max_eval_tokens(inputs)
        skipped: dict[str, str] = {}
        data = None
        if names is None:
            data = find_benchmark_data(BENCHMARKS, local)
            names, skipped = tuple(data.fingerprints), data.unavailable
            line = skipped_line(data, data_dir)
            if line:
                echo_err(line)
        eval_settings = EvalSettings(names, data_dir=local, max_tokens=max_tokens, device=dev)
        records, summary = sw.fill_evals(
            records, eval_settings, progress=not quiet, log=None if quiet else echo_err, data=data
        )
        for line in summary.lines():
            echo_err(f"compare: {line}")
        table = compare_table(records, names)
        markdown = table.to_markdown()
        write_text(outputs / "compare.md", markdown)
        write_text(outputs / "compare.csv", table.to_csv())
        plot_compare(table, outputs / "compare.png")
        write_json(
            outputs / "compare.json",
            {
                **table.to_dict(),
                "inputs": [str(p) for p in inputs],
                "benchmarks": list(names),
                "max_eval_tokens": max_tokens,
                "skipped": skipped,
                "evaluations": summary.to_dict(),
            },
        )
        settings = {
            "inputs": [str(p) for p in inputs],
            "benchmarks": list(names),
            "max_eval_tokens": max_tokens,
            "runs": len(records),
        }
        options.write_run_record(outputs, "compare", settings, dev)
    typer.echo(markdown, nl=False)


def register(app: typer.Typer) -> None:
    """Add `compare` to the app."""
    app.command("compare")(compare)
