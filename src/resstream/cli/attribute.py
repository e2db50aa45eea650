"""`resstream attribute`: who wrote a predicted token into the residual stream."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from resstream.cli.common import (
    DataDirOption,
    DeviceOption,
    DtypeOption,
    OutOption,
    QuietOption,
    SampleSeedOption,
    TrustRemoteCodeOption,
    resolved_device,
)


def attribute(
    out: OutOption,
    model: Annotated[
        str | None,
        typer.Option(help="Run dir, HF directory or hub name (default: built-in reference model)."),
    ] = None,
    text: Annotated[str | None, typer.Option(help="The text whose prediction is attributed.")] = None,
    text_file: Annotated[Path | None, typer.Option(help="A UTF-8 file holding the text.")] = None,
    position: Annotated[
        int | None,
        typer.Option(help="Token position to attribute (default: the last; negative: from the end)."),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(help="Target token as text, one token (default: the model's top prediction)."),
    ] = None,
    target_id: Annotated[int | None, typer.Option(help="Target token id (instead of --target).")] = None,
    foil: Annotated[
        str | None, typer.Option(help="A second token: attribute the target − foil logit difference.")
    ] = None,
    top: Annotated[
        int, typer.Option(help="Sources, neurons and query shares listed (the largest |score| first).")
    ] = 20,
    no_sources: Annotated[
        bool, typer.Option("--no-sources", help="Skip splitting heads into source positions.")
    ] = False,
    no_neurons: Annotated[bool, typer.Option("--no-neurons", help="Skip the per-neuron scores.")] = False,
    decoder: Annotated[
        str,
        typer.Option(
            help="logit-lens (every score), or tuned:DIR to add the target's trajectory through a tuned lens."
        ),
    ] = "logit-lens",
    dataset: Annotated[
        str | None,
        typer.Option(help="Corpus mode: a named corpus or .txt/.jsonl path; every next token is a target."),
    ] = None,
    num_seqs: Annotated[
        int | None, typer.Option(help="Corpus mode: sequences sampled \\[default: 16].")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option(help="Corpus mode: tokens per sequence \\[default: 64].")
    ] = None,
    candidates: Annotated[
        int | None,
        typer.Option(
            help="Corpus mode: neurons (largest first-order estimate) scored exactly \\[default: 64]."
        ),
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Corpus mode: sequences per forward pass \\[default: 8].")
    ] = None,
    seed: SampleSeedOption = 0,
    data_dir: DataDirOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    trust_remote_code: TrustRemoteCodeOption = False,
    quiet: QuietOption = False,
) -> None:
    """Attribute a prediction to layers, heads, attention sources and FFN neurons.

    With --dataset: every next token of a corpus sample, averaged over sequences.
    """
    import resstream
    from resstream.io import run_record, write_json
    from resstream.reporting.attribute import terminal_summary, write_attribute_report
    from resstream.rundir import output_set

    with output_set(out, "attribute") as outputs:
        result = resstream.attribute(
            text,
            text_file=text_file,
            model=model,
            position=position,
            target=target,
            target_id=target_id,
            foil=foil,
            top=top,
            sources=False if no_sources else None,
            neurons=not no_neurons,
            decoder=decoder,
            dataset=dataset,
            num_seqs=num_seqs,
            seq_len=seq_len,
            seed=seed,
            candidates=candidates,
            batch_size=batch_size,
            data_dir=data_dir,
            dtype=dtype,
            device=device,
            trust_remote_code=trust_remote_code,
            progress=not quiet,
        )
        write_json(outputs / "attribute.json", result.to_dict())
        written = write_attribute_report(result, outputs.staging)
        settings = {
            "command": "attribute",
            "model": model,
            "text_file": str(text_file) if text_file else None,
            "position": position,
            "target": target,
            "target_id": target_id,
            "foil": foil,
            "top": top,
            "sources": None if dataset else not no_sources,
            "neurons": not no_neurons,
            "decoder": decoder,
            "dataset": dataset,
            "num_seqs": result.num_seqs if dataset else None,
            "seq_len": result.seq_len if dataset else None,
            "candidates": candidates,
            "batch_size": batch_size,
            "dtype": dtype,
        }
        device_used = resolved_device(device, None)
        fingerprint = getattr(result, "dataset_fingerprint", None)
        record = run_record(
            settings, seed=seed if dataset else None, device=device_used, dataset_fingerprint=fingerprint
        )
        outputs.write_record(record)
    for line in terminal_summary(result):
        typer.echo(line)
    names = ", ".join(sorted(p.name for p in written))
    typer.echo(f"wrote attribute.json, {names} and run.json to {out}")


def register(app: typer.Typer) -> None:
    """Add `attribute` to the app."""
    app.command("attribute")(attribute)
