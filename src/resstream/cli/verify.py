"""`resstream verify`: prove for one checkpoint that resstream sees exactly what the model computes."""

from __future__ import annotations

from typing import Annotated

import typer

from resstream.checks import verify_dtype
from resstream.cli import options

#: The files one run writes (besides run.json).
FILES = ("verify.json",)

_MODEL = options.model_options(device_map=False, dtype_check=verify_dtype)
#: --model, --dtype (float32 or bfloat16, float32 by default: the tolerances are per dtype),
#: --device and --trust-remote-code.
VerifyModelArg = Annotated[
    options.Loading,
    options.OptionGroup(
        _MODEL.build,
        {
            **_MODEL.params,
            "dtype": (
                Annotated[str, typer.Option(help="float32 or bfloat16 (each has its own tolerances).")],
                "float32",
            ),
        },
    ),
]


@options.command
def verify(
    *,
    output: options.OutputArg,
    loading: VerifyModelArg,
    text: Annotated[
        str | None, typer.Option(help="The text to check on \\[default: a built-in English sentence].")
    ] = None,
) -> None:
    """Prove on one text that resstream sees exactly what the model computes.

    Logits, residual states, decomposition, logit lens and routed experts against the model's own
    forward; exit code 1 when a check is outside the tolerances of --dtype (files are written).
    """
    import resstream
    from resstream.errors import RunError
    from resstream.io import write_json
    from resstream.reporting.verify import verify_lines
    from resstream.rundir import output_set

    with output_set(output.out, "verify") as outputs:
        result = resstream.verify(loading.model, text=text, **options.api_kwargs(loading, output))
        write_json(outputs / "verify.json", result.to_dict())
        settings = {"model": loading.model, "text": result.text}
        options.write_run_record(outputs, "verify", settings, loading, None)
    for line in verify_lines(result):
        typer.echo(line)
    typer.echo(f"wrote {', '.join(FILES)} and run.json to {output.out}")
    if not result.passed:
        raise RunError(
            f"verification failed: {', '.join(result.failed)} outside the {result.dtype} tolerances "
            f"(see {output.out / 'verify.json'})"
        )


def register(app: typer.Typer) -> None:
    """Add `verify` to the app."""
    app.command("verify")(verify)
