"""`resstream shift`: where do hidden states switch from the input token to the next token?"""

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
    ModelsOption,
    NumSeqsOption,
    OutOption,
    QuietOption,
    SampleSeedOption,
    TrustRemoteCodeOption,
    resolved_device,
    seq_len_option,
)


def shift(
    out: OutOption,
    model: ModelsOption = None,
    dataset: DatasetOption = "shakespeare",
    num_seqs: NumSeqsOption = 64,
    seq_len: Annotated[int | None, seq_len_option(128)] = None,
    top_k: Annotated[int, typer.Option(help="k of the top-k match rates.")] = 5,
    decoder: Annotated[
        list[str] | None,
        typer.Option(
            help="logit-lens, embedding or tuned:DIR (a lens from `resstream tune-lens`); repeat it "
            "to compare decoders on the same states.  [default: logit-lens]"
        ),
    ] = None,
    batch_size: BatchSizeOption = 8,
    seed: SampleSeedOption = 0,
    data_dir: DataDirOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    device_map: DeviceMapOption = None,
    trust_remote_code: TrustRemoteCodeOption = False,
    quiet: QuietOption = False,
) -> None:
    """Per layer: top-k match with the input and the next token, cosines, projection, shift depth."""
    import resstream
    from resstream.io import run_record, write_json, write_text
    from resstream.reporting.figures import model_file_stems
    from resstream.reporting.shift import (
        plot_comparison,
        plot_decoders,
        plot_match_rates,
        plot_shift_depths,
        plot_similarity,
        result_label,
        shift_csv,
    )
    from resstream.rundir import output_set

    specs = list(model) if model else [None]
    decoders = list(decoder) if decoder else ["logit-lens"]
    several = len(decoders) > 1
    with output_set(out, "shift") as outputs:
        report = resstream.shift(
            specs,
            dataset=dataset,
            num_seqs=num_seqs,
            seq_len=seq_len,
            top_k=top_k,
            decoder=decoders,
            batch_size=batch_size,
            seed=seed,
            data_dir=data_dir,
            dtype=dtype,
            device=device,
            device_map=device_map,
            trust_remote_code=trust_remote_code,
            progress=not quiet,
        )
        write_json(outputs / "shift.json", report.to_dict())
        write_text(outputs / "shift.csv", shift_csv(report.results))
        labels = [result_label(r, several) for r in report.results]
        for result, stem in zip(report.results, model_file_stems(labels), strict=True):
            plot_match_rates(result, outputs / f"match_rates_{stem}.png")
            plot_similarity(result, outputs / f"similarity_{stem}.png")
            plot_shift_depths(result, outputs / f"shift_depths_{stem}.png")
        if len(report.results) > 1:
            plot_comparison(report.results, outputs / "comparison.png")
        if several:
            per_model = [
                report.results[i : i + len(decoders)] for i in range(0, len(report.results), len(decoders))
            ]
            for group, stem in zip(per_model, model_file_stems([g[0].model for g in per_model]), strict=True):
                plot_decoders(group, outputs / f"decoders_{stem}.png")
        settings = {
            "command": "shift",
            "models": specs,
            "dataset": dataset,
            "num_seqs": num_seqs,
            "seq_len": report.seq_len,
            "top_k": top_k,
            "decoder": decoders if several else decoders[0],
            "batch_size": batch_size,
            "dtype": dtype,
            "device_map": device_map,
            "data_dir": str(data_dir) if data_dir else None,
            "sample": report.sample_rule,
        }
        outputs.write_record(
            run_record(
                settings,
                seed=seed,
                device=resolved_device(device, device_map),
                dataset_fingerprint=report.dataset_fingerprint,
            )
        )
    for result in report.results:
        where = f"{result.shift_layer:.2f}" if result.shift_layer is not None else "never"
        typer.echo(
            f"{result_label(result, several)}: shift layer {where} of {result.num_layers} "
            f"({result.num_tokens:,} positions, {result.sample})"
        )
        if result.tied is False and result.decoder != "embedding":
            typer.echo(f"  {result.model} is untied: decoded with {result.decoding}")
    typer.echo(f"wrote shift.json, shift.csv, plots and run.json to {out}")


def register(app: typer.Typer) -> None:
    """Add `shift` to the app."""
    app.command("shift")(shift)
