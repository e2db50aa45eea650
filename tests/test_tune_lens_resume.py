"""tune-lens's budget (`--steps` alone keeps the recipe's step size) and its checkpoints: Ctrl-C
finishes the current step, saves, and stops; `resume` continues bit for bit.

Spec (issue 23, item 3): `steps` alone trains that many steps of the recipe's 2,048 tokens;
`tokens` and `steps` both given divide, with a notice when a step is then over 2× from the
recipe's; what was settled is recorded (lens.json, run.json). With a checkpoint folder the run
saves every `checkpoint_every` steps, after the last, and when the first SIGINT asks it to stop
(after the current step; `KeyboardInterrupt`, exit 130); a resume from either checkpoint gives
the translators and the evaluation of an uninterrupted run exactly; a resume with other settings,
a resume with nothing to resume and a fresh run over an unfinished checkpoint are one line, exit 2.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

import resstream
from resstream import interrupts
from resstream.analysis.decoding.lens_checkpoint import CHECKPOINT_FILE, load_checkpoint
from resstream.analysis.decoding.lens_training import LensOptimiser
from resstream.api.lens_trainer import LensTrainer
from resstream.api.tune_lens import DEFAULT_TOKENS, DEFAULT_TOKENS_PER_STEP, LensBudget, settle_budget
from resstream.cli.main import main
from resstream.errors import UsageError
from resstream.notices import ResstreamNotice
from tests.lens_support import plays_file

pytestmark = [
    pytest.mark.usefixtures("hf_offline", "one_torch_thread", "default_signal_handlers"),
    # the API runs' small steps are deliberate (the command-line runs check the notice)
    pytest.mark.filterwarnings(
        "ignore:`tokens` (768|128) over `steps` (6|1):resstream.notices.ResstreamNotice"
    ),
]

#: 6 steps of 4 windows of 32 tokens, 4 held out, micro-batches of 2 (so a step sums two).
RUN = {"tokens": 768, "steps": 6, "seq_len": 32, "eval_seqs": 4, "batch_size": 2}
FAST = ["--device", "cpu", "--quiet"]
#: The same run on the command line, 4 steps.
CLI_RUN = ["--tokens", "512", "--steps", "4", "--seq-len", "32", "--eval-seqs", "4", "--batch-size", "2"]


@pytest.fixture(scope="module")
def plays(tmp_path_factory) -> Path:
    """30,000 characters of the built-in corpus (the reference model's own text) as a file."""
    return plays_file(tmp_path_factory.mktemp("corpus"), 30_000)


def tune(plays: Path, directory: Path | None, **overrides):
    options = {**RUN, "optimiser": LensOptimiser(lr=0.01), **overrides}
    return resstream.tune_lens(None, dataset=str(plays), device="cpu", checkpoint_dir=directory, **options)


@pytest.fixture(scope="module")
def uninterrupted(plays, tmp_path_factory):
    """The run without interruption (saving checkpoints, as every run with a folder does)."""
    return tune(plays, tmp_path_factory.mktemp("whole"))


def ctrl_c_during_step(monkeypatch, step: int, *, hard: bool = False) -> None:
    """Ctrl-C while step `step` (1-based) runs: SIGINT raised in the real step before its work
    (`hard`: the KeyboardInterrupt of a second Ctrl-C instead, which stops at once)."""
    real = LensTrainer.step

    def step_with_ctrl_c(self, windows):
        if self.steps_done == step - 1:
            if hard:
                raise KeyboardInterrupt
            signal.raise_signal(signal.SIGINT)
        return real(self, windows)

    monkeypatch.setattr(LensTrainer, "step", step_with_ctrl_c)


def assert_same_run(report, expected) -> None:
    for name in ("weight", "bias"):
        assert torch.equal(getattr(report.lens.translators, name), getattr(expected.lens.translators, name))
    assert report.evaluation == expected.evaluation
    assert report.evaluation.to_dict() == expected.evaluation.to_dict()
    assert report.history == expected.history


# --------------------------------------------------------------------------- the budget


def test_steps_alone_keep_the_recipes_tokens_per_step() -> None:
    assert settle_budget(None, 3) == LensBudget(3 * DEFAULT_TOKENS_PER_STEP, 3, None)
    assert DEFAULT_TOKENS_PER_STEP == 2048
    assert (settle_budget(None, None).tokens, settle_budget(None, None).steps) == (DEFAULT_TOKENS, 250)
    alone = settle_budget(100_000, None)  # tokens alone: over the default steps, no notice
    assert (alone.tokens, alone.steps, alone.note) == (100_000, 250, None)
    assert settle_budget(6_000, 3).note is None  # 2,000 a step: near the recipe's 2,048


@pytest.mark.parametrize(
    ("tokens", "steps", "says"),
    [
        (768, 3, "`tokens` 768 over `steps` 3: 256 tokens a step, 1/8 of the recipe's 2,048"),
        (5_000_000, 10, "`tokens` 5,000,000 over `steps` 10: 500,000 tokens a step, 244× the recipe's 2,048"),
    ],
)
def test_both_given_divide_and_a_step_far_from_the_recipe_is_said(tokens, steps, says) -> None:
    budget = settle_budget(tokens, steps)
    assert (budget.tokens, budget.steps) == (tokens, steps)
    assert budget.note is not None and budget.note.startswith(says), budget.note
    assert "(`steps` alone keeps 2,048 tokens a step)" in budget.note


@pytest.mark.parametrize(("tokens", "steps"), [(0, None), (None, 0), (None, -1), (10, True)])
def test_a_bad_budget_is_refused(tokens, steps) -> None:
    with pytest.raises(UsageError, match=r"is not allowed; allowed: an integer >= 1"):
        settle_budget(tokens, steps)


# --------------------------------------------------------------------------- interrupt and resume (API)


def test_ctrl_c_finishes_the_step_saves_and_a_resume_equals_the_uninterrupted_run(
    plays, uninterrupted, tmp_path, monkeypatch
) -> None:
    ctrl_c_during_step(monkeypatch, 3)
    with (
        pytest.warns(
            ResstreamNotice, match=r"tune-lens stopped at step 3 of 6; checkpoint saved in "
        ) as notes,
        pytest.raises(KeyboardInterrupt),
    ):
        tune(plays, tmp_path)
    assert "continue with `resume=True` and the same settings" in str(notes[-1].message)
    saved = load_checkpoint(tmp_path)
    assert saved is not None and saved.step == 3 and len(saved.history) == 3 and not saved.finished
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_FILE]  # nothing half-written
    assert saved.history == uninterrupted.history[:3]

    monkeypatch.undo()
    resumed = tune(plays, tmp_path, resume=True)
    assert_same_run(resumed, uninterrupted)
    assert resumed.lens.record["resumed_at_steps"] == [3]
    assert uninterrupted.lens.record["resumed_at_steps"] == []
    finished = load_checkpoint(tmp_path)  # the API keeps the last one (the CLI removes it)
    assert finished is not None and finished.finished and finished.step == 6


def test_a_hard_stop_resumes_from_the_last_periodic_checkpoint(
    plays, uninterrupted, tmp_path, monkeypatch
) -> None:
    ctrl_c_during_step(monkeypatch, 4, hard=True)  # a second Ctrl-C: no save, at once
    with pytest.raises(KeyboardInterrupt):
        tune(plays, tmp_path, checkpoint_every=2)
    saved = load_checkpoint(tmp_path)
    assert saved is not None and saved.step == 2
    monkeypatch.undo()
    resumed = tune(plays, tmp_path, checkpoint_every=2, resume=True)
    assert_same_run(resumed, uninterrupted)
    assert resumed.lens.record["resumed_at_steps"] == [2]


def test_resuming_a_finished_checkpoint_trains_nothing_and_evaluates(plays, uninterrupted, tmp_path) -> None:
    tune(plays, tmp_path)
    again = tune(plays, tmp_path, resume=True)
    assert_same_run(again, uninterrupted)
    assert again.lens.record["resumed_at_steps"] == [6]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"optimiser": LensOptimiser(lr=0.02)}, "`lr` 0.01, this run has 0.02"),
        ({"steps": 7}, "`steps` 6, this run has 7"),
        ({"batch_size": 4}, "`batch_size` 2, this run has 4"),
        ({"dtype": "bfloat16"}, "`dtype` 'float32', this run has 'bfloat16'"),
        (
            {"optimiser": LensOptimiser(lr=0.01, momentum=0.5)},
            "the optimiser's momentum 0.9, this run has 0.5",
        ),
    ],
)
def test_a_resume_with_other_settings_names_the_first_that_differs(
    change, says, plays, tmp_path, monkeypatch
) -> None:
    ctrl_c_during_step(monkeypatch, 2)
    with pytest.warns(ResstreamNotice, match="stopped at step 2 of 6"), pytest.raises(KeyboardInterrupt):
        tune(plays, tmp_path)
    monkeypatch.undo()
    before = (tmp_path / CHECKPOINT_FILE).read_bytes()
    with pytest.raises(UsageError) as caught:
        tune(plays, tmp_path, resume=True, **change)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and says in message, message
    assert message.startswith(f"cannot resume the tune-lens run in {str(tmp_path)!r}: it was trained with")
    assert "(step 2 of 6)" in message
    assert (tmp_path / CHECKPOINT_FILE).read_bytes() == before


def test_nothing_to_resume_and_an_unfinished_run_in_the_way(plays, tmp_path, monkeypatch) -> None:
    with pytest.raises(UsageError, match=r"nothing to resume in .*: it holds no tune-lens checkpoint"):
        tune(plays, tmp_path, resume=True)
    with pytest.raises(UsageError, match=r"^`resume=True` needs `checkpoint_dir`"):
        tune(plays, None, resume=True)
    ctrl_c_during_step(monkeypatch, 1)
    with pytest.warns(ResstreamNotice), pytest.raises(KeyboardInterrupt):
        tune(plays, tmp_path)
    monkeypatch.undo()
    with pytest.raises(
        UsageError, match=r"holds the checkpoint of an unfinished tune-lens run \(step 1 of 6\)"
    ):
        tune(plays, tmp_path)


def test_without_a_folder_ctrl_c_interrupts_at_once_and_nothing_is_written(
    plays, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ctrl_c_during_step(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        tune(plays, None)
    assert not any(tmp_path.iterdir())


def test_the_api_is_quiet_unless_asked(plays, capfd) -> None:
    small = {"tokens": 128, "steps": 1, "eval_seqs": 2}
    resstream.evaluate_lens(tune(plays, None, **small).lens, device="cpu")
    assert capfd.readouterr() == ("", "")
    tune(plays, None, progress=True, **small)
    assert "tune-lens reference" in capfd.readouterr().err


# --------------------------------------------------------------------------- the command line


def run_cli(out: Path, plays: Path, *extra: str) -> int:
    return main(
        ["tune-lens", *FAST, *CLI_RUN, "--lr", "0.01", "--dataset", str(plays), *extra, "--out", str(out)]
    )


@pytest.mark.slow
def test_cli_steps_alone_trains_that_many_steps_of_the_recipes_size(plays, tmp_path, capsys) -> None:
    out = tmp_path / "lens"
    steps_alone = ["--steps", "3", "--seq-len", "32", "--eval-seqs", "4", "--dataset", str(plays)]
    code = main(["tune-lens", *FAST, *steps_alone, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "note" not in err, err  # nothing to say: the recipe's step, whole windows
    record = json.loads((out / "lens.json").read_text())["training"]
    assert record["optimiser"]["steps"] == 3 and len(record["kl_bits_per_step"]) == 3
    assert record["tokens"] == 3 * 2048 and record["tokens_per_step"] == 2048
    assert record["train_tokens"] == 3 * 2048 and record["sequences_per_step"] == 2048 // 32
    config = json.loads((out / "run.json").read_text())["config"]
    assert (config["tokens"], config["steps"], config["tokens_per_step"]) == (3 * 2048, 3, 2048)
    assert not (out / CHECKPOINT_FILE).exists()  # the lens is written: the checkpoint is removed


def test_cli_both_given_divide_and_say_so(plays, tmp_path, capsys) -> None:
    out = tmp_path / "lens"
    assert run_cli(out, plays) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "resstream: note: --tokens 512 over --steps 4: 128 tokens a step, 1/16 of the recipe's 2,048 "
        "(--steps alone keeps 2,048 tokens a step)"
    ]
    config = json.loads((out / "run.json").read_text())["config"]
    assert (config["tokens"], config["steps"], config["tokens_per_step"]) == (512, 4, 128)


def test_cli_ctrl_c_then_resume_equals_an_uninterrupted_run(plays, tmp_path, capsys, monkeypatch) -> None:
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert run_cli(whole, plays) == 0
    capsys.readouterr()

    ctrl_c_during_step(monkeypatch, 2)
    assert run_cli(parts, plays) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2:] == [
        f"resstream: note: tune-lens stopped at step 2 of 4; checkpoint saved in {str(parts)!r}; "
        "continue with --resume and the same settings",
        "resstream: error: interrupted; nothing half-written was kept",
    ], err
    assert sorted(p.name for p in parts.iterdir()) == [CHECKPOINT_FILE]
    monkeypatch.undo()
    interrupts.reset()

    code = run_cli(parts, plays, "--resume")
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in parts.iterdir()) == sorted(p.name for p in whole.iterdir())
    for name in ("translators.safetensors", "evaluation.json", "evaluation.csv"):
        assert (parts / name).read_bytes() == (whole / name).read_bytes(), name
    config = json.loads((parts / "run.json").read_text())["config"]
    assert config["resume"] is True and config["resumed_at_steps"] == [2]


def test_cli_resume_refusals_are_one_line_and_keep_the_checkpoint(
    plays, tmp_path, capsys, monkeypatch
) -> None:
    out = tmp_path / "lens"
    ctrl_c_during_step(monkeypatch, 1)
    assert run_cli(out, plays) == 130
    monkeypatch.undo()
    interrupts.reset()
    before = (out / CHECKPOINT_FILE).read_bytes()
    for extra, says in (
        (["--resume", "--lr", "0.02"], "it was trained with --lr 0.01, this run has 0.02"),
        (["--resume", "--seq-len", "16"], "it was trained with --seq-len 32, this run has 16"),
        ([], "holds the checkpoint of an unfinished tune-lens run (step 1 of 4); continue it with --resume"),
        (["--resume", "--eval"], "--resume continues an interrupted training run; it cannot be combined"),
    ):
        capsys.readouterr()
        code = main(
            ["tune-lens", *FAST, *CLI_RUN, "--dataset", str(plays), "--lr", "0.01", *extra, "--out", str(out)]
        )
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith("resstream: error:"), err
        assert says in err, err
        assert sorted(p.name for p in out.iterdir()) == [CHECKPOINT_FILE]
        assert (out / CHECKPOINT_FILE).read_bytes() == before


def test_cli_resume_with_nothing_to_resume(plays, tmp_path, capsys) -> None:
    out = tmp_path / "nothing"
    capsys.readouterr()
    assert run_cli(out, plays, "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("resstream: error: nothing to resume in ") and "without --resume" in err, err
    assert not out.exists()
