"""Small helpers shared by the command modules."""

from __future__ import annotations

from pathlib import Path

import typer

from resstream.errors import UsageError


def check_out_dir(out: Path) -> None:
    """--out must be a directory or not exist yet."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file; give a directory")


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
    from resstream.adapters import resolve_device

    return f"device_map={device_map}" if device_map else resolve_device(device)
