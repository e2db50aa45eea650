"""`resstream tune-lens`: train a tuned lens for a model, or evaluate one (`--eval`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from resstream.cli import options

if TYPE_CHECKING:
    from resstream.analysis.decoding.lens_training import LensEvaluation

#: The API's defaults (`resstream.api.tune_lens`; a test checks they agree).
DEFAULT_STEPS = 250
DEFAULT_TOKENS = DEFAULT_STEPS * 2 * 8 * 128
DEFAULT_EVAL_SEQS = 32


#: The corpus options' help where tune-lens reads them differently from the analyses.
CORPUS_HELP = {
    "dataset": "Corpus name or path (default: shakespeare; with --eval: the lens's training corpus).",
    "seed": "Seed of the window sample and split \\[default: 0; with --eval: the lens's own].",
}


@options.command
def tune_lens(
    *,
    output: options.OutputArg,
    loading: Annotated[options.Loading, options.model_options(device_map=False)],
    evaluate: Annotated[
        bool, typer.Option("--eval", help="Evaluate the lens already in --out instead of training one.")
    ] = False,
    tokens: Annotated[
        int, typer.Option(help="Training tokens in all (spread over the steps).")
    ] = DEFAULT_TOKENS,
    steps: Annotated[
        int, typer.Option(help="Optimiser steps (SGD, Nesterov momentum, linear decay).")
    ] = DEFAULT_STEPS,
    eval_seqs: Annotated[
        int | None,
        typer.Option(
            help="Held-out sequences for the evaluation \\[default: 32; with --eval: all the lens held out]."
        ),
    ] = None,
    lr: Annotated[
        float, typer.Option(help="Peak learning rate (SGD; the tuned-lens recipe's 1.0 × (1 − 0.9)).")
    ] = 0.1,
    sample: Annotated[
        options.Sample,
        options.corpus_options(dataset=None, seed=None, help=CORPUS_HELP, without=("num_seqs",)),
    ],
) -> None:
    """Train one affine translator per layer (a tuned lens) and compare it with the logit lens."""
    import resstream
    from resstream.analysis.decoding.lens_training import LensOptimiser
    from resstream.analysis.decoding.tuned_lens import load_lens
    from resstream.io import write_json, write_text
    from resstream.reporting.tuned_lens import evaluation_csv, plot_bits_per_layer, plot_training
    from resstream.rundir import output_set

    loads = {**loading.api_kwargs(), "progress": output.progress}
    batch_size = _batch_size(sample)
    settings: dict[str, Any]
    if evaluate:
        lens = load_lens(output.out)
    with output_set(output.out, "tune-lens") as outputs:
        if evaluate:
            evaluation = resstream.evaluate_lens(
                lens,
                loading.model,
                dataset=sample.dataset,
                eval_seqs=eval_seqs,
                seq_len=sample.seq_len,
                batch_size=batch_size,
                seed=sample.seed,
                data_dir=sample.data_dir,
                **loads,
            )
            settings = {"mode": "eval"}
        else:
            report = resstream.tune_lens(
                loading.model,
                dataset=sample.dataset or "shakespeare",
                tokens=tokens,
                steps=steps,
                seq_len=sample.seq_len,
                batch_size=batch_size,
                eval_seqs=DEFAULT_EVAL_SEQS if eval_seqs is None else eval_seqs,
                optimiser=LensOptimiser(lr=lr),
                seed=0 if sample.seed is None else sample.seed,
                data_dir=sample.data_dir,
                **loads,
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
            **settings,
            "model": loading.model,
            "dataset": evaluation.dataset,
            "seq_len": evaluation.seq_len,
            "eval_seqs": evaluation.num_sequences,
            "batch_size": batch_size,
            "data_dir": str(sample.data_dir) if sample.data_dir else None,
        }
        options.write_run_record(
            outputs, "tune-lens", settings, loading, evaluation.seed, evaluation.dataset_fingerprint
        )
    for line in summary_lines(evaluation):
        typer.echo(line)
    typer.echo(
        f"wrote the lens (translators.safetensors, lens.json), evaluation.json/.csv and plots to {output.out}"
    )


def _batch_size(sample: options.Sample) -> int:
    """--batch-size, which tune-lens declares with a default (8), so it is never None."""
    if sample.batch_size is None:
        raise AssertionError("tune-lens declares --batch-size with a default")
    return sample.batch_size


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
