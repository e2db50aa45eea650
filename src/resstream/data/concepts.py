"""Two sets of texts that differ in one concept: read from files, or built from the plays.

Files (`read_text_set`, `read_pairs`): a set is a `.jsonl` file of ``{"text": ...}`` rows or any
other UTF-8 file with one text per line (blank lines skipped); contrast pairs are a `.jsonl` file
of ``{"positive": ..., "negative": ...}`` rows. An empty text, a row of another shape and a file
that holds no text are refused in one line that names the file and the row.

Built-in concepts (`concept_texts`), offline, from the plays of the built-in corpus
(`resstream.data.plays`):

* ``comedy-tragedy``: passages of the comedies `COMEDIES` (positive) against passages of the
  tragedies `TRAGEDIES` (negative), chosen by title;
* ``speaker:NAME``: passages spoken by NAME (as the plays head the speech, any case: HAMLET,
  LADY MACBETH) against passages spoken by everyone else in the plays where NAME speaks.

A passage is up to `PASSAGE_LINES` consecutive spoken lines of one speech (at least 2, at most
`PASSAGE_CHARS` characters), joined by newlines: the speaker's heading, stage directions and
act and scene headings are left out, so the speaker's name is never in the text. Each set holds
at most `CONCEPT_TEXTS` passages, drawn with a seeded shuffle (`seed`) in turn from each play,
so that no play crowds out the others.
"""

from __future__ import annotations

import functools
import os
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from resstream.data.files import jsonl_texts, read_text
from resstream.errors import UsageError, closest

#: The comedies and tragedies of ``comedy-tragedy``, by the title each play's text starts with.
COMEDIES = (
    "A Midsummer Night's Dream",
    "As You Like It",
    "Love's Labours Lost",
    "Much Ado About Nothing",
    "The Comedy of Errors",
    "The Merry Wives of Windsor",
    "Twelfth Night",
    "Two Gentlemen of Verona",
)
TRAGEDIES = (
    "Hamlet",
    "King Lear",
    "Macbeth",
    "Othello",
    "Romeo and Juliet",
    "Timon of Athens",
    "Antony and Cleopatra",
    "Coriolanus",
    "Julius Caesar",
    "Titus Andronicus",
)
#: The built-in concepts' names (``speaker:`` takes a name after it).
CONCEPTS = ("comedy-tragedy", "speaker:NAME")
#: Spoken lines per passage (at most), the fewest kept, and the most characters one may hold.
PASSAGE_LINES = 4
PASSAGE_MIN_LINES = 2
PASSAGE_CHARS = 280
#: The most passages a built-in concept's set holds.
CONCEPT_TEXTS = 256

#: A speech's heading: a name in capitals ("LADY MACBETH", "FIRST CITIZEN"), or a short title
#: of capitalised words without punctuation ("First Citizen", "Nurse").
_CAPITALS = re.compile(r"[A-Z][A-Z' .&-]*")
_TITLE = re.compile(r"(?:[A-Z][a-z']*)(?: [A-Z][a-z']*){0,3}")
#: Lines that are not speech: act and scene headings, stage directions.
_HEADINGS = re.compile(r"(ACT|SCENE|PROLOGUE|EPILOGUE|INDUCTION)\b", re.IGNORECASE)
_DIRECTIONS = frozenset(
    {"Enter", "Exit", "Exeunt", "Re-enter", "Flourish", "Alarum", "Alarums", "Sennet", "Dies"}
)


@dataclass(frozen=True)
class ContrastTexts:
    """Two sets of texts: `positive` (the concept) and `negative`; `paired` when the i-th texts
    of the two sets form a contrast pair; `source` says where they came from (for records)."""

    positive: tuple[str, ...]
    negative: tuple[str, ...]
    paired: bool
    source: str


# --------------------------------------------------------------------------- files


def read_text_set(path: str | os.PathLike[str], what: str) -> tuple[str, ...]:
    """The texts of one set's file (module docstring); `what` names it in messages (a
    parameter in backticks). UsageError for a missing or unreadable file, an empty text or a
    file without any."""
    file = Path(path)
    if file.suffix == ".jsonl":
        texts = []
        for number, text in enumerate(jsonl_texts(file), start=1):
            if not text.strip():
                raise UsageError(f"{what} {str(file)!r} row {number} is an empty text")
            texts.append(text)
    else:
        texts = [line for line in read_text(file, what).splitlines() if line.strip()]
    if not texts:
        raise UsageError(f"{what} {str(file)!r} holds no text; give one text per line or per row")
    return tuple(texts)


def read_pairs(path: str | os.PathLike[str], what: str = "`pairs`") -> tuple[tuple[str, str], ...]:
    """The contrast pairs of a `.jsonl` file of ``{"positive": ..., "negative": ...}`` rows
    (blank lines skipped); UsageError naming the row for any other row or an empty text."""
    import json

    file = Path(path)
    if file.suffix != ".jsonl":
        raise UsageError(f"{what} {str(file)!r} is not a .jsonl file; allowed: rows of positive and negative")
    pairs = []
    for lineno, line in enumerate(read_text(file, what).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{what} {str(file)!r} line {lineno} is not valid JSON: {exc.msg}") from None
        texts = [row.get(key) if isinstance(row, dict) else None for key in ("positive", "negative")]
        if not all(isinstance(text, str) and text.strip() for text in texts):
            raise UsageError(
                f"{what} {str(file)!r} line {lineno} needs a non-empty string 'positive' and 'negative'"
            )
        pairs.append((str(texts[0]), str(texts[1])))
    if not pairs:
        raise UsageError(f"{what} {str(file)!r} holds no pair; give one JSON row per pair")
    return tuple(pairs)


# --------------------------------------------------------------------------- the plays


@dataclass(frozen=True)
class Speech:
    """One speech of a play: its `play` (title), `speaker` (the heading, in capitals) and
    spoken `lines`."""

    play: str
    speaker: str
    lines: tuple[str, ...]


def play_speeches(text: str) -> Iterator[Speech]:
    """The speeches of one play's plain text (`resstream.data.plays`), in order. A block (lines
    between blank lines) that starts with a heading opens a speech; a block without one that
    follows a stage direction continues the speech before it; headings and stage directions
    are never speech."""
    blocks = [[line.strip() for line in block.splitlines() if line.strip()] for block in text.split("\n\n")]
    title = blocks[0][0] if blocks and blocks[0] else ""
    if _HEADINGS.match(title):  # a play whose text starts with its first act has no title line
        title = "(untitled play)"
    speaker: str | None = None
    for block in blocks[1:]:
        if not block:
            continue
        first = block[0]
        if _HEADINGS.match(first):
            speaker = None
            continue
        if first.split()[0] in _DIRECTIONS or first.startswith("["):
            continue  # a stage direction: the speech before it may go on in the next block
        if len(block) > 1 and (_CAPITALS.fullmatch(first) or _TITLE.fullmatch(first)):
            speaker, block = first.upper(), block[1:]
        if speaker is None:
            continue
        spoken = tuple(line for line in block if not _is_direction(line))
        if spoken:
            yield Speech(title, speaker, spoken)


def _is_direction(line: str) -> bool:
    return line.startswith("[") or line.split()[0] in _DIRECTIONS


def passages(lines: Sequence[str]) -> Iterator[str]:
    """One speech's lines cut into passages of `PASSAGE_LINES` lines (the last one shorter),
    those under `PASSAGE_MIN_LINES` lines or over `PASSAGE_CHARS` characters left out."""
    for start in range(0, len(lines), PASSAGE_LINES):
        chunk = lines[start : start + PASSAGE_LINES]
        text = "\n".join(chunk)
        if len(chunk) >= PASSAGE_MIN_LINES and len(text) <= PASSAGE_CHARS:
            yield text


def concept_texts(name: str, *, per_set: int = CONCEPT_TEXTS, seed: int = 0) -> ContrastTexts:
    """The positive and negative passages of built-in concept `name` (module docstring), at
    most `per_set` each, unpaired. UsageError for an unknown concept or speaker."""
    if name == "comedy-tragedy":
        speeches = _speeches_by_play()
        missing = [title for title in (*COMEDIES, *TRAGEDIES) if title not in speeches]
        if missing:
            raise UsageError(f"the built-in plays lack {', '.join(map(repr, missing))}")
        positive = _drawn({title: speeches[title] for title in COMEDIES}, None, per_set, seed)
        negative = _drawn({title: speeches[title] for title in TRAGEDIES}, None, per_set, seed)
        source = f"concept comedy-tragedy: {len(COMEDIES)} comedies against {len(TRAGEDIES)} tragedies"
        return ContrastTexts(positive, negative, paired=False, source=source)
    if name.startswith("speaker:") and name.removeprefix("speaker:").strip():
        return _speaker_texts(name.removeprefix("speaker:").strip().upper(), per_set, seed)
    raise UsageError(
        f"unknown `concept` {name!r}{closest(name, CONCEPTS[:1])}; allowed: comedy-tragedy, "
        f"speaker:NAME (a speaker of the plays, e.g. speaker:HAMLET)"
    )


def _speaker_texts(speaker: str, per_set: int, seed: int) -> ContrastTexts:
    """Passages of `speaker` against those of everyone else in the plays where they speak."""
    speeches = _speeches_by_play()
    plays = {title: found for title, found in speeches.items() if any(s.speaker == speaker for s in found)}
    if not plays:
        names = sorted({s.speaker for found in speeches.values() for s in found})
        raise UsageError(
            f"no speaker {speaker!r} in the plays{closest(speaker, names)}; allowed: speaker:NAME "
            f"with a name that heads speeches, e.g. speaker:HAMLET"
        )
    positive = _drawn(plays, lambda s: s.speaker == speaker, per_set, seed)
    negative = _drawn(plays, lambda s: s.speaker != speaker, len(positive), seed)
    source = f"concept speaker:{speaker}: {speaker} against the other speakers of {', '.join(plays)}"
    return ContrastTexts(positive, negative, paired=False, source=source)


@functools.cache
def _speeches_by_play() -> dict[str, tuple[Speech, ...]]:
    """Every play's speeches, by title (read once per process: the plays do not change)."""
    from resstream.data.plays import load_plays

    plays, _ = load_plays()
    found: dict[str, tuple[Speech, ...]] = {}
    for text in plays:
        speeches = tuple(play_speeches(text))
        if speeches:
            found[speeches[0].play] = found.get(speeches[0].play, ()) + speeches
    return found


def _drawn(
    plays: Mapping[str, Sequence[Speech]], keep: Callable[[Speech], bool] | None, count: int, seed: int
) -> tuple[str, ...]:
    """At most `count` passages of the speeches `keep` accepts (None: all), each play's
    passages shuffled with `seed` and taken from the plays in turn."""
    rng = random.Random(seed)
    queues = []
    for title in plays:
        found = [p for s in plays[title] if keep is None or keep(s) for p in passages(s.lines)]
        rng.shuffle(found)
        queues.append(found)
    drawn: list[str] = []
    while len(drawn) < count and any(queues):
        for queue in queues:
            if queue and len(drawn) < count:
                drawn.append(queue.pop())
    return tuple(drawn)


__all__ = [
    "COMEDIES",
    "CONCEPTS",
    "CONCEPT_TEXTS",
    "PASSAGE_CHARS",
    "PASSAGE_LINES",
    "PASSAGE_MIN_LINES",
    "TRAGEDIES",
    "ContrastTexts",
    "Speech",
    "concept_texts",
    "passages",
    "play_speeches",
    "read_pairs",
    "read_text_set",
]
