"""WikiText layout: Hugging Face rows, the raw text they make, and its articles.

Hugging Face ``Salesforce/wikitext`` gives one row per line of the zip's ``wiki.*.raw`` file:
``""`` for a blank line (written there as ``" \\n"``), else the line with its ``"\\n"``. The
raw text splits into articles at its top-level `` = Title = `` headings.

A local copy is either raw text, or the rows written one per line (``f.write(row + "\\n")``)
in a file whose name ends in `HF_ROWS_SUFFIX`; `articles_from_file` reads both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from resstream.data.files import read_text

#: The name ending of a file that holds Hugging Face rows, one per line.
HF_ROWS_SUFFIX = ".hf-rows.txt"

_LINES = re.compile(r"[^\n]*\n|[^\n]+$")  # lines with their "\n"; only "\n" ends a line


def wikitext_raw_from_rows(rows: Iterable[str]) -> str:
    """Raw WikiText text (the zip's `wiki.*.raw` layout) from Hugging Face rows.

    Each HF row is either ``""`` (a blank line of the raw file, written there as ``" \\n"``)
    or a line that already ends in ``"\\n"``.
    """
    return "".join(row if row else " \n" for row in rows)


def wikitext_rows_from_file(text: str) -> list[str]:
    """Recover the HF rows from a file written as ``for row in rows: f.write(row + "\\n")``.

    A non-empty line is a row (plus its newline) followed by one extra empty line, which is
    skipped; an empty line is an empty row. Lines are ``text.split("\\n")``, so the text
    after the final newline counts as a last (empty) line: the shared copy of the WikiText-2
    test rows lacks the newline of its final empty row, and this walk restores all 4358
    rows (the last one blank, as in ``wiki.test.tokens``).
    """
    lines = text.split("\n")
    rows, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line:
            rows.append(line + "\n")
            i += 2 if i + 1 < len(lines) and lines[i + 1] == "" else 1
        else:
            rows.append("")
            i += 1
    return rows


def split_wikitext_articles(raw: str) -> list[str]:
    """Split raw WikiText at its top-level `` = Title = `` headings, one article each.

    Text before the first heading (blank lines) goes with the first article, so the
    articles concatenate back to `raw` exactly. (The WikiText-2 test set gives 62: two
    formula lines inside "Constant k filter" look like headings, as in other splitters.)
    """
    articles: list[str] = []
    current: list[str] = []
    has_heading = False
    for line in _LINES.findall(raw):
        if _is_top_heading(line):
            if has_heading:
                articles.append("".join(current))
                current = []
            has_heading = True
        current.append(line)
    if current:
        articles.append("".join(current))
    return articles


def articles_from_rows(rows: Iterable[str]) -> list[str]:
    """The articles of the raw text that Hugging Face rows make."""
    return split_wikitext_articles(wikitext_raw_from_rows(rows))


def articles_from_file(path: Path) -> list[str]:
    """The articles of a local copy: raw text, or rows if its name ends in `HF_ROWS_SUFFIX`."""
    text = read_text(path)
    if path.name.endswith(HF_ROWS_SUFFIX):
        return articles_from_rows(wikitext_rows_from_file(text))
    return split_wikitext_articles(text)


def _is_top_heading(line: str) -> bool:
    body = line.rstrip("\n")
    return body.startswith(" = ") and body.endswith(" = ") and not body.startswith(" = = ") and len(body) > 6
