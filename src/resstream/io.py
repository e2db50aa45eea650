"""Atomic file writing and the run record (`run.json`) shared by every command."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: `atomic_path` writes ".NAME.XXXXXXXX.tmp" (8 random characters from tempfile) beside NAME.
TEMP_SUFFIX = ".tmp"
_TEMPORARY = re.compile(r"\..+\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `path`; move it into place only if the block succeeds.

    An interrupted writer (exception, Ctrl-C, kill) leaves any previous file intact and
    never a half-written one under the final name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        try:
            yield tmp_path
        except OSError as exc:
            if exc.filename is None and exc.errno is not None:  # a failed write() names no file
                exc.filename = str(tmp_path)
            raise
        # mkstemp makes 0600 and some writers (safetensors) recreate the file with their own
        # mode: the final file gets the mode the umask gives, as any other file would
        os.chmod(tmp_path, 0o666 & ~current_umask())
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def is_temporary_name(name: str) -> bool:
    """Whether `name` is a temporary file of `atomic_path` (what an interrupted writer leaves)."""
    return _TEMPORARY.fullmatch(name) is not None


def current_umask() -> int:
    """The process's umask (read by setting and restoring it: there is no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `obj` as indented, strict JSON (see `strict_json`), atomically."""
    write_text(path, strict_json(obj, indent=2) + "\n")


def strict_json(obj: Any, **options: Any) -> str:
    """`obj` as JSON that every parser reads: a non-finite float (nan, ±inf, which Python's
    `json` would write as the invalid NaN / Infinity) becomes null, also inside arrays."""
    return json.dumps(jsonable(obj), allow_nan=False, default=_json_default, **options)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy and torch arrays and scalars
        return jsonable(obj.tolist())
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def file_fingerprint(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes (hex, first 16 characters)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()[:16]


def git_revision() -> str | None:
    """The git commit of the installed source tree, or None outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def library_versions() -> dict[str, str]:
    """Versions of the libraries whose behaviour a result depends on."""
    import importlib.metadata as md

    versions = {"python": platform.python_version()}
    for name in ("resstream", "torch", "transformers", "tokenizers", "numpy"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def run_record(
    config: dict[str, Any], *, seed: int | None, device: str, dataset_fingerprint: str | None
) -> dict[str, Any]:
    """The content of `run.json`: resolved config, seed, versions, device, git, data."""
    return {
        "config": config,
        "seed": seed,
        "versions": library_versions(),
        "device": device,
        "git_revision": git_revision(),
        "dataset_fingerprint": dataset_fingerprint,
    }


def jsonable(obj: Any) -> Any:
    """Plain JSON data from nested dicts, lists and tuples: tuples become lists, and
    non-finite floats (nan, ±inf) become None (JSON has no nan)."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_npz(path: str | os.PathLike[str], **arrays: Any) -> Path:
    """Write numpy arrays (or tensors) to an uncompressed `.npz` atomically."""
    import numpy as np

    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **{name: np.asarray(value) for name, value in arrays.items()})
    return Path(path)
