"""`resstream lens`: the decoding trajectory of a text, layer by layer."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from resstream.checks import decoder_kind
from resstream.cli import options
from resstream.errors import UsageError


def parse_positions(text: str | None) -> slice | None:
    """'A:B' (either side optional: 'A:' runs to the end) or 'N' into a slice; None: all."""
    if text is None:
        return None
    start, sep, stop = text.partition(":")
    try:
        if not sep:
            first = int(start)
            return slice(first, first + 1)
        return slice(int(start) if start.strip() else 0, int(stop) if stop.strip() else None)
    except ValueError:
        raise UsageError(f"--positions {text!r} is not A:B with integers A < B (e.g. 3:10)") from None


def stdout_is_terminal() -> bool:
    """Whether the table goes to a terminal (not a pipe or a file)."""
    return sys.stdout.isatty()


def use_colour(no_colour: bool) -> bool:
    """Colour the table only on a terminal, and not with --no-colour or a non-empty NO_COLOR
    (https://no-color.org); otherwise cells get [input] / [next] marks."""
    return not no_colour and not os.environ.get("NO_COLOR") and stdout_is_terminal()


def written_files(images: list[Path]) -> str:
    """The files of the set in words, the PNGs of a long text as a span."""
    from resstream.reporting.lens import POSITIONS_PER_IMAGE

    pngs = images[0].name
    if len(images) > 1:
        pngs += f" … {images[-1].name} (at most {POSITIONS_PER_IMAGE} positions each)"
    return f"lens.json, lens.html, {pngs} and run.json"


@options.command
def lens(
    *,
    output: options.OutputArg,
    loading: options.ModelArg,
    one: Annotated[options.OneText, options.text_options("The text to decode.")],
    positions: Annotated[str | None, typer.Option(help="Token positions A:B (default: all).")] = None,
    top_k: Annotated[int, typer.Option(help="Decodings kept per cell (lens.json); tables show top-1.")] = 1,
    decoder: Annotated[
        str, typer.Option(help="logit-lens, embedding or tuned:DIR (a lens from `resstream tune-lens`).")
    ] = "logit-lens",
    no_colour: Annotated[
        bool,
        typer.Option(
            "--no-colour",
            # \[ keeps Rich (the help renderer) from reading [input] as markup and dropping it
            help="Mark cells with \\[input]/\\[next] instead of colour (always so when stdout is not a "
            "terminal or NO_COLOR is set).",
        ),
    ] = False,
) -> None:
    """Decode every layer's hidden state of a text: which layers hold the input token, which the next."""
    span = parse_positions(positions)  # refused before the imports below
    decoder_kind(decoder)
    import resstream
    from resstream.io import write_json
    from resstream.reporting.lens import plot_lens, terminal_lines, write_html
    from resstream.rundir import output_set

    with output_set(output.out, "lens") as outputs:
        result = resstream.lens(
            one.text,
            model=loading.model,
            positions=span,
            top_k=top_k,
            decoder=decoder,
            **options.api_kwargs(one, loading, output),
        )
        write_json(outputs / "lens.json", result.to_dict())
        write_html(result, outputs / "lens.html")
        images = plot_lens(result, outputs / "lens.png")
        settings = {
            "model": loading.model,
            "positions": positions,
            "top_k": top_k,
            "decoder": decoder,
            **one.record(),
        }
        options.write_run_record(outputs, "lens", settings, loading, None)
    colour = use_colour(no_colour)
    for line in terminal_lines(result, colour=colour):
        typer.echo(line, color=colour)
    typer.echo(f"wrote {written_files(images)} to {output.out}")


def register(app: typer.Typer) -> None:
    """Add `lens` to the app."""
    app.command("lens")(lens)
