"""`resstream recency`: measured positional attention of trained models, beside the simulation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from resstream.cli import options
from resstream.cli.flags import cli_message

if TYPE_CHECKING:
    from resstream.analysis.recency.measured import RecencyResult


@options.command
def recency(
    *,
    output: options.OutputArg,
    loading: options.ModelsArg,
    threshold: Annotated[float, typer.Option(help="Standard errors a step needs for a verdict.")] = 3.0,
    sample: Annotated[options.Sample, options.corpus_options(seq_len=64)],
) -> None:
    """Mean attention by query and key position (and distance), per layer and head, over a corpus,
    with its trend with key position (95% intervals over the sequences) and the strict verdict."""
    import resstream
    from resstream.io import write_json
    from resstream.reporting.attention import (
        LEGEND,
        distance_title,
        plot_attention_grid,
        plot_distance_profiles,
        recency_profiles,
        recency_rows,
        recency_title,
    )
    from resstream.reporting.figures import model_file_stems

    with options.analysis_outputs(output.out, "recency", loading.device) as outputs:
        report = resstream.recency(
            list(loading.models),
            threshold=threshold,
            **options.api_kwargs(sample, loading, output),
        )
        if outputs is None:  # another rank of a torchrun job: rank 0 writes
            return
        write_json(outputs / "recency.json", report.to_dict())
        write_head_arrays(outputs / "recency.npz", report.results)
        plot_attention_grid(
            recency_rows(report.results), outputs / "recency.png", title=recency_title(report.results)
        )
        stems = model_file_stems([result.model for result in report.results])
        for stem, result in zip(stems, report.results, strict=True):
            profiles, head_profiles = recency_profiles(result)
            plot_distance_profiles(
                profiles,
                outputs / f"distance_{stem}.png",
                head_profiles=head_profiles,
                title=distance_title(result),
            )
        settings = {
            "models": list(loading.models),
            **sample.record(seq_len=report.seq_len),
            "threshold": threshold,
        }
        options.write_run_record(
            outputs, "recency", settings, loading, sample.seed, report.dataset_fingerprint
        )
    for result in report.results:
        sequences = f"{result.num_sequences} sequence{'s' if result.num_sequences != 1 else ''}"
        typer.echo(f"{result.model} (heads averaged, {sequences}; {result.sample})")
        for line in recency_lines(result):
            typer.echo(f"  {line}")
    typer.echo(cli_message(LEGEND))
    typer.echo(
        f"wrote recency.json, recency.npz, recency.png, {', '.join(f'distance_{s}.png' for s in stems)} "
        f"and run.json to {output.out}"
    )


def recency_lines(result: RecencyResult) -> list[str]:
    """Per layer: the trend line and strict verdicts of the head average, then the heads' directions."""
    from resstream.reporting.attention import heads_line, layer_lines

    lines = []
    for layer in result.layers:
        lines.extend(layer_lines([layer.average]))
        lines.append(f"  {heads_line([head.trend for head in layer.heads])}")
    return lines


def write_head_arrays(path: Path, results: Sequence[RecencyResult]) -> None:
    """Per-head (L, H, T, T) means and standard errors of every model, suffixed by model index."""
    import numpy as np

    from resstream.io import write_npz

    arrays = {
        f"{name}_{index}": tensor.numpy()
        for index, result in enumerate(results)
        for name, tensor in result.head_arrays().items()
    }
    write_npz(path, models=np.array([r.model for r in results]), **arrays)


def register(app: typer.Typer) -> None:
    """Add `recency` to the app."""
    app.command("recency")(recency)
