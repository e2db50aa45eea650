"""`resstream report`: one self-contained report.html from existing outputs.

The directories may hold the outputs of `shift`, `lens`, `sweep`, `eval`, `compare`, a
misalignment table or a whole `reproduce` run (`resstream.reporting.report.find_outputs`).
report.html and run.json appear together in --out (`resstream.rundir.output_set`); bad input
writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from resstream.cli import options


def report_command(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            metavar="RUN_DIRS...",
            help="Directories written by resstream shift, lens, sweep, eval, compare or reproduce.",
        ),
    ],
    out: options.OutOption,
    title: Annotated[str | None, typer.Option("--title", help="The page's title.")] = None,
) -> None:
    """Write one self-contained report.html (figures embedded, opens offline) from existing outputs."""
    from resstream.reporting.report import DEFAULT_TITLE, find_outputs, write_report
    from resstream.rundir import output_set

    with output_set(out, "report") as outputs:
        found = find_outputs(inputs)
        write_report(found, outputs.staging, title=title or DEFAULT_TITLE)
        settings = {
            "inputs": [str(p) for p in inputs],
            "title": title,
            "found": [f"{o.kind}: {o.directory}" for o in found.outputs],
        }
        options.write_run_record(outputs, "report", settings, "none")
    typer.echo(str(out / "report.html"))


def register(app: typer.Typer) -> None:
    """Add `report` to the app."""
    app.command("report")(report_command)
