"""`resstream composition`: Q-, K- and V-composition scores of every pair of heads."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from resstream.cli import options

#: The files one run writes (besides run.json).
FILES = ("composition.json", "composition.csv", "composition_q.png", "composition_k.png", "composition_v.png")


@options.command
def composition(
    *,
    output: options.OutputArg,
    loading: options.ModelArg,
    top: Annotated[
        options.Count, typer.Option(help="Strongest pairs printed and listed in composition.json, per kind.")
    ] = 10,
    convention: Annotated[
        Literal["resstream", "transformer-lens"],
        typer.Option(
            help="Which norms enter the head matrices: resstream (each head's own norms) or "
            "transformer-lens (TransformerLens's folded, centred weights; pre-norm models)."
        ),
    ] = "resstream",
    samples: Annotated[int, typer.Option(help="Random draws behind the baseline.")] = 256,
    seed: Annotated[int, typer.Option(help="Seed of the baseline's random draws.")] = 0,
) -> None:
    """How much each later head's query, key and value read what earlier heads write (from the weights)."""
    import resstream
    from resstream.analysis.memories.composition import KINDS
    from resstream.io import write_json, write_text
    from resstream.reporting.composition import composition_csv, plot_composition, top_lines
    from resstream.rundir import output_set

    with output_set(output.out, "composition") as outputs:
        result = resstream.composition(
            loading.model,
            convention=convention,
            samples=samples,
            seed=seed,
            **options.api_kwargs(loading, output),
        )
        write_json(outputs / "composition.json", result.to_dict(top=top))
        write_text(outputs / "composition.csv", composition_csv(result))
        for kind in KINDS:
            plot_composition(result, kind, outputs / f"composition_{kind}.png")
        settings = {"model": loading.model, "convention": convention, "top": top, "samples": samples}
        options.write_run_record(outputs, "composition", settings, loading, seed)
    for line in top_lines(result, top):
        typer.echo(line)
    typer.echo(f"wrote {', '.join(FILES)} and run.json to {output.out}")


def register(app: typer.Typer) -> None:
    """Add `composition` to the app."""
    app.command("composition")(composition)
