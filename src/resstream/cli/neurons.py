"""`resstream neurons`: FFN neurons of one layer as key -> value memories."""

from __future__ import annotations

from typing import Annotated

import typer

from resstream.cli.common import (
    BatchSizeOption,
    DataDirOption,
    DatasetOption,
    DeviceMapOption,
    DeviceOption,
    DtypeOption,
    NumSeqsOption,
    OutOption,
    QuietOption,
    SampleSeedOption,
    TrustRemoteCodeOption,
    resolved_device,
    seq_len_option,
)

FILES = "neurons.json, neurons.csv, neurons.png, neurons.html and run.json"


def neurons(
    out: OutOption,
    layer: Annotated[int, typer.Option(help="The block (0-based) whose MLP neurons to read.")],
    model: Annotated[
        str | None,
        typer.Option(help="Run dir, HF directory or hub name (default: built-in reference model)."),
    ] = None,
    neuron: Annotated[
        list[int] | None, typer.Option("--neuron", help="A neuron index of the layer; repeat for several.")
    ] = None,
    top: Annotated[
        int | None, typer.Option(help="Instead of --neuron: the N neurons with the largest activation.")
    ] = None,
    dataset: DatasetOption = "shakespeare",
    num_seqs: NumSeqsOption = 64,
    seq_len: Annotated[int | None, seq_len_option(128)] = None,
    contexts: Annotated[int, typer.Option(help="Top activating contexts kept per neuron.")] = 10,
    value_tokens: Annotated[int, typer.Option(help="Promoted and suppressed tokens listed per neuron.")] = 10,
    window: Annotated[int, typer.Option(help="Tokens shown before the activating token.")] = 12,
    batch_size: BatchSizeOption = 8,
    seed: SampleSeedOption = 0,
    data_dir: DataDirOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    device_map: DeviceMapOption = None,
    trust_remote_code: TrustRemoteCodeOption = False,
    quiet: QuietOption = False,
) -> None:
    """FFN neurons as key -> value memories: the tokens a neuron's value vector promotes and
    suppresses, and the corpus contexts that switch it on most."""
    import resstream
    from resstream.io import run_record, write_json, write_text
    from resstream.reporting.neurons import neurons_csv, plot_neurons, summary_lines, write_html
    from resstream.rundir import output_set

    with output_set(out, "neurons") as outputs:
        result = resstream.neurons(
            model,
            layer=layer,
            neurons=neuron or None,
            top=top,
            dataset=dataset,
            num_seqs=num_seqs,
            seq_len=seq_len,
            contexts=contexts,
            value_tokens=value_tokens,
            window=window,
            batch_size=batch_size,
            seed=seed,
            data_dir=data_dir,
            dtype=dtype,
            device=device,
            device_map=device_map,
            trust_remote_code=trust_remote_code,
            progress=not quiet,
        )
        write_json(outputs / "neurons.json", result.to_dict())
        write_text(outputs / "neurons.csv", neurons_csv(result))
        plot_neurons(result, outputs / "neurons.png")
        write_html(result, outputs / "neurons.html")
        settings = {
            "command": "neurons",
            "model": model,
            "layer": layer,
            "neurons": [n.neuron for n in result.neurons],
            "top": top,
            "dataset": dataset,
            "num_seqs": num_seqs,
            "seq_len": seq_len,
            "contexts": contexts,
            "value_tokens": value_tokens,
            "window": window,
            "batch_size": batch_size,
            "dtype": dtype,
            "device_map": device_map,
            "data_dir": str(data_dir) if data_dir else None,
            "sample": result.sample,
        }
        outputs.write_record(
            run_record(
                settings,
                seed=seed,
                device=resolved_device(device, device_map),
                dataset_fingerprint=result.dataset_fingerprint,
            )
        )
    for line in summary_lines(result):
        typer.echo(line)
    typer.echo(f"wrote {FILES} to {out}")


def register(app: typer.Typer) -> None:
    """Add `neurons` to the app."""
    app.command("neurons")(neurons)
