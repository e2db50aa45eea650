"""`resstream routes`: by which route a prediction was made (information-flow graph)."""

from __future__ import annotations

from typing import Annotated

import typer

from resstream.cli import options


@options.command
def routes(
    *,
    output: options.OutputArg,
    loading: Annotated[options.Loading, options.model_options(device_map=False)],
    one: Annotated[
        options.OneText,
        options.text_options(
            "The text whose prediction is traced.",
            keywords=("position",),
            required=False,
        ),
    ],
    threshold: Annotated[
        options.Fraction,
        typer.Option(help="Keep edges whose importance is at least this, in (0, 1) (the paper's 0.04)."),
    ] = 0.04,
    sample: Annotated[
        options.Sample, options.corpus_mode_options("every next-token prediction is traced.", batch_size=4)
    ],
) -> None:
    """Trace the route of a prediction across layers and positions (information-flow graph).

    Every term of every residual state gets an importance (its proximity to the sum, Ferrando &
    Voita 2024); edges above --threshold are kept from the prediction down. Writes routes.json,
    routes.csv, routes.png and an interactive routes.html. With --dataset: how often each head
    and MLP lies on the route of the next-token prediction, over a corpus sample.
    """
    in_corpus = sample.corpus_mode()
    one.check_corpus_mode(in_corpus)
    import resstream
    from resstream.analysis.routes import CorpusRoutes, RoutesResult
    from resstream.api.routes import CORPUS_BATCH_SIZE
    from resstream.io import write_json
    from resstream.reporting.routes import routes_lines, write_routes_report
    from resstream.rundir import output_set

    with output_set(output.out, "routes") as outputs:
        result: RoutesResult | CorpusRoutes
        if in_corpus:
            result = resstream.routes_corpus(
                loading.model, threshold=threshold, **options.api_kwargs(sample, loading, output)
            )
        else:
            result = resstream.routes(
                one.text, model=loading.model, threshold=threshold, **options.api_kwargs(one, loading, output)
            )
        write_json(outputs / "routes.json", result.to_dict())
        written = write_routes_report(result, outputs.staging)
        corpus_result = result if isinstance(result, CorpusRoutes) else None
        settings = {
            "model": loading.model,
            **one.record(),
            "position": None if in_corpus else result.position,  # type: ignore[union-attr]
            "threshold": threshold,
            "batch_size": (sample.batch_size or CORPUS_BATCH_SIZE) if in_corpus else None,
        }
        options.write_corpus_mode_record(outputs, "routes", settings, loading, sample, corpus_result)
    for line in routes_lines(result):
        typer.echo(line)
    names = ", ".join(sorted(p.name for p in written))
    typer.echo(f"wrote routes.json, {names} and run.json to {output.out}")


def register(app: typer.Typer) -> None:
    """Add `routes` to the app."""
    app.command("routes")(routes)
