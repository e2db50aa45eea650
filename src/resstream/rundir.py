"""The directory a command writes: one writer at a time, checked before work, complete or absent.

`locked_directory(path, command)` is held for as long as a command writes into a directory:

* it checks that the directory can be written (a file in its place, a read-only file
  system, missing permission) before any work starts;
* it takes an exclusive lock (`.resstream.lock`, a kernel file lock), so a second resstream
  process on the same directory is refused with one line naming the holder's pid; the kernel
  drops the lock of a process that dies, so a stale lock file is simply taken over; a lock
  file that is a link, a directory, not a regular file or a file with other hard links is
  refused in one line (`io.open_in_folder`), never written through;
* holding the lock, it removes the temporary files an interrupted earlier writer left;
* a directory it created is removed again when the command fails before writing anything;
* a directory below one this process holds (a sweep's run folder) must be reached without
  a link (`io.check_inside`).

`output_set(path, command)` adds the promise of the analysis commands: every output of one
run becomes visible together or not at all. Outputs are written into a staging folder inside
the directory and moved into place in one short step that Ctrl-C cannot split, `run.json`
last, listing the files of its set; files of the previous set in the directory that the new
set does not have are removed then, so runs never mix. Only plain names of files (or links,
which are unlinked, not followed) directly in the directory are removed; any other name a
previous run.json lists ('..', a folder, a path) is ignored. `result_file(path)` is the run's
result JSON (what `--json` prints), found from its run.json.

Locks are per process and reentrant: a command that locks a directory and calls library code
that locks it again (or locks a directory below it) does not lock itself out.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from resstream.errors import RunError, UsageError
from resstream.interrupts import deferred_interrupts, raise_if_interrupted
from resstream.io import (
    check_below,
    check_replaceable,
    is_plain_name,
    is_temporary_name,
    kind_of,
    open_in_folder,
    write_json,
)
from resstream.resources import format_bytes

LOCK_FILE = ".resstream.lock"
RUN_FILE = "run.json"
STAGING_PREFIX = ".resstream-staging-"
#: Free space an analysis command asks for before it starts (its outputs are a few MB).
DEFAULT_OUTPUT_BYTES = 16 << 20

_held: dict[Path, int] = {}  # resolved directory -> how many holders in this process
_given: dict[Path, Path] = {}  # resolved directory -> the absolute path it was locked by

#: The errors of a write that found the disk full, as a message says them.
DISK_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
_REASONS = {
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    **DISK_FULL,
    errno.ENOTDIR: "a parent is a file, not a directory",
}


def write_failure(
    exc: OSError,
    path: Path,
    param: str | None,
    *,
    need: int | None = None,
    kept: str = "nothing of it was kept",
) -> RunError | UsageError | None:
    """The one-line error for an OSError raised while writing under `path`, or None when it is
    not a problem of writing there (another file's error, a bug: let it show).

    `need` is the number of bytes the write needed, when known, and `kept` what of the run
    survives, for the disk-full message.
    """
    reason = _REASONS.get(exc.errno or -1)
    if reason is None or not _concerns(exc, path):
        return None
    where = _where(path, param)
    if exc.errno in DISK_FULL:
        needs = f"this run needs ~{format_bytes(need)}, " if need else ""
        free = format_bytes(free_bytes(path))
        return RunError(f"{reason} on {mount_point(path)} for {where}: {needs}{free} free; {kept}")
    return UsageError(f"cannot write to {where}: {reason}")


def _where(path: Path, param: str | None) -> str:
    """How a message names the directory: by its parameter when it has one."""
    return f"`{param}` {str(path)!r}" if param else f"directory {str(path)!r}"


def _concerns(exc: OSError, path: Path) -> bool:
    """Whether the failed operation was on `path` or below it. An error without a file name
    (a failed write() has none; `io.atomic_path` adds it for its own writes) is not taken to
    be the destination's: it could come from any file."""
    if not exc.filename:
        return False
    target = Path(os.fsdecode(exc.filename)).absolute()
    base = path.absolute()
    return target == base or base in target.parents


@contextlib.contextmanager
def locked_directory(
    path: str | os.PathLike[str], command: str, *, param: str | None = "out"
) -> Iterator[Path]:
    """Hold `path` for `command`: checked writable, locked, cleaned of leftovers (module doc).

    `param` is the name of the parameter that gave the directory, for messages.
    """
    raise_if_interrupted()  # a Ctrl-C that a library swallowed stops the command before it writes
    directory = Path(path)
    _check_below_held(directory)
    key = directory.resolve()
    if _held.get(key):
        _held[key] += 1
        try:
            yield directory
        finally:
            _held[key] -= 1
        return
    created = _make_directory(directory, param)
    handle = None
    try:
        with deferred_interrupts():  # a Ctrl-C here must not leave a lock nobody releases
            handle = _acquire(directory, command, param)
            _held[key] = 1
            _given[key] = Path(os.path.abspath(directory))
        remove_leftovers(directory)
        yield directory
    finally:
        if handle is not None:
            _held.pop(key, None)
            _given.pop(key, None)
            _release(handle, directory)
        _remove_if_empty(directory, created)


def _check_below_held(directory: Path) -> None:
    """A folder below one this process holds (a sweep's run folders, a reproduction's stage
    folders) is resstream's own: UsageError when the way to it passes a link (`check_inside`)."""
    for root in list(_given.values()):
        check_below(root, directory, "a directory")


def _make_directory(directory: Path, param: str | None) -> Path | None:
    """Create `directory` if missing; return the topmost folder this created (None if none)."""
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{_where(directory, param)} is a file; give a directory")
    missing = [p for p in (directory, *directory.parents) if not p.exists()]
    try:
        _ensure_directory(directory)
    except OSError as exc:
        raise write_failure(exc, directory, param) or exc from None
    return missing[-1] if missing else None


def _ensure_directory(directory: Path, attempts: int = 20) -> None:
    """`mkdir -p`, robust to other processes creating and removing the same folders meanwhile
    (each removes a folder it created once it is done with it: `_remove_if_empty`)."""
    for attempt in range(attempts):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            return
        except (FileExistsError, FileNotFoundError):
            if directory.is_dir():
                return
            if attempt == attempts - 1:
                raise


def _remove_if_empty(directory: Path, created: Path | None) -> None:
    """Remove the folders this command created, as long as nothing was written into them."""
    if created is None:
        return
    for folder in (directory, *directory.parents):
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == created:
            return


def _acquire(directory: Path, command: str, param: str | None) -> int:
    """Open and lock the lock file; refuse when another live process holds it."""
    path = directory / LOCK_FILE
    while True:
        try:
            fd = open_in_folder(path, os.O_RDWR | os.O_CREAT, single_link=True)
        except FileNotFoundError:  # another process removed the folder it had created: again
            _ensure_directory(directory)
            continue
        except UsageError as exc:
            raise UsageError(f"{_where(directory, param)}: its lock file {exc}") from None
        except OSError as exc:
            raise write_failure(exc, directory, param) or exc from None
        if not _try_lock(fd):
            holder = _holder(fd)
            os.close(fd)
            raise UsageError(
                f"{_where(directory, param)} is in use by another resstream process ({holder}); "
                f"wait for it to finish or choose another directory"
            )
        if _same_file(fd, path):  # not unlinked by a holder that released it meanwhile
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since": time.time()}
    os.write(fd, json.dumps(info).encode())
    return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, held = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


def _try_lock(fd: int) -> bool:
    """An exclusive, non-blocking lock on `fd` (released by the kernel when the process dies)."""
    if sys.platform == "win32":
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder(fd: int) -> str:
    """'pid 123, train, since 14:03:22' from a held lock file (what it says, if readable)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode() or "{}")
    except (OSError, ValueError, UnicodeDecodeError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "pid unknown"
    parts = [f"pid {info['pid']}"]
    if info.get("host") and info["host"] != socket.gethostname():
        parts[0] += f" on {info['host']}"
    if info.get("command"):
        parts.append(f"resstream {info['command']}")
    if isinstance(info.get("since"), (int, float)):
        parts.append("since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"])))
    return ", ".join(parts)


def _release(fd: int, directory: Path) -> None:
    """Remove the lock file while still holding it, then let go (see `_acquire`'s check)."""
    with contextlib.suppress(OSError):
        (directory / LOCK_FILE).unlink()
    os.close(fd)


def remove_leftovers(directory: Path) -> list[Path]:
    """Remove what interrupted writers leave in `directory` (not below it): temporary files of
    `io.atomic_path` and staging folders of `output_set` (a link at such a name is removed,
    never followed). Returns what it removed."""
    removed = []
    for entry in directory.iterdir():
        staging = entry.name.startswith(STAGING_PREFIX)
        temporary = is_temporary_name(entry.name) and kind_of(entry) != "a directory"
        if (staging or temporary) and remove_entry(entry):
            removed.append(entry)
    return removed


def remove_entry(path: Path) -> bool:
    """Remove `path` without following a link: a link or a file is unlinked, a directory
    removed with what it holds (links inside it are unlinked, not followed). Returns whether
    something was removed; an entry that cannot be removed is left as it is."""
    found = kind_of(path)
    if found is None:
        return False
    if found == "a directory":
        shutil.rmtree(path, ignore_errors=True)  # rmtree never follows the links it meets
        return not os.path.lexists(path)
    with contextlib.suppress(OSError):
        path.unlink()
    return not os.path.lexists(path)


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds `path` (or its nearest existing parent)."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    return shutil.disk_usage(existing).free


def mount_point(path: Path) -> str:
    """The mount point of the file system that holds `path` (the device a user recognises)."""
    current = next(p for p in (path.resolve(), *path.resolve().parents) if p.exists())
    while not os.path.ismount(current) and current != current.parent:
        current = current.parent
    return str(current)


def check_free_space(directory: Path, need: int, param: str | None = "out") -> None:
    """Refuse before work when the file system of `directory` has less than `need` bytes free."""
    free = free_bytes(directory)
    if free < need:
        raise RunError(
            f"no space left on {mount_point(directory)} for {_where(directory, param)}: this run "
            f"needs ~{format_bytes(need)}, {format_bytes(free)} free; nothing was written"
        )


def previous_command(directory: Path) -> str | None:
    """The command whose run the directory holds ('train' for a training run), or None."""
    if (directory / "model.json").is_file() or (directory / "checkpoints").is_dir():
        return "train"
    try:
        record = json.loads((directory / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    config = record.get("config") if isinstance(record, dict) else None
    return config.get("command") if isinstance(config, dict) else None


#: The result JSON of a command whose result is not `<command>.json` (tune-lens's lens.json is
#: the lens's own description; its result is the evaluation).
RESULT_FILES = {"tune-lens": "evaluation.json"}


def result_file(directory: Path) -> Path:
    """The result JSON of the run `directory` holds: `<command>.json`, or the file `RESULT_FILES`
    names for its command, as its run.json records them (the command, and the file in its set).

    Raises RunError when the directory holds no run of a command with a result JSON."""
    command = previous_command(directory)
    if command is None:
        raise RunError(f"{directory} holds no resstream run ({RUN_FILE} is missing), so no result JSON")
    name = RESULT_FILES.get(command, f"{command}.json")
    if name not in (_listed_files(directory) or []):
        listed = f"{name} is not listed"
        raise RunError(f"{directory} holds no result JSON of its resstream {command} run ({listed})")
    return directory / name


def refuse_another_commands_run(directory: Path, command: str, param: str | None = "out") -> None:
    """Refuse a directory that holds another command's run (its run.json would be replaced),
    or an analysis run whose run.json does not list its files (written before run.json had a
    `files` list), whose files could not be told apart and would mix with the new set."""
    holder = previous_command(directory)
    if holder not in (None, command):
        raise UsageError(
            f"{_where(directory, param)} holds the outputs of resstream {holder}; "
            f"choose another directory (its {RUN_FILE} would be replaced)"
        )
    if holder is not None and holder != "train" and _listed_files(directory) is None:
        raise UsageError(
            f"{_where(directory, param)} holds a resstream {holder} run whose {RUN_FILE} does not "
            f"list its files (an older resstream wrote it), so they cannot be replaced as a set; "
            f"remove them or choose another directory"
        )


class OutputSet:
    """The outputs of one run, staged and then moved into place together (see `output_set`);
    `recorded`: fields its run.json holds whatever the command records (`write_record`)."""

    def __init__(self, directory: Path, staging: Path, recorded: Mapping[str, Any] | None = None) -> None:
        self.directory = directory
        self.staging = staging
        self.recorded = dict(recorded or {})

    def __truediv__(self, name: str) -> Path:
        """The staging path of output `name` (a file name, no folders)."""
        if not is_plain_name(name) or name in (RUN_FILE, LOCK_FILE):
            raise ValueError(f"output name {name!r} must be a plain file name other than {RUN_FILE}")
        return self.staging / name

    def staged(self) -> list[str]:
        """Names of the outputs written so far."""
        return sorted(p.name for p in self.staging.iterdir() if not is_temporary_name(p.name))

    def write_record(self, record: dict[str, Any]) -> None:
        """Stage `run.json`: `record` and the set's `recorded` fields, plus the list of the
        set's files (written last)."""
        write_json(self.staging / RUN_FILE, {**record, **self.recorded, "files": [*self.staged(), RUN_FILE]})

    def commit(self) -> None:
        """Move the staged set into place (run.json last) and drop the previous set's other
        files; Ctrl-C waits until this has finished."""
        raise_if_interrupted()
        names = self.staged()
        if RUN_FILE not in names:
            raise RuntimeError("an output set needs its run.json (OutputSet.write_record) before commit")
        stale = _previous_files(self.directory) - set(names)
        for name in names:  # a folder at an output's name would stop the commit half-way
            check_replaceable(self.directory / name)
        with deferred_interrupts():
            for name in [n for n in names if n != RUN_FILE] + [RUN_FILE]:
                os.replace(self.staging / name, self.directory / name)
            for name in stale:  # the set is committed: a file that will not go stays (unlisted)
                if kind_of(self.directory / name) in ("a regular file", "a symbolic link"):
                    with contextlib.suppress(OSError):
                        (self.directory / name).unlink()


def _previous_files(directory: Path) -> set[str]:
    """The files the previous run.json in `directory` listed as its set: plain names of
    entries directly in it (no folders, no '..', not the lock); any other name is ignored."""
    files = _listed_files(directory) or []
    return {f for f in files if isinstance(f, str) and is_plain_name(f) and f != LOCK_FILE}


def _listed_files(directory: Path) -> list[object] | None:
    """The `files` list of the run.json in `directory`; None without one (no run.json, not
    JSON, or a record without the list)."""
    try:
        record = json.loads((directory / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    files = record.get("files") if isinstance(record, dict) else None
    return files if isinstance(files, list) else None


@contextlib.contextmanager
def output_set(
    path: str | os.PathLike[str],
    command: str,
    *,
    param: str | None = "out",
    need_bytes: int = DEFAULT_OUTPUT_BYTES,
    recorded: Mapping[str, Any] | None = None,
) -> Iterator[OutputSet]:
    """Lock `path` for `command` and stage its outputs; they appear only if the block succeeds
    (`recorded`: fields of its run.json, `OutputSet`).

    Refused before the block runs: a directory that holds another command's run (its run.json
    would be overwritten) and one without `need_bytes` free. A write that fails for lack of
    space or permission becomes one line; nothing of this run is left behind.
    """
    directory = Path(path)
    with locked_directory(directory, command, param=param):
        refuse_another_commands_run(directory, command, param)
        check_free_space(directory, need_bytes, param)
        staging = directory / f"{STAGING_PREFIX}{os.getpid()}"  # under the lock: one per directory
        try:
            staging.mkdir()
            outputs = OutputSet(directory, staging, recorded)
            yield outputs
            outputs.commit()
        except OSError as exc:
            failure = write_failure(exc, directory, param, need=max(need_bytes, _size(staging)))
            if failure is None:
                raise
            raise failure from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _size(folder: Path) -> int:
    """Bytes of the files under `folder` (what a run had staged when it failed)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
