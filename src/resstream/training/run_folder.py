"""A run folder's safety: its names checked before a run starts, and what interrupted writers
left behind removed (and nothing else).

A run writes into its `out_dir` only at names it owns (`checkpoint_layout.RUN_FILES`,
``checkpoints/``, ``tokenizer/``); each must be the kind of entry the run makes and never a
link (`check_run_folders`), so that neither writing nor pruning leaves the folder.
`remove_leftovers` clears the temporary and trash names of interrupted writes and removals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from resstream import rundir
from resstream.data.tokenizer import STAGING_PREFIX as TOKENIZER_STAGING_PREFIX
from resstream.errors import UsageError
from resstream.io import check_inside, is_real_directory, is_temporary_name, kind_of
from resstream.training.checkpoint_layout import (
    CHECKPOINTS,
    DIVERGED,
    LATEST,
    RUN_FILES,
    TOKENIZER_DIR,
    VERIFIED,
    remove_hidden_dirs,
    step_dirs,
)

#: Files that atomic writers (`io.atomic_path`: `.NAME.<random>.tmp`) write, per directory.
_CHECKPOINT_FILES = (LATEST,)
_MARKER_FILES = (VERIFIED, DIVERGED)
#: safetensors' own temporary file beside its target (Rust `tempfile`: `.tmp` + 6 characters).
_SAFETENSORS_TMP = re.compile(r"\.tmp[A-Za-z0-9]{6}")
#: `data.save_tokenizer`'s staging folder (`tempfile.mkdtemp` with its prefix).
_TOKENIZER_STAGING = re.compile(re.escape(TOKENIZER_STAGING_PREFIX) + r"[A-Za-z0-9_]{8}")


def check_run_folders(run_dir: Path, files: Iterable[str] = ()) -> None:
    """UsageError, before a run starts, when a name the run writes in `run_dir` is a link or
    the wrong kind of entry: a folder (`checkpoints`, `tokenizer`) that is a link or a file
    (written through, it would put the run's files, and its pruning, outside `run_dir`), or
    a file (its own and `files`) that is a link or a folder (a link would be read on resume; a
    folder would stop the run at its end)."""
    entries = [(CHECKPOINTS, "a directory"), (TOKENIZER_DIR, "a directory")]
    entries += [(name, "a regular file") for name in (*RUN_FILES, *files)]
    try:
        for name, expected in entries:
            check_inside(run_dir, Path(run_dir) / name, expected)
    except UsageError as exc:
        raise UsageError(f"`out_dir` {str(run_dir)!r}: {exc}") from None


def _atomic_tmp(name: str, files: Iterable[str]) -> bool:
    """Whether `name` is `io.atomic_path`'s temporary file for one of `files`."""
    return is_temporary_name(name) and any(name.startswith(f".{f}.") for f in files)


def remove_leftovers(run_dir: Path) -> None:
    """Remove every temporary or trash name that an interrupted writer of a run leaves, and
    nothing else: half-written files of the atomic writers, safetensors' temporary file, the
    tokenizer's staging folder, interrupted checkpoint saves and removals.

    Called by the trainer once its checks have passed, and by `distributed.run_lock` as soon
    as it holds a folder that already holds a run (`rundir.previous_command`), before any
    check, so a refused resume cleans up too. Nothing else writes into `run_dir` then. Each
    name is removed only as the kind of entry its writer makes (a temporary file is never a
    folder); a link at such a name is removed, never followed, and a `checkpoints` that is a
    link is not entered.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    rundir.remove_leftovers(run_dir)  # the atomic writers' temporaries, as in any --out
    for path in run_dir.iterdir():
        kind = kind_of(path)
        safetensors_tmp = _SAFETENSORS_TMP.fullmatch(path.name) and kind != "a directory"
        staging = _TOKENIZER_STAGING.fullmatch(path.name) and kind in ("a directory", "a symbolic link")
        if safetensors_tmp or staging:
            rundir.remove_entry(path)
    root = run_dir / CHECKPOINTS
    if not is_real_directory(root):  # a link is never followed (and a run refuses it: `folder_inside`)
        return
    remove_hidden_dirs(root)
    for path in root.iterdir():
        if _atomic_tmp(path.name, _CHECKPOINT_FILES) and not is_real_directory(path):
            rundir.remove_entry(path)
    for step_dir in step_dirs(root).values():
        for path in step_dir.iterdir():
            if _atomic_tmp(path.name, _MARKER_FILES) and not is_real_directory(path):
                rundir.remove_entry(path)
