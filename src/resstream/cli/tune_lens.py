"""`resstream tune-lens`: train a tuned lens for a model, or evaluate one (`--eval`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from resstream.cli.common import (
    BatchSizeOption,
    DataDirOption,
    DeviceOption,
    DtypeOption,
    OutOption,
    QuietOption,
    TrustRemoteCodeOption,
    resolved_device,
    seq_len_option,
)

if TYPE_CHECKING:
    from resstream.analysis.decoding.lens_training import LensEvaluation

#: The API's defaults (`resstream.api.tune_lens`; a test checks they agree).
DEFAULT_STEPS = 250
DEFAULT_TOKENS = DEFAULT_STEPS * 2 * 8 * 128
DEFAULT_EVAL_SEQS = 32


def tune_lens(
    out: OutOption,
    model: Annotated[
        str | None,
        typer.Option(help="Run dir, HF directory or hub name (default: built-in reference model)."),
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option(
            help="Corpus name or path (default: shakespeare; with --eval: the lens's training corpus)."
        ),
    ] = None,
    tokens: Annotated[
        int, typer.Option(help="Training tokens in all (spread over the steps).")
    ] = DEFAULT_TOKENS,
    steps: Annotated[
        int, typer.Option(help="Optimiser steps (SGD, Nesterov momentum, linear decay).")
    ] = DEFAULT_STEPS,
    seq_len: Annotated[int | None, seq_len_option(128)] = None,
    eval_seqs: Annotated[
        int | None,
        typer.Option(
            help="Held-out sequences for the evaluation \\[default: 32; with --eval: all the lens held out]."
        ),
    ] = None,
    lr: Annotated[
        float, typer.Option(help="Peak learning rate (SGD; the tuned-lens recipe's 1.0 × (1 − 0.9)).")
    ] = 0.1,
    batch_size: BatchSizeOption = 8,
    seed: Annotated[
        int | None,
        typer.Option(help="Seed of the window sample and split \\[default: 0; with --eval: the lens's own]."),
    ] = None,
    evaluate: Annotated[
        bool, typer.Option("--eval", help="Evaluate the lens already in --out instead of training one.")
    ] = False,
    data_dir: DataDirOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    trust_remote_code: TrustRemoteCodeOption = False,
    quiet: QuietOption = False,
) -> None:
    """Train one affine translator per layer (a tuned lens) and compare it with the logit lens."""
    import resstream
    from resstream.analysis.decoding.lens_training import LensOptimiser
    from resstream.analysis.decoding.tuned_lens import load_lens
    from resstream.io import run_record, write_json, write_text
    from resstream.reporting.tuned_lens import evaluation_csv, plot_bits_per_layer, plot_training
    from resstream.rundir import output_set

    if evaluate:
        lens = load_lens(out)
    with output_set(out, "tune-lens") as outputs:
        if evaluate:
            evaluation = resstream.evaluate_lens(
                lens,
                model,
                dataset=dataset,
                eval_seqs=eval_seqs,
                seq_len=seq_len,
                batch_size=batch_size,
                seed=seed,
                data_dir=data_dir,
                dtype=dtype,
                device=device,
                trust_remote_code=trust_remote_code,
                progress=not quiet,
            )
            settings = {"mode": "eval"}
        else:
            report = resstream.tune_lens(
                model,
                dataset=dataset or "shakespeare",
                tokens=tokens,
                steps=steps,
                seq_len=seq_len,
                batch_size=batch_size,
                eval_seqs=DEFAULT_EVAL_SEQS if eval_seqs is None else eval_seqs,
                optimiser=LensOptimiser(lr=lr),
                seed=0 if seed is None else seed,
                data_dir=data_dir,
                dtype=dtype,
                device=device,
                trust_remote_code=trust_remote_code,
                progress=not quiet,
            )
            lens, evaluation = report.lens, report.evaluation
            settings = {"mode": "train", "tokens": tokens, "steps": steps, "lr": lr}
        lens.save(outputs.staging)
        write_json(outputs / "evaluation.json", evaluation.to_dict())
        write_text(outputs / "evaluation.csv", evaluation_csv(evaluation))
        plot_bits_per_layer(evaluation, outputs / "bits_per_layer.png")
        history = lens.record.get("kl_bits_per_step") or []
        if history:
            plot_training(history, lens.model, outputs / "training.png")
        settings = {
            "command": "tune-lens",
            **settings,
            "model": model,
            "dataset": evaluation.dataset,
            "seq_len": evaluation.seq_len,
            "eval_seqs": evaluation.num_sequences,
            "batch_size": batch_size,
            "dtype": dtype,
            "data_dir": str(data_dir) if data_dir else None,
        }
        record = run_record(
            settings,
            seed=evaluation.seed,
            device=resolved_device(device),
            dataset_fingerprint=evaluation.dataset_fingerprint,
        )
        outputs.write_record(record)
    for line in summary_lines(evaluation):
        typer.echo(line)
    typer.echo(
        f"wrote the lens (translators.safetensors, lens.json), evaluation.json/.csv and plots to {out}"
    )


def summary_lines(evaluation: LensEvaluation) -> list[str]:
    """Per layer, held-out KL to the final distribution of both lenses (bits)."""
    lines = [f"{evaluation.model}: KL(final ‖ lens) on {evaluation.num_tokens:,} held-out positions, bits"]
    lines.append("layer  logit lens  tuned lens")
    for i, layer in enumerate(evaluation.layers[:-1]):
        lines.append(f"{layer:>5}  {evaluation.logit_kl[i]:>10.3f}  {evaluation.tuned_kl[i]:>10.3f}")
    return lines


def register(app: typer.Typer) -> None:
    """Add `tune-lens` to the app."""
    app.command("tune-lens")(tune_lens)
