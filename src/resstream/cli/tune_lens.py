"""`resstream tune-lens`: train a tuned lens for a model, evaluate one (`--eval`), or write one
in the tuned-lens package's layout (`--export tuned-lens DIR`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from resstream.api.lens_recipe import (
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_EVAL_SEQS,
    DEFAULT_STEPS,
    DEFAULT_TOKENS,
    DEFAULT_TOKENS_PER_STEP,
)
from resstream.checks import check_learning_rate, check_positive
from resstream.cli import options

if TYPE_CHECKING:
    from resstream.analysis.decoding.lens_training import LensEvaluation
    from resstream.analysis.decoding.tuned_lens import TunedLens
    from resstream.rundir import OutputSet

#: The layouts `--export` writes.
EXPORT_FORMATS = ("tuned-lens",)
#: A count option refused below 1 before anything heavy is imported.
POSITIVE = options.Checked(check_positive)


#: The corpus options' help where tune-lens reads them differently from the analyses.
CORPUS_HELP = {
    "dataset": "Corpus name or path (default: shakespeare; with --eval: the lens's training corpus).",
    "seed": "Seed of the window sample and split \\[default: 0; with --eval: the lens's own].",
}


@options.command
def tune_lens(
    *,
    output: options.OutputArg,
    loading: options.ModelArg,
    evaluate: Annotated[
        bool, typer.Option("--eval", help="Evaluate the lens already in --out instead of training one.")
    ] = False,
    tokens: Annotated[
        int | None,
        typer.Option(
            help="Training tokens in all, spread over the steps "
            f"\\[default: {DEFAULT_TOKENS_PER_STEP:,} a step, {DEFAULT_TOKENS:,} in {DEFAULT_STEPS} steps]."
        ),
        POSITIVE,
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            help=f"Optimiser steps (SGD, Nesterov momentum, linear decay) \\[default: {DEFAULT_STEPS}]; "
            f"alone, each keeps the default {DEFAULT_TOKENS_PER_STEP:,} tokens, so fewer steps train less."
        ),
        POSITIVE,
    ] = None,
    eval_seqs: Annotated[
        int | None,
        typer.Option(
            help="Held-out sequences for the evaluation \\[default: 32; with --eval: all the lens held out]."
        ),
        POSITIVE,
    ] = None,
    lr: Annotated[
        float,
        typer.Option(help="Peak learning rate (SGD; the tuned-lens recipe's 1.0 × (1 − 0.9))."),
        options.Checked(check_learning_rate),
    ] = 0.1,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the interrupted run in --out from its checkpoint (give the same settings).",
        ),
    ] = False,
    checkpoint_every: Annotated[
        int,
        typer.Option(
            help="Save a checkpoint in --out every N steps (also after the last, and on Ctrl-C); "
            "removed once the lens is written."
        ),
        POSITIVE,
    ] = DEFAULT_CHECKPOINT_EVERY,
    sample: Annotated[
        options.Sample,
        options.corpus_options(dataset=None, seed=None, help=CORPUS_HELP, without=("num_seqs",)),
    ],
    export: Annotated[
        tuple[str, Path] | None,
        typer.Option(
            "--export",
            metavar="FORMAT DIR",
            help="Write the lens already in --out to DIR in another layout instead of training one: "
            "tuned-lens (the tuned-lens package's config.json + params.pt).",
        ),
    ] = None,
) -> None:
    """Train one affine translator per layer (a tuned lens) and compare it with the logit lens."""
    import resstream
    from resstream.analysis.decoding.lens_checkpoint import remove_checkpoint
    from resstream.analysis.decoding.lens_training import LensOptimiser
    from resstream.analysis.decoding.tuned_lens import load_lens
    from resstream.distributed import joined, one_outcome, writer_lock
    from resstream.errors import UsageError

    if export is not None:
        if evaluate or resume:
            raise UsageError(
                "--export writes the lens already in --out; it cannot be combined with --eval or --resume"
            )
        export_lens(output.out, *export)
        return
    if evaluate and resume:
        raise UsageError("--resume continues an interrupted training run; it cannot be combined with --eval")
    loads = options.api_kwargs(loading, output)
    batch_size = _batch_size(sample)
    settings: dict[str, Any]
    if evaluate:
        lens = load_lens(output.out)
    place = joined(loading.device)  # under torchrun: every rank computes, rank 0 alone writes
    with one_outcome(place), writer_lock(output.out, "tune-lens", param="out"):  # held until the end
        with options.analysis_outputs(output.out, "tune-lens", loading.device) as outputs:
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
                    checkpoint_dir=output.out,
                    checkpoint_every=checkpoint_every,
                    resume=resume,
                    **loads,
                )
                lens, evaluation = report.lens, report.evaluation
                settings = _training_settings(lens.record, lr, resume, checkpoint_every)
            if outputs is None:  # another rank of a torchrun job: rank 0 writes
                return
            _write_outputs(outputs, lens, evaluation)
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
                outputs,
                "tune-lens",
                settings,
                loading,
                evaluation.seed,
                evaluation.dataset_fingerprint,
            )
        if not evaluate:  # the lens is in place: its run's checkpoint has served
            remove_checkpoint(output.out)
    for line in summary_lines(evaluation):
        typer.echo(line)
    typer.echo(
        f"wrote the lens (translators.safetensors, lens.json), evaluation.json/.csv and plots to {output.out}"
    )


def export_lens(source: Path, layout: str, directory: Path) -> None:
    """`--export`: write the lens in `source` to `directory` in `layout`, refusing a directory
    that holds anything but an earlier export (nothing is written then)."""
    from resstream.analysis.decoding.tuned_lens import EXPORT_META_FILE, load_lens
    from resstream.analysis.decoding.tuned_lens_package import CONFIG_FILE, PARAMS_FILE
    from resstream.errors import UsageError, closest

    if layout not in EXPORT_FORMATS:
        raise UsageError(
            f"--export format {layout!r}{closest(layout, EXPORT_FORMATS)}; "
            f"allowed: {', '.join(EXPORT_FORMATS)}"
        )
    lens = load_lens(source)
    written = (CONFIG_FILE, PARAMS_FILE, EXPORT_META_FILE)
    if directory.exists() or directory.is_symlink():
        if not directory.is_dir():
            raise UsageError(f"--export directory {str(directory)!r} exists and is not a directory")
        if directory.resolve() == source.resolve():
            raise UsageError(
                f"--export directory {str(directory)!r} is --out itself; export into another folder"
            )
        others = sorted(p.name for p in directory.iterdir() if p.name not in written)
        if others:
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise UsageError(
                f"--export directory {str(directory)!r} holds other files ({shown}); export into an empty "
                "folder or over an earlier export"
            )
    lens.save(directory, layout="tuned-lens")
    typer.echo(
        f"wrote the lens of {lens.model} in the tuned-lens layout ({', '.join(written)}) to {directory}"
    )


def _write_outputs(outputs: OutputSet, lens: TunedLens, evaluation: LensEvaluation) -> None:
    """Stage the lens, its evaluation and the plots (run.json is the caller's)."""
    from resstream.io import write_json, write_text
    from resstream.reporting.tuned_lens import evaluation_csv, plot_bits_per_layer, plot_training

    lens.save(outputs.staging)
    write_json(outputs / "evaluation.json", evaluation.to_dict())
    write_text(outputs / "evaluation.csv", evaluation_csv(evaluation))
    plot_bits_per_layer(evaluation, outputs / "bits_per_layer.png")
    history = lens.record.get("kl_bits_per_step") or []
    if history:
        plot_training(history, lens.model, outputs / "training.png")


def _training_settings(record: dict[str, Any], lr: float, resume: bool, every: int) -> dict[str, Any]:
    """run.json's account of a training run: the budget as settled (the lens's record)."""
    return {
        "mode": "train",
        "tokens": record["tokens"],
        "steps": record["optimiser"]["steps"],
        "tokens_per_step": record["tokens_per_step"],
        "lr": lr,
        "resume": resume,
        "resumed_at_steps": record["resumed_at_steps"],
        "checkpoint_every": every,
    }


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
