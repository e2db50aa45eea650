"""`resstream train` end to end, in-process, and its answers to bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from resstream.cli.main import main
from resstream.training import checkpoint as ckpt
from resstream.training import preparation
from tests.test_train import corpus_text, poison_at

TINY = [
    "--n-layer",
    "2",
    "--n-head",
    "2",
    "--d-model",
    "16",
    "--block-size",
    "16",
    "--bpe-vocab-size",
    "300",
    "--batch-size",
    "4",
    "--eval-interval",
    "3",
    "--eval-batches",
    "1",
    "--checkpoint-interval",
    "3",
    "--quiet",
]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


def run_train(tmp_path, corpus, *extra, quiet: bool = True):
    """`resstream train` of a TINY model on `corpus` into tmp_path/run (`quiet=False`: with
    its progress and status lines)."""
    flags = TINY if quiet else [flag for flag in TINY if flag != "--quiet"]
    return main(
        [
            "train",
            "--dataset",
            str(corpus),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "run"),
            *flags,
            *extra,
        ]
    )


def test_train_then_resume_end_to_end(tmp_path, corpus, capsys):
    assert (
        run_train(
            tmp_path, corpus, "--max-steps", "3", "--gate", "fixed", "--alpha", "0.5", "--cut-layer", "1"
        )
        == 0
    )
    assert "trained 3 steps" in capsys.readouterr().out
    meta = json.loads((tmp_path / "run" / "model.json").read_text())
    assert meta["config"]["model"]["gate"] == "fixed" and meta["config"]["model"]["cut_layer"] == 1
    # --resume needs no repeated flags: the saved config is the base, --max-steps extends it.
    assert main(["train", "--resume", "--out", str(tmp_path / "run"), "--max-steps", "6", "--quiet"]) == 0
    assert ckpt.latest_checkpoint_step(tmp_path / "run") == 6


def test_resuming_a_finished_run_says_it_was_complete_and_writes_nothing(tmp_path, corpus, capsys):
    assert run_train(tmp_path, corpus, "--max-steps", "3") == 0
    capsys.readouterr()
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert main(["train", "--resume", "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert "trained 3 steps" not in captured.out, captured.out
    assert captured.out.startswith(f"{tmp_path / 'run'} was already complete (3 steps; validation loss ")
    assert "nothing trained (resume with --max-steps above 3 to train further)" in captured.out
    assert captured.err == ""
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*") if p.is_file()} == stamps
    # a resume that trains says how many more steps it took
    assert main(["train", "--resume", "--out", str(tmp_path / "run"), "--max-steps", "5", "--quiet"]) == 0
    assert "trained 2 more steps (4 to 5);" in capsys.readouterr().out


def test_train_says_what_it_prepares_before_the_first_step(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.setattr(preparation, "STATUS_DELAY_S", 0.0)  # every step counts as slow
    code = run_train(tmp_path, corpus, "--max-steps", "2", quiet=False)
    err = capsys.readouterr().err
    assert code == 0, err
    status = [line for line in err.splitlines() if line.startswith("preparing: ")]
    assert status == [
        f"preparing: reading the corpus {str(corpus)!r}",
        "preparing: training a 300-token byte-level BPE tokenizer on the corpus",
        f"preparing: the token cache in {str(tmp_path / 'cache')!r} (the corpus is tokenised on first use)",
        "preparing: building the model (2 layers x 16 wide, gate 'none')",
    ], err


def test_train_writes_its_loss_curve_and_a_gated_run_its_gate(tmp_path, corpus):
    import matplotlib.image

    assert run_train(tmp_path, corpus, "--max-steps", "3", "--gate", "learned") == 0
    for name in ("loss_curve.png", "gate.png"):
        image = matplotlib.image.imread(tmp_path / "run" / name)
        assert image.shape[0] > 200 and image.std() > 0, name
    assert main(["train", "--dataset", str(corpus), "--cache-dir", str(tmp_path / "cache"),
                 "--out", str(tmp_path / "plain"), *TINY, "--max-steps", "3"]) == 0  # fmt: skip
    assert (tmp_path / "plain" / "loss_curve.png").is_file() and not (
        tmp_path / "plain" / "gate.png"
    ).exists()


def test_yaml_config_and_flag_override(tmp_path, corpus):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  gate: learned\nrun:\n  max_steps: 2\n")
    assert run_train(tmp_path, corpus, "--config", str(config), "--max-steps", "3") == 0
    meta = json.loads((tmp_path / "run" / "model.json").read_text())
    assert meta["config"]["model"]["gate"] == "learned" and meta["steps"] == 3


def _bad(tmp_path, capsys, args, pattern):
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error:"), err
    assert pattern in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (["--n-layr", "3"], "unknown config key '--n-layr' in flags (did you mean '--n-layer'?)"),
        (["--alpha", "0", "--gate", "fixed"], "--alpha 0.0 is outside (0, 1]"),
        (["--alpha", "1.5", "--gate", "fixed"], "--alpha 1.5 is outside (0, 1]"),
        (["--gate", "fixed", "--cut-layer", "2"], "--cut-layer 2 is outside [0, 2) for 2 layers"),
        (["--gate", "sometimes"], "--gate: 'sometimes' is not allowed"),
        (["--preset", "huge"], "unknown preset 'huge'"),
        (["--block-size", "100000"], "fewer than one batch (4 sequences)"),
        (["--batch-size", "4000"], "fewer than one batch (4000 sequences)"),
        (["--alpha", "0.5"], "--alpha only apply to --gate fixed (the gate is 'none')"),
        (["--gate", "learned", "--cut-layer", "1"], "--cut-layer only apply to --gate fixed"),
        (["--d-mlp", "-1"], "--d-mlp -1 is outside [0, inf) (0: 4 x --d-model)"),
        (["--max-steps", "-1"], "--max-steps -1 is outside [1, inf)"),
    ],
)
def test_bad_train_input(tmp_path, corpus, capsys, extra, pattern):
    _bad(
        tmp_path,
        capsys,
        [
            "train",
            "--dataset",
            str(corpus),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "run"),
            *TINY,
            *extra,
        ],
        pattern,
    )


def test_bad_corpora(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n", encoding="utf-8")
    _bad(
        tmp_path,
        capsys,
        ["train", "--dataset", str(empty), "--out", str(tmp_path / "run"), *TINY],
        "empty.txt",
    )
    binary = tmp_path / "latin1.txt"
    binary.write_bytes(b"caf\xe9 au lait\n")
    _bad(
        tmp_path,
        capsys,
        ["train", "--dataset", str(binary), "--out", str(tmp_path / "run"), *TINY],
        "byte offset 3",
    )
    _bad(
        tmp_path,
        capsys,
        ["train", "--dataset", "no-such-corpus", "--out", str(tmp_path / "run"), *TINY],
        "no-such-corpus",
    )


def tree(root: Path) -> dict[str, int]:
    """Every file under `root` with its modification time (ns)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def assert_resume_below_the_checkpoint_is_refused(run: Path, capsys) -> None:
    """`run` was checkpointed at its final step 3: without its final model (as if stopped after
    the checkpoint) a resume with --max-steps 2 names both steps in one line, from the CLI and
    the API, and leaves the run as it was (no final model of step 3's weights recorded as 2
    steps). The final model is put back."""
    from resstream.api.train import train
    from resstream.errors import UsageError

    final = {name: (run / name).read_bytes() for name in (ckpt.MODEL_FILE, "model.json")}
    for name in final:
        (run / name).unlink()
    before = tree(run)
    code = main(["train", "--resume", "--out", str(run), "--max-steps", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (
        f"resstream: error: --max-steps 2 is below step 3 of the checkpoint in --out {str(run)!r}, "
        "which a resume continues from; give --max-steps 3 or more"
    ), err
    with pytest.raises(UsageError, match=r"`max_steps` 2 is below step 3 of the checkpoint in `out_dir`"):
        train(run, resume=True, max_steps=2)
    assert tree(run) == before
    for name, data in final.items():
        (run / name).write_bytes(data)


def test_resume_problems(tmp_path, corpus, capsys):
    _bad(tmp_path, capsys, ["train", "--resume", "--out", str(tmp_path / "run")], "no checkpoint in")
    assert run_train(tmp_path, corpus, "--max-steps", "3") == 0
    capsys.readouterr()
    assert_resume_below_the_checkpoint_is_refused(tmp_path / "run", capsys)
    assert main(["train", "--resume", "--out", str(tmp_path / "run"), "--n-layer", "3"]) == 2
    assert "model.n_layer: 2 -> 3" in capsys.readouterr().err
    (tmp_path / "run" / "checkpoints" / "step-0000003" / "model.safetensors").write_bytes(b"junk")
    code = main(["train", "--resume", "--out", str(tmp_path / "run"), "--max-steps", "6", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "corrupt or not safetensors" in err


def test_out_that_is_a_file_and_preset_on_resume_are_refused(tmp_path, corpus, capsys):
    target = tmp_path / "run"
    target.write_text("not a directory")
    code = run_train(tmp_path, corpus)
    assert code == 2 and "is a file" in capsys.readouterr().err
    target.unlink()
    assert run_train(tmp_path, corpus, "--max-steps", "3") == 0
    capsys.readouterr()
    assert main(["train", "--resume", "--preset", "laptop", "--out", str(target)]) == 2
    assert "--preset 'laptop' cannot be combined with --resume" in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path, corpus):
    with pytest.raises(Exception, match="outside"):
        run_train(tmp_path, corpus, "--alpha", "2", "--gate", "fixed", "--debug")


def test_eval_refuses_a_pickled_checkpoint_that_needs_unpickling(tmp_path, corpus, capsys):
    import os

    import torch

    assert run_train(tmp_path, corpus, "--max-steps", "3") == 0
    run = tmp_path / "run"
    state = ckpt.load_tensors(run / "model.safetensors")

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (run / "model.safetensors").unlink()
    torch.save({**state, "payload": Payload()}, run / "model.pt")
    code = main(["eval", "--model", str(run), "--benchmarks", "shakespeare", "--out", str(tmp_path / "ev")])
    err = capsys.readouterr().err
    assert code == 2 and "would need unsafe unpickling" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "ev").exists()
    torch.save(state, run / "model.pt")  # plain tensors: loads without unpickling code
    assert ckpt.load_run(run).config.model.n_layer == 2


def test_resume_with_a_longer_block_than_the_positional_table_is_refused(tmp_path, corpus, capsys):
    assert run_train(tmp_path, corpus, "--max-steps", "3") == 0
    capsys.readouterr()
    code = main(
        ["train", "--resume", "--out", str(tmp_path / "run"), "--block-size", "32", "--max-steps", "6"]
    )
    assert code == 2
    assert "model.block_size: 16 -> 32" in capsys.readouterr().err


#: A divergence's one line: what was not finite, at which step, and the newest good checkpoint.
DIVERGED = re.compile(
    r"resstream: error: non-finite (?P<what>[a-z ]+) \((?P<value>[^)]*)\) at step (?P<step>\d+); stopped, "
    r"(checkpoint \d+ not written, )?last good checkpoint: step (?P<good>\d+) in '(?P<path>[^']+)' "
    r"\(--resume continues from it\)"
)


def test_a_huge_learning_rate_names_a_checkpoint_that_resumes(tmp_path, corpus, capsys):
    """Raising --lr to 1e6 on a resume diverges, and the one line names a checkpoint that resumes.

    Where a float first overflows at such a rate is up to the CPU's kernels (this run gave an
    infinite gradient norm at step 3 on one machine and a NaN from the CPU flash-attention
    backward at step 2 on another), so the test asserts only what is guaranteed: two steps
    at a sane rate make checkpoint 2 good (the step after it starts from sane weights); the
    run stops at a step it names, naming the newest good checkpoint, every newer checkpoint
    is marked diverged, and resuming from the named one with a sane rate trains to the end.
    """
    run = tmp_path / "run"
    assert (
        run_train(tmp_path, corpus, "--checkpoint-interval", "1", "--max-steps", "2", "--warmup-steps", "0")
        == 0
    )
    huge = ("--lr", "1e6", "--min-lr", "1e6", "--max-steps", "12", "--quiet")  # 1e6 at every step
    assert main(["train", "--resume", "--out", str(run), *huge]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the line about the schedule
    stop = DIVERGED.fullmatch(err)
    assert stop is not None, err
    step, good = int(stop["step"]), int(stop["good"])
    assert stop["value"] in ("nan", "inf", "-inf") or "non-finite" in stop["value"], err
    assert 2 <= good < step <= 12, err
    assert stop["path"] == str(run / "checkpoints" / f"step-{good:07d}"), err
    assert (Path(stop["path"]) / ckpt.VERIFIED).is_file()
    assert ckpt.newest_good_checkpoint(run).step == good
    newer = [p for p in (run / "checkpoints").glob("step-*") if int(p.name.removeprefix("step-")) > good]
    assert all((p / ckpt.DIVERGED).is_file() for p in newer), newer
    sane = ("--lr", "1e-3", "--min-lr", "1e-4", "--max-steps", "12", "--quiet")
    assert main(["train", "--resume", "--out", str(run), *sane]) == 0, capsys.readouterr().err
    assert ckpt.latest_checkpoint_step(run) == 12
    final = ckpt.load_run(run).model.state_dict()
    assert all(torch.isfinite(v).all() for v in final.values())


def test_a_run_that_diverges_before_any_good_checkpoint_cannot_be_resumed(
    tmp_path, corpus, capsys, monkeypatch
):
    """Step 2, computed from checkpoint 1's weights, diverges (NaN weights, as a diverging run
    gets them: deterministic whatever the kernels), so no checkpoint is good."""
    poison_at(monkeypatch, 1)
    assert run_train(tmp_path, corpus, "--checkpoint-interval", "1") == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("resstream: error: non-finite training loss (nan) at step 2;"), err
    assert "at step 2; stopped, no good checkpoint" in err and "--lr" in err, err
    monkeypatch.undo()
    code = main(["train", "--resume", "--out", str(tmp_path / "run"), "--lr", "1e-3", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "cannot resume: checkpoint step 1" in err and "no good checkpoint" in err, err


def test_resume_with_another_max_steps_says_which_schedule_it_keeps(tmp_path, corpus, capsys):
    assert run_train(tmp_path, corpus, "--max-steps", "3") == 0
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(tmp_path / "run"), "--max-steps", "5", "--quiet"]) == 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("resuming at step 3 with --max-steps 5 (was 3):"), err
    assert len(err.splitlines()) == 1


def test_help_describes_every_field_with_its_defaults_per_preset(capsys, monkeypatch):
    from resstream.training.config import FIELDS, description

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())  # long entries are wrapped
    for name in FIELDS:
        assert description(name).rstrip(".") in text, name
    warmup = (
        "Steps of linear learning-rate warmup (default 20; reference 100, tiny 2, paper 700, gpt2-124m 700)"
    )
    assert f"--warmup-steps {warmup}" in text
    assert (
        "(default 200; reference 1500, tiny 20, laptop 300, paper 19073, gpt2-124m 19073)" in text
    )  # --max-steps
    assert "--beta1 AdamW beta1 (default 0.9)" in text  # no preset changes it
