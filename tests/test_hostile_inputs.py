"""Every bad input of the adversarial trial (issue 9), each with the one line it must get.

A case is a command line (with `{tmp}`, `{out}` and `{corpus}` placeholders), an optional
setup that writes the files it needs into the test's temporary directory, the exit code and
the patterns the one error line must hold. The contract checked for each (tests/cli_support):
exit code, exactly one line on stderr starting "resstream: error:", no traceback, nothing
written into `{out}`. `docs/reliability.md` counts these cases.

The table is split into sections by theme so that each can grow on its own.
"""

from __future__ import annotations

import json
import shutil
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
def run_with_model_json(**changes) -> Callable[[Path], None]:
    """Setup: `{tmp}/run`, the built-in reference model's directory without its weights (the
    refusal must come before they are read), with `changes` in model.json's model config."""

    def setup(tmp: Path) -> None:
        from resstream.assets import reference_model_dir

        run = tmp / "run"
        shutil.copytree(reference_model_dir(), run, ignore=shutil.ignore_patterns("*.safetensors"))
        meta = json.loads((run / "model.json").read_text(encoding="utf-8"))
        meta["config"]["model"].update(changes)
        (run / "model.json").write_text(json.dumps(meta), encoding="utf-8")

    return setup


def hf_model_with_config(**changes) -> Callable[[Path], None]:
    """Setup: `{tmp}/hf`, a tiny GPT-2 Hugging Face directory (config.json and a tokenizer, no
    weights: the refusal must come before they are read) with `changes` in config.json."""

    def setup(tmp: Path) -> None:
        from transformers import GPT2Config

        hf = tmp / "hf"
        hf.mkdir()
        config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=300, n_positions=32).to_dict()
        config.update(architectures=["GPT2LMHeadModel"], **changes)
        (hf / "config.json").write_text(json.dumps(config), encoding="utf-8")
        (hf / "tokenizer.json").write_text("{}", encoding="utf-8")

    return setup


SHIFT = "shift --dataset {corpus} --num-seqs 2 --seq-len 8 --quiet --out {out} --model"
_TRAIN = "train --dataset {corpus} {train} --out {out}"
_SWEEP = "sweep --dataset {corpus} {train} --max-steps 3 --out {out}"
_SIMULATE = "simulate --quiet --out {out}"
BUDGET_CASES: list[Hostile] = [
    # sizes of a model to train: refused before the corpus is read or a tokenizer trained
    Hostile(
        "train-n-layer-1e9",
        f"{_TRAIN} --n-layer 1000000000",
        ("--n-layer 1000000000", "needs ~", "available"),
    ),
    Hostile("train-d-model-1e9", f"{_TRAIN} --d-model 1000000000", ("--d-model 1000000000", "needs ~")),
    Hostile(
        "train-block-size-1e12",
        f"{_TRAIN} --block-size 1000000000000",
        ("--block-size 1000000000000", "needs ~"),
    ),
    Hostile(
        "train-vocab-size-1e12",
        f"{_TRAIN} --vocab-size 1000000000000",
        ("--vocab-size 1000000000000 is outside [0, 2**32]",),
    ),
    Hostile(
        "train-vocab-size-negative", f"{_TRAIN} --vocab-size -5", ("--vocab-size -5 is outside [0, 2**32]",)
    ),
    Hostile("train-n-layer-zero", f"{_TRAIN} --n-layer 0", ("--n-layer 0 is outside [1, inf)",)),
    Hostile(
        "train-bpe-vocab-size-1e9",
        f"{_TRAIN} --bpe-vocab-size 1000000000",
        ("--bpe-vocab-size 1000000000", "needs ~"),
    ),
    # numbers that crashed inside torch, or ran forever
    Hostile("train-beta1-2", f"{_TRAIN} --beta1 2", ("--beta1 2.0 is outside [0, 1)",)),
    Hostile("train-beta1-negative", f"{_TRAIN} --beta1 -1", ("--beta1 -1.0 is outside [0, 1)",)),
    Hostile(
        "train-seed-2**64",
        f"{_TRAIN} --seed 18446744073709551616",
        ("--seed 18446744073709551616 is outside [0, 2**32)",),
    ),
    Hostile("train-lr-1e38", f"{_TRAIN} --lr 1e38", ("--lr 1e+38 is outside (0, 1e+06]",)),
    Hostile(
        "train-threads-1e6",
        f"{_TRAIN} --threads 1000000",
        ("--threads 1000000 is more than 4 per CPU", "allowed: 0"),
    ),
    Hostile(
        "train-max-steps-1e20",
        f"{_TRAIN} --max-steps 100000000000000000000",
        ("--max-steps 100000000000000000000 would take at least ~", "years", "allowed: --max-steps <= "),
    ),
    Hostile("train-max-steps-1e20-as-float", f"{_TRAIN} --max-steps 1e20", ("--max-steps", "'1e20'")),
    Hostile("sweep-n-layer-1e9", f"{_SWEEP} --n-layer 1000000000", ("--n-layer 1000000000", "needs ~")),
    Hostile(
        "sweep-seeds-2**64",
        f"{_SWEEP} --seeds 18446744073709551616",
        ("--seeds 18446744073709551616 is outside [0, 2**32)",),
    ),
    # simulations
    Hostile(
        "simulate-layers-1e9",
        f"{_SIMULATE} --layers 1000000000",
        ("--layers 1000000000 needs ~", "allowed: --layers <= "),
    ),
    Hostile(
        "simulate-sims-1e15",
        f"{_SIMULATE} --sims 1000000000000000",
        ("--sims 1000000000000000", "would take at least ~", "years"),
    ),
    Hostile(
        "simulate-tokens-1e9",
        f"{_SIMULATE} --tokens 1000000000",
        ("--tokens 1000000000 needs ~", "allowed: --tokens <= "),
    ),
    # model configs of analysed models: refused before building the model or reading weights
    Hostile(
        "shift-model-json-n-layer-1e9",
        f"{SHIFT} {{tmp}}/run",
        ("model.json' with n_layer 1000000000", "needs ~"),
        setup=run_with_model_json(n_layer=1_000_000_000),
    ),
    Hostile(
        "eval-model-json-n-layer-1e9",
        "eval --quiet --out {out} --model {tmp}/run",
        ("model.json' with n_layer 1000000000", "needs ~"),
        setup=run_with_model_json(n_layer=1_000_000_000),
    ),
    Hostile(
        "shift-model-json-vocab-size-negative",
        f"{SHIFT} {{tmp}}/run",
        ("model.json' holds a bad config: vocab_size -5 is outside",),
        setup=run_with_model_json(vocab_size=-5),
    ),
    Hostile(
        "shift-config-json-n-layer-1e9",
        f"{SHIFT} {{tmp}}/hf",
        ("config.json' with n_layer 1000000000", "needs ~"),
        setup=hf_model_with_config(n_layer=1_000_000_000),
    ),
    Hostile(
        "shift-config-json-vocab-size-negative",
        f"{SHIFT} {{tmp}}/hf",
        ("config.json' has vocab_size -5; allowed: an integer >= 1",),
        setup=hf_model_with_config(vocab_size=-5),
    ),
    Hostile(
        "shift-config-json-vocab-size-1e12",
        f"{SHIFT} {{tmp}}/hf",
        ("config.json' with vocab_size 1000000000000", "needs ~"),
        setup=hf_model_with_config(vocab_size=10**12),
    ),
    Hostile(
        "shift-config-json-n-positions-1e12",
        f"{SHIFT} {{tmp}}/hf",
        ("config.json' with n_positions 1000000000000", "needs ~"),
        setup=hf_model_with_config(n_positions=10**12),
    ),
    Hostile(
        "shift-config-json-n-embd-1e9",
        f"{SHIFT} {{tmp}}/hf",
        ("config.json' with n_embd 1000000000", "needs ~"),
        setup=hf_model_with_config(n_embd=10**9),
    ),
]

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
