"""`resstream reproduce`: the whole residual-attenuation study, one command, resumable.

The study (scales, plan, stages, the engine that reuses and resumes them) is `resstream.study`;
this module parses the flags, runs the engine and prints where everything is. It also hands the
engine what runs a resstream command line in this process: the app itself (`register`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from resstream.notices import say
from resstream.study.runner import CommandRunner, use_command_runner


def reproduce_command(
    out: Annotated[Path, typer.Option("--out", help="Directory of the reproduction (created if missing).")],
    scale: Annotated[
        str,
        typer.Option(
            help="tiny (a smoke test of the pipeline), laptop (the study at laptop size, on CPUs) or paper "
            "(GPUs); their times on 2 CPU cores: docs/timings.md."
        ),
    ] = "laptop",
    models: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            help="Pretrained model to analyse and evaluate (run dir, HF directory or hub name); "
            "repeat for several (default: the scale's).",
        ),
    ] = None,
    seeds: Annotated[
        str | None, typer.Option(help="Comma-separated training seeds (default: the scale's).")
    ] = None,
    only: Annotated[
        str | None,
        typer.Option(
            help="Run this stage again (tokens, shift, sweep, eval, compare, misalignment, report); "
            "the stages it needs must have finished."
        ),
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Local corpora (else env RESSTREAM_DATA, then Hugging Face).")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    nproc_per_node: Annotated[
        int, typer.Option(help="Training processes on this machine (GPUs), launched with torchrun.")
    ] = 1,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars.")] = False,
) -> None:
    """Reproduce the residual-attenuation study: shift, sweep, eval, compare, misalignment, report.html."""
    from resstream.cli.sweep import parse_int_list
    from resstream.study import STAGE_TABLE, make_plan, reproduce

    seed_list = parse_int_list(seeds, "--seeds") if seeds is not None else ()
    plan = make_plan(
        scale,
        out,
        models=models or (),
        seeds=seed_list,
        data_dir=str(data_dir) if data_dir else None,
        device=device,
        nproc_per_node=nproc_per_node,
        quiet=quiet,
    )
    outcomes = reproduce(plan, STAGE_TABLE, only=only, log=say)
    for outcome in outcomes:
        how = f"ran in {outcome.seconds:.0f} s" if outcome.ran else "reused"
        typer.echo(f"{outcome.name:<13} {how}")
    typer.echo(f"reproduction at {plan.scale.name} scale in {out}; open {out / 'report.html'}")


def in_process(app: typer.Typer) -> CommandRunner:
    """Run a resstream command line by `app` in this process, exactly as typed, returning its
    exit code (errors propagate as the command raised them)."""

    def run(args: list[str]) -> int | None:
        code: int | None = app(args=args, prog_name="resstream", standalone_mode=False)
        return code

    return run


def register(app: typer.Typer) -> None:
    """Add `reproduce` to the app, and make the app what runs the study's command lines."""
    app.command("reproduce")(reproduce_command)
    use_command_runner(in_process(app))
