"""`resstream recency`: measured positional attention of trained models, beside the simulation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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
from resstream.cli.flags import cli_message

if TYPE_CHECKING:
    from resstream.analysis.recency.measured import RecencyResult


def recency(
    out: OutOption,
    model: ModelsOption = None,
    dataset: DatasetOption = "shakespeare",
    num_seqs: NumSeqsOption = 64,
    seq_len: Annotated[int | None, seq_len_option(64)] = None,
    batch_size: BatchSizeOption = 8,
    threshold: Annotated[float, typer.Option(help="Standard errors a step needs for a verdict.")] = 3.0,
    seed: SampleSeedOption = 0,
    data_dir: DataDirOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    device_map: DeviceMapOption = None,
    trust_remote_code: TrustRemoteCodeOption = False,
    quiet: QuietOption = False,
) -> None:
    """Mean attention by query and key position (and distance), per layer and head, over a corpus,
    with its trend with key position (95% intervals over the sequences) and the strict verdict."""
    import resstream
    from resstream.io import run_record, write_json
    from resstream.reporting.attention import LEGEND, plot_attention_grid, plot_distance_profiles
    from resstream.reporting.figures import model_file_stems
    from resstream.rundir import output_set

    specs = list(model) if model else [None]
    with output_set(out, "recency") as outputs:
        report = resstream.recency(
            specs,
            dataset=dataset,
            num_seqs=num_seqs,
            seq_len=seq_len,
            batch_size=batch_size,
            seed=seed,
            threshold=threshold,
            data_dir=data_dir,
            dtype=dtype,
            device=device,
            device_map=device_map,
            trust_remote_code=trust_remote_code,
            progress=not quiet,
        )
        write_json(outputs / "recency.json", report.to_dict())
        write_head_arrays(outputs / "recency.npz", report.results)
        plot_attention_grid(
            [(r.model, r.mean_attention) for r in report.results],
            outputs / "recency.png",
            title=f"mean attention over {report.results[0].num_sequences} sequences of "
            f"{report.seq_len} tokens, heads averaged",
        )
        stems = model_file_stems([result.model for result in report.results])
        for stem, result in zip(stems, report.results, strict=True):
            plot_distance_profiles(
                [layer.by_distance for layer in result.layers],
                outputs / f"distance_{stem}.png",
                head_profiles=[layer.head_by_distance() for layer in result.layers],
                title=f"{result.model}: attention δ tokens back",
            )
        settings = {
            "command": "recency",
            "models": specs,
            "dataset": dataset,
            "num_seqs": num_seqs,
            "seq_len": report.seq_len,
            "batch_size": batch_size,
            "threshold": threshold,
            "dtype": dtype,
            "device_map": device_map,
            "data_dir": str(data_dir) if data_dir else None,
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
        sequences = f"{result.num_sequences} sequence{'s' if result.num_sequences != 1 else ''}"
        typer.echo(f"{result.model} (heads averaged, {sequences}; {result.sample})")
        for line in recency_lines(result):
            typer.echo(f"  {line}")
    typer.echo(cli_message(LEGEND))
    typer.echo(
        f"wrote recency.json, recency.npz, recency.png, {', '.join(f'distance_{s}.png' for s in stems)} "
        f"and run.json to {out}"
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
