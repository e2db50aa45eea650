"""`resstream generate`: continuations of prompts under edits, beside the unedited ones."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from resstream.cli import options
from resstream.cli.edits import (
    EDIT_HELP,
    DirectionOption,
    EditSpec,
    MethodOption,
    NewTokensOption,
    WhereOption,
    check_edit_specs,
    stream_edits,
)
from resstream.errors import UsageError

FILES = "generations.jsonl, generate.json, generations.html and run.json"


def read_prompts(prompt: list[str] | None, prompts_file: Path | None) -> list[str]:
    """The prompts of --prompt (repeated) and --prompts-file (one a line; blank lines skipped)."""
    listed = list(prompt or [])
    if prompts_file is not None:
        if not prompts_file.is_file():
            raise UsageError(f"--prompts-file {str(prompts_file)!r} is not a file")
        listed += [line for line in prompts_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not listed:
        raise UsageError("give a prompt: --prompt TEXT (repeat for several) or --prompts-file FILE")
    return listed


@options.command
def generate(
    *,
    output: options.OutputArg,
    loading: options.ModelArg,
    prompt: Annotated[
        list[str] | None, typer.Option("--prompt", help="A prompt; repeat for several.")
    ] = None,
    prompts_file: Annotated[Path | None, typer.Option(help="Prompts, one a line.")] = None,
    edit: Annotated[list[str] | None, typer.Option("--edit", help=EDIT_HELP)] = None,
    direction: DirectionOption = None,
    method: MethodOption = "diffmean",
    where: WhereOption = "all",
    max_new_tokens: NewTokensOption = 32,
    temperature: Annotated[float, typer.Option(help="0: greedy; else sampling at this temperature.")] = 0.0,
    top_p: Annotated[
        float, typer.Option(help="Sampling: keep the most probable tokens up to this mass.")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the sampling (the same for both continuations).")] = 0,
    cache: Annotated[
        bool, typer.Option("--cache/--no-cache", help="Generate with the KV cache (HF models).")
    ] = True,
) -> None:
    """Generate continuations under edits (--edit add:L6.resid:4 with a --direction, scale,
    set, clamp, project), printed beside the unedited ones."""
    specs = check_edit_specs(edit, direction)
    prompts = read_prompts(prompt, prompts_file)
    import resstream
    from resstream.io import write_json
    from resstream.reporting.generation import summary_lines, write_html, write_jsonl
    from resstream.rundir import output_set

    with output_set(output.out, "generate") as outputs:
        loaded = resstream_loaded(loading, output)
        edits = stream_edits_of(specs, direction, method, loaded)
        result = resstream.generate(
            loaded,
            prompts,
            edits=edits,
            where=where,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            use_cache=cache,
            progress=output.progress,
        )
        write_jsonl(result, outputs / "generations.jsonl")
        write_json(outputs / "generate.json", result.to_dict())
        write_html(result, outputs / "generations.html")
        settings = {
            "model": loading.model,
            "prompts": prompts,
            "edits": [spec.text for spec in specs],
            "direction": None if direction is None else str(direction),
            "method": method,
            "where": where,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "cache": cache,
        }
        options.write_run_record(outputs, "generate", settings, loading, seed)
    for line in summary_lines(result):
        typer.echo(line)
    typer.echo(f"wrote {FILES} to {output.out}")


def resstream_loaded(loading: options.Loading, output: options.Output) -> Any:
    """The command's model, loaded once (its edits need its width and fingerprint)."""
    from resstream.models.loading import load_model

    return load_model(loading.model, progress=output.progress, **loading.api_kwargs())


def stream_edits_of(specs: list[EditSpec], direction: Path | None, method: str, loaded: Any) -> list[Any]:
    """The stream's edits of the --edit specs, directed ones reading `direction`'s `method`
    (`check_edit_specs` refused a directed one without a file)."""
    from resstream.api.directions import direction_reader

    if direction is None:
        return stream_edits(specs, lambda site: None)
    return stream_edits(specs, direction_reader(direction, method, loaded))


def register(app: typer.Typer) -> None:
    """Add `generate` to the app."""
    app.command("generate")(generate)
