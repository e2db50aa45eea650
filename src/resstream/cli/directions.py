"""`resstream directions`: directions of a concept read from two sets of texts, at every layer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from resstream.cli import options

#: The files one run writes (besides run.json).
FILES = (
    "directions.json",
    "directions.csv",
    "directions_auc.png",
    "directions.safetensors",
    "directions.gguf",
)


@options.command
def directions(
    *,
    output: options.OutputArg,
    loading: options.ModelArg,
    positive: Annotated[
        Path | None,
        typer.Option(help='Texts with the concept: .jsonl rows {"text": ...} or one text per line.'),
    ] = None,
    negative: Annotated[Path | None, typer.Option(help="Texts without it, as --positive.")] = None,
    pairs: Annotated[
        Path | None,
        typer.Option(help='Instead: contrast pairs, .jsonl rows {"positive": ..., "negative": ...}.'),
    ] = None,
    concept: Annotated[
        str | None,
        typer.Option(help="Instead: a built-in concept of the plays, comedy-tragedy or speaker:NAME."),
    ] = None,
    position: Annotated[
        Literal["last", "mean"],
        typer.Option(help="Which state of a text: its last token, or the mean over its tokens (no BOS)."),
    ] = "last",
    token: Annotated[
        list[str] | None,
        typer.Option("--token", help="A token whose unembedding each direction is compared with; repeat."),
    ] = None,
    held_out: Annotated[
        options.Fraction, typer.Option(help="Fraction of each set held out to score every method.")
    ] = 0.25,
    seed: Annotated[int, typer.Option(help="Seed of the held-out split and of the pairing.")] = 0,
    batch_size: Annotated[options.Count, typer.Option(help="Texts per forward pass.")] = 16,
    gguf_method: Annotated[
        Literal["diffmean", "pca", "probe"],
        typer.Option(help="The method whose directions directions.gguf holds."),
    ] = "diffmean",
    gguf_scale: Annotated[
        Literal["raw", "unit"],
        typer.Option(help="directions.gguf's vectors: raw (the class-mean separation) or unit length."),
    ] = "raw",
) -> None:
    """Directions of a concept at every layer (DiffMean, PCA of paired differences, a probe),
    each scored by its held-out ROC-AUC.

    The texts: --positive and --negative, or --pairs, or --concept. Writes the scores
    (directions.json, directions.csv), the AUC per layer and method (directions_auc.png), the
    vectors with their metadata (directions.safetensors) and one method's as a llama.cpp
    control vector (directions.gguf: direction.k is the state L{k+1}.resid)."""
    import resstream
    from resstream.analysis.steering import export_control_vector, save_directions
    from resstream.io import write_json, write_text
    from resstream.reporting.steering import directions_csv, plot_directions, summary_lines
    from resstream.rundir import output_set

    with output_set(output.out, "directions") as outputs:
        result = resstream.directions(
            loading.model,
            positive,
            negative,
            pairs=pairs,
            concept=concept,
            position=position,
            tokens=tuple(token or ()),
            held_out=held_out,
            seed=seed,
            batch_size=batch_size,
            **options.api_kwargs(loading, output),
        )
        write_json(outputs / "directions.json", result.to_dict())
        write_text(outputs / "directions.csv", directions_csv(result))
        plot_directions(result, outputs / "directions_auc.png")
        save_directions(result, outputs / "directions.safetensors")
        export_control_vector(result, outputs / "directions.gguf", method=gguf_method, scale=gguf_scale)
        settings = {
            "model": loading.model,
            "positive": str(positive) if positive else None,
            "negative": str(negative) if negative else None,
            "pairs": str(pairs) if pairs else None,
            "concept": concept,
            "source": result.source,
            "position": position,
            "tokens": list(result.tokens),
            "held_out": held_out,
            "batch_size": batch_size,
            "gguf_method": gguf_method,
            "gguf_scale": gguf_scale,
            "texts": {"positive": result.n_positive, "negative": result.n_negative},
            "model_fingerprint": result.model_fingerprint,
        }
        options.write_run_record(outputs, "directions", settings, loading, seed)
    for line in summary_lines(result):
        typer.echo(line)
    typer.echo(f"wrote {', '.join(FILES)} and run.json to {output.out}")


def register(app: typer.Typer) -> None:
    """Add `directions` to the app."""
    app.command("directions")(directions)
