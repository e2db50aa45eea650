"""`resstream routes`: by which route a prediction was made (information-flow graph)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from resstream.cli import options
from resstream.cli.attribute import refuse_given
from resstream.errors import UsageError

#: The corpus options' help: each applies to corpus mode only, and says its default there.
CORPUS_HELP = {
    "dataset": "Corpus mode: a named corpus or .txt/.jsonl path; every next-token prediction is traced.",
    "num_seqs": "Corpus mode: sequences sampled \\[default: 16].",
    "seq_len": "Corpus mode: tokens per sequence \\[default: 64].",
    "batch_size": "Corpus mode: sequences per forward pass \\[default: 4].",
}


@options.command
def routes(
    *,
    output: options.OutputArg,
    loading: Annotated[options.Loading, options.model_options(device_map=False)],
    text: Annotated[str | None, typer.Option(help="The text whose prediction is traced.")] = None,
    text_file: Annotated[Path | None, typer.Option(help="A UTF-8 file holding the text.")] = None,
    position: Annotated[
        int | None,
        typer.Option(
            help="Token position whose prediction is traced (default: the last; negative: from the end)."
        ),
    ] = None,
    threshold: Annotated[
        float,
        typer.Option(help="Keep edges whose importance is at least this, in (0, 1) (the paper's 0.04)."),
    ] = 0.04,
    sample: Annotated[
        options.Sample,
        options.corpus_options(dataset=None, num_seqs=None, seq_len=None, batch_size=None, help=CORPUS_HELP),
    ],
) -> None:
    """Trace the route of a prediction across layers and positions (information-flow graph).

    Every term of every residual state gets an importance (its proximity to the sum, Ferrando &
    Voita 2024); edges above --threshold are kept from the prediction down. Writes routes.json,
    routes.csv, routes.png and an interactive routes.html. With --dataset: how often each head
    and MLP lies on the route of the next-token prediction, over a corpus sample.
    """
    import resstream
    from resstream.analysis.routes import CorpusRoutes, RoutesResult
    from resstream.api.routes import CORPUS_BATCH_SIZE
    from resstream.io import write_json
    from resstream.reporting.routes import routes_lines, write_routes_report
    from resstream.rundir import output_set

    in_corpus = sample.dataset is not None
    if in_corpus:
        if text is not None or text_file is not None:
            raise UsageError("give a text (`text`/`text_file`) or a `dataset`, not both")
        refuse_given({"position": position}, "one text, not to corpus mode (`dataset`)")
    else:
        corpus = {"num_seqs": sample.num_seqs, "seq_len": sample.seq_len, "batch_size": sample.batch_size}
        refuse_given(corpus, "corpus mode (`dataset`), not to one text")
    with output_set(output.out, "routes") as outputs:
        result: RoutesResult | CorpusRoutes
        if in_corpus:
            result = resstream.routes_corpus(
                loading.model,
                threshold=threshold,
                **sample.api_kwargs(),
                **loading.api_kwargs(),
                progress=output.progress,
            )
        else:
            result = resstream.routes(
                text,
                text_file=text_file,
                model=loading.model,
                position=position,
                threshold=threshold,
                **loading.api_kwargs(),
                progress=output.progress,
            )
        write_json(outputs / "routes.json", result.to_dict())
        written = write_routes_report(result, outputs.staging)
        corpus_result = result if isinstance(result, CorpusRoutes) else None
        settings = {
            "model": loading.model,
            "text_file": str(text_file) if text_file else None,
            "position": None if in_corpus else result.position,  # type: ignore[union-attr]
            "threshold": threshold,
            "dataset": sample.dataset,
            "num_seqs": corpus_result.num_seqs if corpus_result else None,
            "seq_len": corpus_result.seq_len if corpus_result else None,
            "batch_size": (sample.batch_size or CORPUS_BATCH_SIZE) if in_corpus else None,
        }
        seed = sample.seed if in_corpus else None
        fingerprint = corpus_result.dataset_fingerprint if corpus_result else None
        options.write_run_record(outputs, "routes", settings, loading, seed, fingerprint)
    for line in routes_lines(result):
        typer.echo(line)
    names = ", ".join(sorted(p.name for p in written))
    typer.echo(f"wrote routes.json, {names} and run.json to {output.out}")


def register(app: typer.Typer) -> None:
    """Add `routes` to the app."""
    app.command("routes")(routes)
