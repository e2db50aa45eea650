"""`resstream recency`: measured positional attention of trained models, beside the simulation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from resstream.cli.common import check_out_dir, resolved_device


def recency(
    out: Annotated[Path, typer.Option("--out", help="Output directory (created if missing).")],
    model: Annotated[Optional[list[str]], typer.Option(
        "--model", help="Run dir, HF directory or hub name; repeat for several (default: built-in reference model).")] = None,
    dataset: Annotated[str, typer.Option(help="Named corpus, .txt/.jsonl path (.jsonl input_ids rows used as given).")] = "shakespeare",
    num_seqs: Annotated[int, typer.Option(help="Sequences sampled from the corpus.")] = 64,
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")] = 64,
    batch_size: Annotated[int, typer.Option(help="Sequences per forward pass.")] = 8,
    threshold: Annotated[float, typer.Option(help="Standard errors a step needs for a verdict.")] = 3.0,
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
    """Mean attention by query and key position (and distance), per layer and head, over a corpus."""
    from resstream import api
    from resstream.cli.simulate import verdict_lines
    from resstream.io import run_record, write_json
    from resstream.reporting.attention import plot_attention_grid, plot_distance_profiles

    check_out_dir(out)
    specs = list(model) if model else [None]
    report = api.recency(specs, dataset=dataset, num_seqs=num_seqs, seq_len=seq_len, batch_size=batch_size,
                         seed=seed, threshold=threshold, data_dir=data_dir, dtype=dtype, device=device,
                         device_map=device_map, trust_remote_code=trust_remote_code, progress=not quiet)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "recency.json", report.to_dict())
    write_head_arrays(out / "recency.npz", report.results)
    plot_attention_grid([(r.model, r.mean_attention) for r in report.results], out / "recency.png",
                        title=f"mean attention over {report.results[0].num_sequences} sequences of "
                              f"{report.seq_len} tokens, heads averaged (query ↓, key →)")
    for index, result in enumerate(report.results):
        suffix = "" if len(report.results) == 1 else f"_{index}"
        plot_distance_profiles([layer.by_distance for layer in result.layers], out / f"distance{suffix}.png",
                               head_profiles=[layer.head_by_distance() for layer in result.layers],
                               title=f"{result.model}: attention δ tokens back (blue: heads averaged, grey: heads)")
    settings = {"command": "recency", "models": specs, "dataset": dataset, "num_seqs": num_seqs,
                "seq_len": seq_len, "batch_size": batch_size, "threshold": threshold, "dtype": dtype,
                "device_map": device_map, "data_dir": str(data_dir) if data_dir else None}
    write_json(out / "run.json", run_record(settings, seed=seed, device=resolved_device(device, device_map),
                                            dataset_fingerprint=report.dataset_fingerprint))
    for result in report.results:
        typer.echo(f"{result.model} (heads averaged, {result.num_sequences} sequences; {result.sample})")
        for line in verdict_lines([layer.average for layer in result.layers]):
            typer.echo(f"  {line}")
    typer.echo(f"wrote recency.json, recency.npz, recency.png, distance plots and run.json to {out}")


def write_head_arrays(path: Path, results: tuple) -> None:
    """Per-head (L, H, T, T) means and standard errors of every model, written atomically."""
    import numpy as np

    from resstream.io import atomic_path

    arrays = {}
    for index, result in enumerate(results):
        for name, tensor in result.head_arrays().items():
            arrays[f"{name}_{index}"] = tensor.numpy()
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, models=np.array([r.model for r in results]), **arrays)


def register(app: typer.Typer) -> None:
    """Add `recency` to the app."""
    app.command("recency")(recency)
