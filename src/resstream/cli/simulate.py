"""`resstream simulate`: parameter-free stacked causal attention, with and without LayerNorm."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from resstream.checks import check_integer
from resstream.cli import options
from resstream.cli.flags import cli_message

if TYPE_CHECKING:
    from resstream.simulation import SimulationRun


#: An integer option that must be >= 2 (a sequence of tokens, an embedding's width), refused
#: before anything heavy is imported, as `options.Count` is (`SimulationConfig` checks both too).
AtLeast2 = Annotated[int, options.Checked(partial(check_integer, minimum=2))]


@options.command
def simulate(
    out: options.OutOption,
    layers: Annotated[options.Count, typer.Option(help="Attention layers.")] = 6,
    tokens: Annotated[AtLeast2, typer.Option(help="Tokens n per simulated sequence.")] = 10,
    dim: Annotated[AtLeast2, typer.Option(help="Width d of the embeddings.")] = 64,
    simulations: Annotated[
        options.Count,
        typer.Option("--simulations", "--sims", help="Number of simulations (--sims: the same)."),
    ] = 100_000,
    gamma: Annotated[
        float, typer.Option(help="Anisotropy γ in [0, 1): expected cosine between two tokens.")
    ] = 0.0,
    sigma: Annotated[float, typer.Option(help="Scale σ of the embeddings.")] = 1.0,
    layernorm: Annotated[
        bool, typer.Option("--layernorm/--no-layernorm", help="Parameter-free LayerNorm before each layer.")
    ] = True,
    residual: Annotated[
        bool, typer.Option("--residual/--no-residual", help="Add λ·X after each layer.")
    ] = False,
    residual_scale: Annotated[float, typer.Option(help="λ of the residual connection.")] = 1.0,
    grid: Annotated[
        bool,
        typer.Option(
            "--grid",
            help="The four standard configurations in one run "
            "(no LN; LN γ=0; LN γ>0; LN γ>0 + residual; γ = --gamma or 0.5).",
        ),
    ] = False,
    threshold: Annotated[float, typer.Option(help="Standard errors a step needs for a verdict.")] = 3.0,
    chunk_size: Annotated[int, typer.Option(help="Simulations per vectorised chunk (0: default).")] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the random embeddings.")] = 0,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N.")] = "cpu",
    quiet: options.QuietOption = False,
) -> None:
    """Mean attention of every layer (± standard error), its trend with key position (95% intervals)
    and the strict all-steps verdict per layer."""
    import resstream
    from resstream.devices import device_label
    from resstream.io import write_json
    from resstream.reporting.attention import (
        LEGEND,
        layer_lines,
        plot_attention_grid,
        simulation_rows,
        simulation_title,
    )
    from resstream.rundir import output_set

    config: dict[str, Any] = {
        "layers": layers,
        "tokens": tokens,
        "dim": dim,
        "simulations": simulations,
        "gamma": gamma,
        "sigma": sigma,
        "layernorm": layernorm,
        "residual": residual,
        "residual_scale": residual_scale,
        "seed": seed,
        "device": device,
        "chunk_size": chunk_size or None,
        "threshold": threshold,
    }
    with output_set(out, "simulate") as outputs:
        runs = resstream.simulate(grid=grid, progress=not quiet, **config)
        write_json(outputs / "simulate.json", runs.to_dict())
        write_arrays(outputs / "simulate.npz", runs)
        plot_attention_grid(
            simulation_rows(runs.results),
            outputs / "simulate.png",
            title=simulation_title(list(runs.values())),
        )
        options.write_run_record(outputs, "simulate", {"grid": grid, **config}, device_label(device), seed)
    for label, result in runs.items():
        typer.echo(f"{label} ({simulations:,} simulations)")
        for line in layer_lines(result.layers):
            typer.echo(f"  {line}")
    typer.echo(cli_message(LEGEND))
    typer.echo(f"wrote simulate.json, simulate.npz, simulate.png and run.json to {out}")


def write_arrays(path: Path, runs: SimulationRun) -> None:
    """mean_attention and stderr as (configs, layers, n, n) arrays in an .npz."""
    import numpy as np

    from resstream.io import write_npz

    write_npz(
        path,
        labels=np.array(list(runs)),
        mean_attention=np.array([result.mean_attention for result in runs.values()], dtype=np.float64),
        stderr=np.array([result.stderr for result in runs.values()], dtype=np.float64),
    )


def register(app: typer.Typer) -> None:
    """Add `simulate` to the app."""
    app.command("simulate")(simulate)
