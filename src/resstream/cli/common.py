"""Small helpers shared by the command modules."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from resstream.errors import UsageError


def check_max_eval_tokens(value: str | None) -> int | None:
    """--max-eval-tokens (sweep, compare) as an integer that allows one context and one scored token."""
    if value is None:
        return None
    try:
        tokens = int(value)
    except ValueError:
        raise UsageError(f"--max-eval-tokens: {value!r} is not an integer") from None
    if tokens < 2:
        raise UsageError(f"--max-eval-tokens must be >= 2, got {tokens}")
    return tokens


def split_names(text: str | None) -> list[str]:
    """'a,b' (or repeated spaces) into ['a', 'b']; None into []."""
    if text is None:
        return []
    return [item.strip() for item in text.replace(" ", ",").split(",") if item.strip()]


def echo_err(message: str) -> None:
    """A progress line on stderr (stdout stays for results)."""
    typer.echo(message, err=True)


def resolved_device(device: str, device_map: str | None = None) -> str:
    """The device a run actually used, for run.json ('auto' resolved; a device map named)."""
    from resstream.devices import device_label

    return f"device_map={device_map}" if device_map else device_label(device)


def seq_len_option(default: int) -> Any:
    """--seq-len, its help naming the command's `default` (which the sampling clips to the
    shortest model context); use as `seq_len: Annotated[int | None, seq_len_option(N)] = None`."""
    return typer.Option(
        help=f"Tokens per sequence \\[default: {default}, or the shortest model context if shorter]."
    )


# Options shared by the analysis commands (shift, lens, recency, neurons): one declaration each.
OutOption = Annotated[Path, typer.Option("--out", help="Output directory (created if missing).")]
ModelsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        help="Run dir, HF directory or hub name; repeat for several (default: built-in reference model).",
    ),
]
DatasetOption = Annotated[
    str, typer.Option(help="Named corpus, .txt/.jsonl path (.jsonl input_ids rows used as given).")
]
NumSeqsOption = Annotated[int, typer.Option(help="Sequences sampled from the corpus.")]
BatchSizeOption = Annotated[int, typer.Option(help="Sequences per forward pass.")]
SampleSeedOption = Annotated[int, typer.Option(help="Seed of the sequence sample.")]
DataDirOption = Annotated[Path | None, typer.Option(help="Local corpora (else env RESSTREAM_DATA).")]
DtypeOption = Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")]
DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")]
DeviceMapOption = Annotated[
    str | None,
    typer.Option(
        help="Spread a Hugging Face model over devices: auto, balanced, sequential (needs accelerate)."
    ),
]
TrustRemoteCodeOption = Annotated[
    bool,
    typer.Option("--trust-remote-code", help="Run a hub model's own code (only for repositories you trust)."),
]
QuietOption = Annotated[bool, typer.Option("--quiet", help="No progress bars.")]
