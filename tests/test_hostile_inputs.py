"""Every bad input of the adversarial trial (issue 9), each with the one line it must get.

A case is a command line (with `{tmp}`, `{out}` and `{corpus}` placeholders), an optional
setup that writes the files it needs into the test's temporary directory, the exit code and
the patterns the one error line must hold. The contract checked for each (tests/cli_support):
exit code, exactly one line on stderr starting "resstream: error:", no traceback, nothing
written into `{out}`. `docs/reliability.md` counts these cases.

The table is split into sections by theme so that each can grow on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from resstream.cli.main import main
from tests.cli_support import assert_nothing_written
from tests.test_train import corpus_text

#: Flags of a train run small enough for a test (2 layers, d_model 16, 300-token BPE).
TINY_TRAIN = (
    "--n-layer 2 --n-head 2 --d-model 16 --block-size 16 --bpe-vocab-size 300 --batch-size 4 "
    "--eval-interval 3 --eval-batches 1 --checkpoint-interval 3 --quiet --cache-dir {tmp}/cache"
)


@dataclass(frozen=True)
class Hostile:
    """One bad input and the answer it must get."""

    name: str
    command: str  # split on whitespace after the placeholders are filled in
    patterns: tuple[str, ...]  # each must occur in the error line
    exit_code: int = 2
    setup: Callable[[Path], None] | None = field(default=None, compare=False)


# ------------------------------------------------------------------ run directories and outputs
OUTPUT_CASES: list[Hostile] = []

# ------------------------------------------------------------------ checkpoints and weights
CHECKPOINT_CASES: list[Hostile] = []

# ------------------------------------------------------------------ sizes, memory and numbers
BUDGET_CASES: list[Hostile] = []

# ------------------------------------------------------------------ corpora and text inputs


def _write(name: str, text: str) -> Callable[[Path], None]:
    """A setup that writes `text` into the file `name` of the test's directory."""
    return lambda tmp: (tmp / name).write_text(text, encoding="utf-8")


def _mkdir(name: str) -> Callable[[Path], None]:
    """A setup that makes the directory `name` in the test's directory."""
    return lambda tmp: (tmp / name).mkdir()


_TRAIN_SMALL = "train --dataset {corpus} --n-layer 2 --n-head 2 --d-model 16 --block-size 16 --quiet"

DATA_CASES: list[Hostile] = [
    Hostile(
        "jsonl-token-id-beyond-int64",
        "shift --dataset {tmp}/big.jsonl --out {out}",
        (
            "big.jsonl",
            "row 2",
            "token id 100000000000000000000000000000",
            "outside the model's vocabulary",
            "allowed: 0..",
        ),
        setup=_write(
            "big.jsonl", '{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 100000000000000000000000000000]}\n'
        ),
    ),
    Hostile(
        "jsonl-mixing-token-rows-and-text-rows",
        "shift --dataset {tmp}/mixed.jsonl --out {out}",
        ("mixed.jsonl", "mixes 'input_ids' rows and 'text' rows", "row 1 has 'input_ids', row 2 has 'text'"),
        setup=_write("mixed.jsonl", '{"input_ids": [1, 2, 3]}\n{"text": "hello there"}\n'),
    ),
    Hostile(
        "train-on-jsonl-mixing-text-rows-and-token-rows",
        "train --dataset {tmp}/mixed.jsonl {train} --out {out}",
        ("mixed.jsonl", "mixes 'input_ids' rows and 'text' rows", "row 1 has 'text', row 2 has 'input_ids'"),
        setup=_write("mixed.jsonl", '{"text": "hello there"}\n{"input_ids": [1, 2, 3]}\n'),
    ),
    Hostile(
        "lens-text-file-is-a-directory",
        "lens --text-file {tmp}/folder --out {out}",
        ("--text-file", "folder' is a directory", "give a UTF-8 text file", "--text"),
        setup=_mkdir("folder"),
    ),
    Hostile(
        "data-dir-is-a-file",
        "shift --dataset ptb --data-dir {corpus} --out {out}",
        ("--data-dir", "corpus.txt' is a file, not a directory"),
    ),
    Hostile(
        "cache-dir-is-a-file",
        _TRAIN_SMALL + " --cache-dir {corpus} --out {out}",
        ("--cache-dir", "corpus.txt' is a file, not a directory"),
    ),
]

CASES = OUTPUT_CASES + CHECKPOINT_CASES + BUDGET_CASES + DATA_CASES


def fill(command: str, tmp: Path) -> list[str]:
    """The command line with its placeholders filled in, split into arguments."""
    text = command.replace("{train}", TINY_TRAIN)
    text = text.replace("{tmp}", str(tmp)).replace("{out}", str(tmp / "out"))
    return text.replace("{corpus}", str(tmp / "corpus.txt")).split()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_input_gets_one_line(case: Hostile, tmp_path, capsys):
    (tmp_path / "corpus.txt").write_text(corpus_text(), encoding="utf-8")
    if case.setup is not None:
        case.setup(tmp_path)
    capsys.readouterr()
    code = main(fill(case.command, tmp_path))
    err = capsys.readouterr().err.strip()
    assert code == case.exit_code, err
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error:"), err
    assert "Traceback" not in err, err
    for pattern in case.patterns:
        assert pattern in err, (pattern, err)
    assert_nothing_written(tmp_path / "out")


def test_case_names_are_unique():
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
