"""What the tuned-lens tests share: a slice of the reference model's own corpus as a file."""

from __future__ import annotations

from pathlib import Path


def plays_file(directory: Path, chars: int) -> Path:
    """The first `chars` characters of the built-in corpus (the reference model's own text),
    written to ``plays.txt`` in `directory`."""
    from resstream.data.plays import load_plays

    documents, _ = load_plays()
    path = directory / "plays.txt"
    path.write_text(documents[0][:chars], encoding="utf-8")
    return path
