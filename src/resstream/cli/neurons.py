"""`resstream neurons`: FFN neurons of one layer as key -> value memories."""

from __future__ import annotations

from typing import Annotated

import typer

from resstream.cli import options

FILES = "neurons.json, neurons.csv, neurons.png, neurons.html and run.json"


@options.command
def neurons(
    *,
    output: options.OutputArg,
    layer: Annotated[int, typer.Option(help="The block (0-based) whose MLP neurons to read.")],
    loading: options.ModelArg,
    neuron: Annotated[
        list[int] | None, typer.Option("--neuron", help="A neuron index of the layer; repeat for several.")
    ] = None,
    top: Annotated[
        int | None, typer.Option(help="Instead of --neuron: the N neurons with the largest activation.")
    ] = None,
    contexts: Annotated[int, typer.Option(help="Top activating contexts kept per neuron.")] = 10,
    value_tokens: Annotated[int, typer.Option(help="Promoted and suppressed tokens listed per neuron.")] = 10,
    window: Annotated[int, typer.Option(help="Tokens shown before the activating token.")] = 12,
    sample: Annotated[options.Sample, options.corpus_options(seq_len=128)],
) -> None:
    """FFN neurons as key -> value memories: the tokens a neuron's value vector promotes and
    suppresses, and the corpus contexts that switch it on most."""
    import resstream
    from resstream.io import write_json, write_text
    from resstream.reporting.neurons import neurons_csv, plot_neurons, summary_lines, write_html

    with options.analysis_outputs(output.out, "neurons", loading.device) as outputs:
        result = resstream.neurons(
            loading.model,
            layer=layer,
            neurons=neuron or None,
            top=top,
            contexts=contexts,
            value_tokens=value_tokens,
            window=window,
            **options.api_kwargs(sample, loading, output),
        )
        if outputs is None:  # another rank of a torchrun job: rank 0 writes
            return
        write_json(outputs / "neurons.json", result.to_dict())
        write_text(outputs / "neurons.csv", neurons_csv(result))
        plot_neurons(result, outputs / "neurons.png")
        write_html(result, outputs / "neurons.html")
        settings = {
            "model": loading.model,
            "layer": layer,
            "neurons": [n.neuron for n in result.neurons],
            "top": top,
            **sample.record(seq_len=sample.seq_len),
            "contexts": contexts,
            "value_tokens": value_tokens,
            "window": window,
            "sample": result.sample,
        }
        options.write_run_record(
            outputs, "neurons", settings, loading, sample.seed, result.dataset_fingerprint
        )
    for line in summary_lines(result):
        typer.echo(line)
    typer.echo(f"wrote {FILES} to {output.out}")


def register(app: typer.Typer) -> None:
    """Add `neurons` to the app."""
    app.command("neurons")(neurons)
