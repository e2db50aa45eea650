"""Atomic file writing, writing inside a given folder without following links, and the run
record (`run.json`) shared by every command.

Folders are shared between people and unpacked from archives, so a folder must never make
resstream write, remove or rename anything outside it. The rules every writer follows:

* a file is created by `atomic_path` (a new, exclusively created temporary file renamed over
  the final name: a link at the final name is replaced, never written through);
* a file that is opened in place (the lock, a log that grows) is opened with `open_in_folder`,
  which never follows a final symbolic link and opens nothing but a regular file;
* a folder resstream makes inside a given one (`checkpoints/`, `tokenizer/`, a sweep's run
  folders) is made by `folder_inside`, which refuses a link or a file at any name below the
  given folder (the given folder itself may be a link: the user chose it).

A refusal is one line (UsageError) naming the path and what it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import ntpath
import os
import platform
import re
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from resstream.errors import UsageError

#: `atomic_path` writes ".NAME.XXXXXXXX.tmp" (8 random characters from tempfile) beside NAME.
TEMP_SUFFIX = ".tmp"
_TEMPORARY = re.compile(r"\.(.+)\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX))


def cache_root() -> Path:
    """The folder resstream's caches live under: env RESSTREAM_CACHE, else ~/.cache/resstream."""
    return Path(os.environ.get("RESSTREAM_CACHE", Path.home() / ".cache" / "resstream"))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `path`; move it into place only if the block succeeds.

    An interrupted writer (exception, Ctrl-C, kill) leaves any previous file intact and
    never a half-written one under the final name. A directory (or another kind of entry that a
    rename cannot replace) at `path` is refused before anything is written (`check_replaceable`).
    """
    path = Path(path)
    check_replaceable(path)
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


# --------------------------------------------------------------- folders: never through a link
#: What `kind_of` calls each type of directory entry.
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)
#: os.open flags that refuse a final symbolic link (ELOOP) and never block on a named pipe;
#: Windows has neither, and `open_in_folder` checks the entry with lstat first there.
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def kind_of(path: str | os.PathLike[str]) -> str | None:
    """What the entry at `path` is ('a symbolic link', 'a directory', 'a regular file', ...),
    without following a link; None when there is none."""
    try:
        return _kind_of_mode(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None


def is_real_directory(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a directory itself, not a link to one (which may lead elsewhere)."""
    return kind_of(path) == "a directory"


def _kind_of_mode(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "an unknown kind of file")


class UntrustedEntry(UsageError):
    """An entry inside a given folder that resstream will not use: `found` where `expected`
    (a link, where a regular file or a directory of its own was expected). The message is one
    line; callers with more to say use the fields."""

    def __init__(self, path: str | os.PathLike[str], found: str, expected: str) -> None:
        super().__init__(
            f"{str(path)!r} is {found}, not {expected}: resstream follows no link inside a folder it "
            f"is given and uses only regular files and folders there; remove it or choose another folder"
        )
        self.path, self.found, self.expected = Path(path), found, expected


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """`UntrustedEntry` unless `path` is absent, a regular file or a link (which a rename
    replaces, never writing through it): a directory or a named pipe there is refused."""
    found = kind_of(path)
    if found not in (None, "a regular file", "a symbolic link"):
        raise UntrustedEntry(path, found, "a regular file")


def open_in_folder(path: str | os.PathLike[str], flags: int, *, single_link: bool = False) -> int:
    """`os.open(path, flags)` (mode 0666 less the umask when it creates) that never follows a
    final symbolic link and opens only a regular file; `UntrustedEntry` (a UsageError) otherwise.

    `single_link` also refuses a file with other hard links (one whose content another name
    shares, which a truncation would change too).
    """
    found = kind_of(path)
    if found not in (None, "a regular file"):
        raise UntrustedEntry(path, found, "a regular file")
    try:
        fd = os.open(path, flags | _NO_FOLLOW, 0o666)
    except OSError:
        found = kind_of(path)
        if found not in (None, "a regular file"):  # planted between the check and the open
            raise UntrustedEntry(path, found, "a regular file") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # swapped in between the check and the open
        os.close(fd)
        raise UntrustedEntry(path, _kind_of_mode(info.st_mode), "a regular file")
    if single_link and info.st_nlink > 1:
        os.close(fd)
        raise UntrustedEntry(path, "a file with other hard links", "a file of its own")
    return fd


def open_log(path: str | os.PathLike[str]) -> TextIO:
    """The log file `path` opened to append text (created if missing); a link or anything but
    a regular file with no other name at `path` is refused (`open_in_folder`)."""
    fd = open_in_folder(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, single_link=True)
    return os.fdopen(fd, "a", encoding="utf-8")


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append `line` and a newline to the log file `path` (`open_log`), flushed."""
    with open_log(path) as handle:
        handle.write(line + "\n")


def not_a_plain_name(name: object) -> str | None:
    """Why `name` does not name an entry directly inside a folder, or None when it does: it
    must be a non-empty string, not '.' or '..', without a separator (of this system or
    another) or a NUL, and not absolute."""
    if not isinstance(name, str) or not name:
        return "not a file name"
    if "\x00" in name:
        return "it holds a NUL character"
    if os.path.isabs(name) or name.startswith(("/", "\\")) or ntpath.splitdrive(name)[0]:
        return "an absolute path"
    if any(sep in name for sep in ("/", "\\", os.sep, os.altsep or "/")):
        return "a path, not a plain name"
    if name in (".", ".."):
        return "a directory"
    return None


def is_plain_name(name: object) -> bool:
    """Whether `name` names an entry directly inside a folder (`not_a_plain_name`)."""
    return not_a_plain_name(name) is None


def check_inside(root: str | os.PathLike[str], path: str | os.PathLike[str], expected: str | None) -> None:
    """UsageError (`UntrustedEntry`) when an entry on the way from `root` to `path` (`root`
    itself excluded) is a symbolic link or, where it exists, not a directory; the last one must
    be `expected` ('a directory', 'a regular file'; None: anything but a link)."""
    root, path = Path(os.path.abspath(root)), Path(os.path.abspath(path))
    if root != path and root not in path.parents:
        raise ValueError(f"{str(path)!r} is not inside {str(root)!r}")
    current = root
    parts = path.relative_to(root).parts
    for index, part in enumerate(parts):
        current = current / part
        found = kind_of(current)
        last = index == len(parts) - 1
        wanted = expected if last else "a directory"
        if found is None:
            return
        if found == "a symbolic link" or (wanted is not None and found != wanted):
            raise UntrustedEntry(current, found, wanted or "a file or folder of its own")


def check_below(root: str | os.PathLike[str], path: str | os.PathLike[str], expected: str | None) -> None:
    """`check_inside` when `path` lies below `root`; nothing for a path elsewhere (the user's
    choice, as the folder `root` itself is)."""
    if Path(os.path.abspath(root)) in Path(os.path.abspath(path)).parents:
        check_inside(root, path, expected)


def folder_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Make the folder `path` below `root` (and its parents) where missing; UsageError when
    one of them is a link or not a directory (`check_inside`). Returns `path`."""
    check_inside(root, path, "a directory")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    check_inside(root, path, "a directory")  # not replaced by a link while it was made
    return path


def is_temporary_name(name: str) -> bool:
    """Whether `name` is a temporary file of `atomic_path` (what an interrupted writer leaves)."""
    return _TEMPORARY.fullmatch(name) is not None


def final_name(name: str) -> str:
    """The name `atomic_path` writes under the temporary `name` (any other name as it is): what
    a message about a failed write names."""
    match = _TEMPORARY.fullmatch(name)
    return match.group(1) if match else name


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


def write_safetensors(
    path: str | os.PathLike[str], tensors: Any, metadata: dict[str, str] | None = None
) -> Path:
    """Write a dict of tensors (contiguous CPU copies) as one safetensors file, atomically."""
    from safetensors.torch import save_file

    cpu = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(cpu, str(tmp), metadata=metadata)
    return Path(path)


def write_npz(path: str | os.PathLike[str], **arrays: Any) -> Path:
    """Write numpy arrays (or tensors) to an uncompressed `.npz` atomically."""
    import numpy as np

    converted = {name: np.asarray(value) for name, value in arrays.items()}
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, allow_pickle=True, **converted)  # numpy's default, named: not an array's name
    return Path(path)
