"""`resstream shift`: where do hidden states switch from the input token to the next token?"""

from __future__ import annotations

from typing import Annotated

import typer

from resstream.checks import decoder_kind
from resstream.cli import options


@options.command
def shift(
    *,
    output: options.OutputArg,
    loading: options.ModelsArg,
    top_k: Annotated[int, typer.Option(help="k of the top-k match rates.")] = 5,
    decoder: Annotated[
        list[str] | None,
        typer.Option(
            help="logit-lens, embedding or tuned:DIR (a lens from `resstream tune-lens`); repeat it "
            "to compare decoders on the same states.  \\[default: logit-lens]"
        ),
    ] = None,
    sample: Annotated[options.Sample, options.corpus_options(seq_len=128)],
) -> None:
    """Per layer: top-k match with the input and the next token, cosines, projection, shift depth."""
    decoders = list(decoder) if decoder else ["logit-lens"]
    for spec in decoders:  # refused before the imports below
        decoder_kind(spec)
    import resstream
    from resstream.io import write_json, write_text
    from resstream.reporting.figures import model_file_stems
    from resstream.reporting.shift import (
        decoder_groups,
        plot_comparison,
        plot_decoders,
        plot_match_rates,
        plot_shift_depths,
        plot_similarity,
        result_label,
        shift_csv,
    )

    several = len(decoders) > 1
    with options.analysis_outputs(output.out, "shift", loading.device) as outputs:
        report = resstream.shift(
            list(loading.models),
            top_k=top_k,
            decoder=decoders,
            **options.api_kwargs(sample, loading, output),
        )
        if outputs is None:  # another rank of a torchrun job: rank 0 writes
            return
        write_json(outputs / "shift.json", report.to_dict())
        write_text(outputs / "shift.csv", shift_csv(report.results))
        labels = [result_label(r, several) for r in report.results]
        for result, stem in zip(report.results, model_file_stems(labels), strict=True):
            plot_match_rates(result, outputs / f"match_rates_{stem}.png")
            plot_similarity(result, outputs / f"similarity_{stem}.png")
            plot_shift_depths(result, outputs / f"shift_depths_{stem}.png")
        if len(report.results) > 1:
            plot_comparison(report.results, outputs / "comparison.png")
        per_model = decoder_groups(report.results)
        for group, stem in zip(per_model, model_file_stems([g[0].model for g in per_model]), strict=True):
            plot_decoders(group, outputs / f"decoders_{stem}.png")
        settings = {
            "models": list(loading.models),
            **sample.record(seq_len=report.seq_len),
            "top_k": top_k,
            "decoder": decoders if several else decoders[0],
            "sample": report.sample_rule,
        }
        options.write_run_record(outputs, "shift", settings, loading, sample.seed, report.dataset_fingerprint)
    for result in report.results:
        typer.echo(
            f"{result_label(result, several)}: {result.shift_text} "
            f"({result.num_tokens:,} positions, {result.sample})"
        )
        if result.tied is False and result.decoder != "embedding":
            typer.echo(f"  {result.model} is untied: decoded with {result.decoding}")
    typer.echo(f"wrote shift.json, shift.csv, plots and run.json to {output.out}")


def register(app: typer.Typer) -> None:
    """Add `shift` to the app."""
    app.command("shift")(shift)
