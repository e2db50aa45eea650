"""`resstream steer`: the steering trade-off of a direction, or (--scale) the attenuation map."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from resstream.cli import options
from resstream.cli.edits import DirectionOption, MethodOption, NewTokensOption, WhereOption
from resstream.cli.generate import read_prompts
from resstream.errors import UsageError, refuse_set

STEER_FILES = "steer.json, steer.csv, steer.png, steer.html and run.json"
SCALE_FILES = "steer.json (the map), attenuation.csv, attenuation.png and run.json"
#: The prompts continued when none are given: openings of a line of verse and of speeches.
DEFAULT_PROMPTS = ("The king", "I will", "O, what", "My lord,", "Now is the", "Come, let us")


def _check_modes(scale: bool, given: dict[str, Any], scale_given: dict[str, Any]) -> None:
    """The options of the mode not asked are refused (each names its mode)."""
    if scale:
        refuse_set(given, "applies to steering with a direction, not to --scale")
    else:
        refuse_set(scale_given, "applies to the attenuation map (--scale)")


@options.command
def steer(
    *,
    output: options.OutputArg,
    loading: options.ModelArg,
    direction: DirectionOption = None,
    method: MethodOption = "diffmean",
    site: Annotated[
        list[str] | None,
        typer.Option(
            "--site", help="A residual state to steer (L6.resid); repeat. Default: every one the file has."
        ),
    ] = None,
    coef: Annotated[
        list[float] | None,
        typer.Option("--coef", help="A coefficient (length added); repeat. [default: 0 2 4 8 16]"),
    ] = None,
    prompt: Annotated[list[str] | None, typer.Option("--prompt", help="A prompt continued; repeat.")] = None,
    prompts_file: Annotated[Path | None, typer.Option(help="Prompts, one a line.")] = None,
    neutral_file: Annotated[
        Path | None, typer.Option(help="Neutral texts for the KL, one a line [default: the prompts].")
    ] = None,
    concept_token: Annotated[
        list[str] | None,
        typer.Option("--concept-token", help="A token of the concept (its log p is scored)."),
    ] = None,
    probe: Annotated[
        bool,
        typer.Option("--probe/--no-probe", help="Score continuations with the file's probe at the site."),
    ] = True,
    max_new_tokens: NewTokensOption = 24,
    where: WhereOption = "all",
    scale: Annotated[
        bool,
        typer.Option("--scale", help="Instead: the loss and shift layer under inference-time attenuation."),
    ] = False,
    alpha: Annotated[
        list[float] | None, typer.Option("--alpha", help="--scale: an identity-path factor; repeat.")
    ] = None,
    layer: Annotated[
        list[int] | None, typer.Option("--layer", help="--scale: a block; repeat [default: all].")
    ] = None,
    run: Annotated[
        list[Path] | None,
        typer.Option("--run", help="--scale: a run trained with attenuation, scored beside."),
    ] = None,
    sample: Annotated[options.Sample, options.corpus_options(seq_len=64, num_seqs=16)],
) -> None:
    """The steering trade-off (concept score against KL and perplexity, per coefficient and
    site), or with --scale the loss and shift layer of the model with each block's identity
    path attenuated at inference."""
    given = {
        "direction": direction,
        "site": site,
        "coef": coef,
        "prompt": prompt,
        "prompts_file": prompts_file,
    }
    given |= {"neutral_file": neutral_file, "concept_token": concept_token}
    _check_modes(scale, given, {"alpha": alpha, "layer": layer, "run": run})
    if scale:
        _attenuation(output, loading, sample, alpha, layer, run)
        return
    if direction is None:
        raise UsageError("steer needs --direction (a directions file), or --scale for the attenuation map")
    prompts = read_prompts(prompt, prompts_file) if prompt or prompts_file else list(DEFAULT_PROMPTS)
    neutral = read_prompts(None, neutral_file) if neutral_file else None
    _steer(
        output,
        loading,
        direction,
        method,
        site,
        coef,
        prompts,
        neutral,
        concept_token,
        probe,
        max_new_tokens,
        where,
    )


def _steer(
    output: options.Output,
    loading: options.Loading,
    direction: Path,
    method: str,
    sites: list[str] | None,
    coefs: list[float] | None,
    prompts: list[str],
    neutral: list[str] | None,
    concept: list[str] | None,
    use_probe: bool,
    max_new_tokens: int,
    where: Any,
) -> None:
    import resstream
    from resstream.api.directions import read_direction_file
    from resstream.api.steer import DEFAULT_COEFS
    from resstream.cli.generate import resstream_loaded
    from resstream.io import write_json, write_text
    from resstream.reporting.notebook import frame_csv
    from resstream.reporting.steer import plot_steer, steer_frame, steer_lines, write_steer_html
    from resstream.rundir import output_set

    with output_set(output.out, "steer") as outputs:
        loaded = resstream_loaded(loading, output)
        found = read_direction_file(direction, loaded)
        chosen = sites or inner_sites(found.sites, loaded.view.n_layers)
        directions = {s: found.direction(s, method) for s in chosen}
        judge = best_probe(found) if use_probe and found.has_probe else None
        result = resstream.steer(
            loaded,
            directions=directions,
            prompts=prompts,
            coefs=coefs or DEFAULT_COEFS,
            neutral=neutral,
            concept_tokens=concept or (),
            probe=judge,
            max_new_tokens=max_new_tokens,
            where=where,
            progress=output.progress,
        )
        write_json(outputs / "steer.json", result.to_dict())
        write_text(outputs / "steer.csv", frame_csv(steer_frame(result)))
        plot_steer(result, outputs / "steer.png")
        write_steer_html(result, outputs / "steer.html")
        settings = {"model": loading.model, "direction": str(direction), "method": method, **result.settings}
        options.write_run_record(outputs, "steer", settings, loading)
    for line in steer_lines(result):
        typer.echo(line)
    typer.echo(f"wrote {STEER_FILES} to {output.out}")


def inner_sites(sites: list[str], n_layers: int) -> list[str]:
    """The sites a block reads and writes through, h_1..h_{L-1} (steering the embedding or the
    final state is rarely what is meant; name them with --site)."""
    inner = [s for s in sites if s not in ("L0.resid", f"L{n_layers}.resid")]
    return inner or sites


def best_probe(found: Any) -> tuple[str, Any, float]:
    """The probe with the best held-out AUC in a directions file: the judge of the concept."""
    aucs = {name: auc for name, auc in found.auc.items() if name.endswith("/probe")}
    site = max(aucs, key=lambda name: aucs[name]).split("/")[0] if aucs else found.sites[-1]
    return found.probe(site)


def _attenuation(
    output: options.Output,
    loading: options.Loading,
    sample: options.Sample,
    alphas: list[float] | None,
    layers: list[int] | None,
    runs: list[Path] | None,
) -> None:
    import resstream
    from resstream.api.steer import DEFAULT_ALPHAS
    from resstream.io import write_json, write_text
    from resstream.reporting.notebook import frame_csv
    from resstream.reporting.steer import attenuation_frame, attenuation_lines, plot_attenuation
    from resstream.rundir import output_set

    with output_set(output.out, "steer") as outputs:
        result = resstream.attenuation(
            loading.model,
            layers=layers,
            alphas=alphas or DEFAULT_ALPHAS,
            runs=[str(r) for r in runs or ()],
            dataset=sample.dataset or "shakespeare",
            num_seqs=sample.num_seqs or 16,
            seq_len=sample.seq_len or 64,
            seed=sample.seed or 0,
            batch_size=sample.batch_size or 8,
            data_dir=sample.data_dir,
            **options.api_kwargs(loading, output),
        )
        write_json(outputs / "steer.json", {"mode": "scale", **result.to_dict()})
        write_text(outputs / "attenuation.csv", frame_csv(attenuation_frame(result)))
        plot_attenuation(result, outputs / "attenuation.png")
        settings: dict[str, Any] = {"model": loading.model, "scale": True, "alphas": result.alphas}
        settings["layers"] = result.layers
        settings |= {"runs": [str(r) for r in runs or ()], **result.settings}
        options.write_run_record(
            outputs, "steer", settings, loading, sample.seed, result.settings["dataset_fingerprint"]
        )
    for line in attenuation_lines(result):
        typer.echo(line)
    typer.echo(f"wrote {SCALE_FILES} to {output.out}")


def register(app: typer.Typer) -> None:
    """Add `steer` to the app."""
    app.command("steer")(steer)
