"""`resstream sweep`: baseline, a fixed cut at every layer and the learned gate, per seed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from resstream.cli import options
from resstream.cli.common import check_max_eval_tokens, split_names
from resstream.cli.flags import flag
from resstream.cli.train import (
    ConfigArg,
    parse_field_flags,
    register_taking_field_flags,
    resolve_train_config,
)
from resstream.errors import UsageError
from resstream.notices import say

if TYPE_CHECKING:
    from resstream.training.records import SweepResult

#: Config fields the sweep sets for each run itself, and the flags that choose them instead.
SWEEP_OWNED_FIELDS = {"gate": "--layers / --no-learned", "cut_layer": "--layers", "seed": "--seeds"}


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """Parse '0,1,2' (spaces allowed) into integers; a UsageError names a bad element."""
    items = [item.strip() for item in str(text).split(",")]
    if not any(items):
        raise UsageError(f"{option}: {text!r} is empty; give comma-separated integers such as 0,1,2")
    values = []
    for item in items:
        try:
            values.append(int(item))
        except ValueError:
            raise UsageError(
                f"{option}: {item!r} is not an integer; give comma-separated integers such as 0,1,2"
            ) from None
    return tuple(dict.fromkeys(values))


def check_sweep_flags(flags: dict[str, Any]) -> None:
    """Refuse per-field flags that the sweep sets itself (gate, cut layer, seed)."""
    for name, instead in SWEEP_OWNED_FIELDS.items():
        if name in flags:
            raise UsageError(f"{flag(name)} is set by the sweep for each run; use {instead}")


@options.command
def sweep(
    *,
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Sweep directory (created if missing).")],
    source: ConfigArg,
    seeds: Annotated[
        str | None, typer.Option(help="Comma-separated seeds, e.g. 0,1,2 (default: the config's seed).")
    ] = None,
    alpha: Annotated[
        str | None, typer.Option(metavar="A", help="Identity-path scale at the cut layer, in (0, 1].")
    ] = None,
    layers: Annotated[
        str | None, typer.Option(help="Comma-separated cut layers in [0, n_layer) (default: all).")
    ] = None,
    no_learned: Annotated[
        bool, typer.Option("--no-learned", help="Do not train the learned-gate model.")
    ] = False,
    benchmarks: Annotated[
        str | None,
        typer.Option(help="Comma-separated benchmarks to evaluate every run on, or 'all' (default: none)."),
    ] = None,
    max_eval_tokens: Annotated[
        str | None, typer.Option(metavar="N", help="Evaluate at most this many tokens per benchmark.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False,
) -> None:
    """Train baseline, fixed-cut and learned-gate models per seed; write sweep.json, sweep.csv and plots."""
    from resstream.api.sweep import run_planned_sweep
    from resstream.training import sweep as sw
    from resstream.training.distributed import launched_rank
    from resstream.training.evaluate import check_benchmarks

    extra = list(ctx.args)
    check_sweep_flags(parse_field_flags(extra))
    base = resolve_train_config(source, {"alpha": alpha}, extra)
    seed_list = parse_int_list(seeds, "--seeds") if seeds is not None else None
    layer_list = parse_int_list(layers, "--layers") if layers is not None else None
    names = check_benchmarks(split_names(benchmarks), allow_all=True) if benchmarks is not None else ()
    if benchmarks is not None and not names:
        raise UsageError(f"--benchmarks: {benchmarks!r} names no benchmark")
    max_tokens = check_max_eval_tokens(max_eval_tokens)
    plan = sw.plan_sweep(base, seeds=seed_list, layers=layer_list, learned=not no_learned)
    result = run_planned_sweep(
        plan,
        out,
        benchmarks=names,
        max_eval_tokens=max_tokens,
        progress=not quiet,
        log=None if quiet else say,
    )
    if launched_rank() != 0:  # the other processes of a torchrun job only trained
        return
    _summary(result, out)


def _summary(result: SweepResult, out: Path) -> None:
    """Print each seed's final validation losses and where the sweep is."""
    for seed in result.seeds:
        losses = ", ".join(f"{r.name} {r.val_loss:.4f}" for r in result.runs if r.seed == seed)
        typer.echo(f"seed {seed}: val loss {losses}")
    typer.echo(f"sweep of {len(result.runs)} runs finished; results in {out}")


def register(app: typer.Typer) -> None:
    """Add `sweep` to the app."""
    register_taking_field_flags(app, "sweep", sweep)
