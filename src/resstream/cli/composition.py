"""`resstream composition`: Q-, K- and V-composition scores of every pair of heads."""

from __future__ import annotations

from typing import Annotated

import typer

from resstream.cli.common import (
    DeviceMapOption,
    DeviceOption,
    DtypeOption,
    OutOption,
    QuietOption,
    TrustRemoteCodeOption,
    resolved_device,
)

#: The files one run writes (besides run.json).
FILES = ("composition.json", "composition.csv", "composition_q.png", "composition_k.png", "composition_v.png")


def composition(
    out: OutOption,
    model: Annotated[
        str | None,
        typer.Option(help="Run dir, HF directory or hub name (default: built-in reference model)."),
    ] = None,
    top: Annotated[
        int, typer.Option(help="Strongest pairs printed and listed in composition.json, per kind.")
    ] = 10,
    samples: Annotated[int, typer.Option(help="Random draws behind the baseline.")] = 256,
    seed: Annotated[int, typer.Option(help="Seed of the baseline's random draws.")] = 0,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    device_map: DeviceMapOption = None,
    trust_remote_code: TrustRemoteCodeOption = False,
    quiet: QuietOption = False,
) -> None:
    """How much each later head's query, key and value read what earlier heads write (from the weights)."""
    import resstream
    from resstream.analysis.circuits.composition import KINDS, check_top
    from resstream.io import run_record, write_json, write_text
    from resstream.reporting.composition import composition_csv, plot_composition, top_lines
    from resstream.rundir import output_set

    check_top(top)
    with output_set(out, "composition") as outputs:
        result = resstream.composition(
            model,
            samples=samples,
            seed=seed,
            dtype=dtype,
            device=device,
            device_map=device_map,
            trust_remote_code=trust_remote_code,
            progress=not quiet,
        )
        write_json(outputs / "composition.json", result.to_dict(top=top))
        write_text(outputs / "composition.csv", composition_csv(result))
        for kind in KINDS:
            plot_composition(result, kind, outputs / f"composition_{kind}.png")
        settings = {
            "command": "composition",
            "model": model,
            "top": top,
            "samples": samples,
            "dtype": dtype,
            "device_map": device_map,
        }
        device_used = resolved_device(device, device_map)
        outputs.write_record(run_record(settings, seed=seed, device=device_used, dataset_fingerprint=None))
    for line in top_lines(result, top):
        typer.echo(line)
    typer.echo(f"wrote {', '.join(FILES)} and run.json to {out}")


def register(app: typer.Typer) -> None:
    """Add `composition` to the app."""
    app.command("composition")(composition)
