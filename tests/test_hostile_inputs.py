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
SIMULATE = "simulate --layers 2 --tokens 5 --dim 4 --sims 20 --quiet"


def a_training_run(tmp: Path) -> None:
    """A directory that holds a training run (its model.json and run.json)."""
    (tmp / "run").mkdir()
    (tmp / "run" / "model.json").write_text("{}")
    (tmp / "run" / "run.json").write_text('{"config": {"model": {}}}')


def a_file_named(name: str) -> Callable[[Path], None]:
    return lambda tmp: (tmp / name).write_text("a file, not a directory")


OUTPUT_CASES: list[Hostile] = [
    Hostile(
        "out-is-a-file",
        f"{SIMULATE} --out {{tmp}}/taken",
        ("--out", "taken", "is a file"),
        2,
        a_file_named("taken"),
    ),
    Hostile(
        "out-below-a-file",
        f"{SIMULATE} --out {{tmp}}/taken/out",
        ("cannot write to --out", "a parent is a file, not a directory"),
        2,
        a_file_named("taken"),
    ),
    Hostile(
        "analysis-into-a-training-run",
        f"{SIMULATE} --out {{tmp}}/run",
        ("--out", "holds the outputs of resstream train", "choose another directory"),
        2,
        a_training_run,
    ),
    Hostile(
        "eval-into-its-own-run",
        "eval --model {tmp}/run --out {tmp}/run --quiet",
        ("--out", "holds the outputs of resstream train"),
        2,
        a_training_run,
    ),
]

# ------------------------------------------------------------------ checkpoints and weights
CHECKPOINT_CASES: list[Hostile] = []

# ------------------------------------------------------------------ sizes, memory and numbers
BUDGET_CASES: list[Hostile] = []

# ------------------------------------------------------------------ corpora and text inputs
DATA_CASES: list[Hostile] = []

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
