"""`resstream shift`: where do hidden states switch from the input token to the next token?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from resstream.cli.common import check_out_dir, resolved_device


def shift(
    out: Annotated[Path, typer.Option("--out", help="Output directory (created if missing).")],
    model: Annotated[Optional[list[str]], typer.Option(
        "--model", help="Run dir, HF directory or hub name; repeat for several (default: built-in reference model).")] = None,
    dataset: Annotated[str, typer.Option(help="Named corpus, .txt/.jsonl path (.jsonl input_ids rows used as given).")] = "shakespeare",
    num_seqs: Annotated[int, typer.Option(help="Sequences sampled from the corpus.")] = 64,
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")] = 128,
    top_k: Annotated[int, typer.Option(help="k of the top-k match rates.")] = 5,
    decoder: Annotated[str, typer.Option(help="logit-lens or embedding.")] = "logit-lens",
    batch_size: Annotated[int, typer.Option(help="Sequences per forward pass.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed of the sequence sample.")] = 0,
    data_dir: Annotated[Optional[Path], typer.Option(help="Local corpora (else env RESSTREAM_DATA).")] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
    device_map: Annotated[Optional[str], typer.Option(
        help="Spread a Hugging Face model over devices: auto, balanced, sequential (needs accelerate).")] = None,
    trust_remote_code: Annotated[bool, typer.Option(
        "--trust-remote-code", help="Run a hub model's own code (only for repositories you trust).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars.")] = False,
) -> None:
    """Per layer: top-k match with the input and the next token, cosines, projection, shift depth."""
    from resstream import api
    from resstream.io import run_record, write_json, write_text
    from resstream.reporting.shift import (
        plot_comparison,
        plot_match_rates,
        plot_shift_depths,
        plot_similarity,
        shift_csv,
    )

    check_out_dir(out)
    specs = list(model) if model else [None]
    report = api.shift(specs, dataset=dataset, num_seqs=num_seqs, seq_len=seq_len, top_k=top_k, decoder=decoder,
                       batch_size=batch_size, seed=seed, data_dir=data_dir, dtype=dtype, device=device,
                       device_map=device_map, trust_remote_code=trust_remote_code, progress=not quiet)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "shift.json", report.to_dict())
    write_text(out / "shift.csv", shift_csv(report.results))
    for index, result in enumerate(report.results):
        suffix = "" if len(report.results) == 1 else f"_{index}"
        plot_match_rates(result, out / f"match_rates{suffix}.png")
        plot_similarity(result, out / f"similarity{suffix}.png")
        plot_shift_depths(result, out / f"shift_depths{suffix}.png")
    if len(report.results) > 1:
        plot_comparison(report.results, out / "comparison.png")
    settings = {"command": "shift", "models": specs, "dataset": dataset, "num_seqs": num_seqs, "seq_len": seq_len,
                "top_k": top_k, "decoder": decoder, "batch_size": batch_size, "dtype": dtype, "device_map": device_map,
                "data_dir": str(data_dir) if data_dir else None, "sample": report.sample_rule}
    write_json(out / "run.json", run_record(settings, seed=seed, device=resolved_device(device, device_map),
                                            dataset_fingerprint=report.dataset_fingerprint))
    for result in report.results:
        where = f"{result.shift_layer:.2f}" if result.shift_layer is not None else "never"
        typer.echo(f"{result.model}: shift layer {where} of {result.num_layers} "
                   f"({result.num_tokens:,} positions, {report.sample_rule})")
        if result.tied is False and decoder == "logit-lens":
            typer.echo(f"  {result.model} is untied: decoded with {result.decoding}")
    typer.echo(f"wrote shift.json, shift.csv, plots and run.json to {out}")


def register(app: typer.Typer) -> None:
    """Add `shift` to the app."""
    app.command("shift")(shift)
