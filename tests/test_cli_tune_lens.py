"""`resstream tune-lens` end to end, in-process, the tuned decoder in `shift` and `lens`, and
their answers to bad input.

Spec (issue 12): `tune-lens --out DIR` writes the lens (translators.safetensors, lens.json), its
held-out evaluation against the logit lens (evaluation.json, evaluation.csv, bits_per_layer.png),
the training curve (training.png) and run.json, and prints the per-layer KL of both lenses;
`tune-lens --eval --out DIR` evaluates the lens in DIR again on the same held-out windows;
`shift --decoder logit-lens --decoder tuned:DIR` reports both decoders from one run (one
comparison figure per model, a `decoder` column, both shift layers printed); `lens --decoder
tuned:DIR` decodes through the translators. Bad input is one line on stderr, exit code 2,
nothing written to --out (and a lens directory given to --eval left as it was).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from resstream.analysis.decoding.lens_training import EVALUATION_COLUMNS, LensEvaluation
from resstream.analysis.decoding.tuned_lens import TunedLens, load_lens
from resstream.analysis.shift.alignment import AlignmentResult
from resstream.cli.main import main
from resstream.reporting.notebook import frame_csv
from tests.cli_support import assert_complete_files, expect_usage_error
from tests.lens_support import plays_file

FAST = ["--device", "cpu", "--quiet"]
#: A short training run: 3 steps of 8 windows of 32 tokens, 4 held out, a rate that learns.
TRAIN = ["--tokens", "768", "--steps", "3", "--seq-len", "32", "--eval-seqs", "4", "--batch-size", "4"]
LR = ["--lr", "0.01"]
LENS_FILES = ["lens.json", "translators.safetensors"]
OUTPUTS = sorted(
    [*LENS_FILES, "evaluation.json", "evaluation.csv", "bits_per_layer.png", "training.png", "run.json"]
)
TEXT = "the residual stream carries the input token forward to the last layer"

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def plays(tmp_path_factory) -> Path:
    """30,000 characters of the built-in corpus (the reference model's own text) as a file."""
    return plays_file(tmp_path_factory.mktemp("corpus"), 30_000)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, plays) -> tuple[Path, str]:
    """`resstream tune-lens` on the reference model, run once: its directory and what it printed."""
    out = tmp_path_factory.mktemp("runs") / "lens"
    printed = io.StringIO()
    with redirect_stdout(printed):
        code = main(["tune-lens", *FAST, *TRAIN, *LR, "--dataset", str(plays), "--out", str(out)])
    assert code == 0, printed.getvalue()
    return out, printed.getvalue()


@pytest.fixture(scope="module")
def other_lens(tmp_path_factory) -> TunedLens:
    """A (zero) lens of a freshly initialised model of the reference's shape: not the reference's."""
    import torch

    from resstream.models import as_loaded, load_model
    from resstream.training.model import GPT

    reference = load_model(None, device="cpu", progress=False)
    torch.manual_seed(1)
    other = as_loaded(GPT(reference.view.model.config).eval(), reference.tokenizer, name="other")
    lens = TunedLens.zero(other.view, "other")
    lens.save(tmp_path_factory.mktemp("other") / "lens")
    return lens


def copy_of_lens(source: Path, target: Path) -> Path:
    """A directory holding only the lens files of `source`."""
    target.mkdir(parents=True)
    for name in LENS_FILES:
        shutil.copy2(source / name, target / name)
    return target


# --------------------------------------------------------------------------- end to end


def test_tune_lens_writes_the_lens_its_evaluation_and_plots(trained, plays) -> None:
    out, printed = trained
    assert sorted(p.name for p in out.iterdir()) == OUTPUTS
    assert_complete_files(out)
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation["model"] == "reference" and evaluation["layers"] == list(range(7))
    assert evaluation["num_tokens"] == 4 * 31 and str(plays) in evaluation["sample"]
    for layer in range(6):  # 3 steps already beat the logit lens at every layer
        assert evaluation["tuned_kl"][layer] < evaluation["logit_kl"][layer], layer
    rows = list(csv.DictReader((out / "evaluation.csv").open()))  # per layer, metric and lens
    assert list(rows[0]) == list(EVALUATION_COLUMNS) and len(rows) == 7 * 4
    assert [int(r["layer"]) for r in rows] == [layer for layer in range(7) for _ in range(4)]
    for key, kind, metric in (
        ("logit_kl", "logit", "kl_bits"),
        ("tuned_kl", "tuned", "kl_bits"),
        ("logit_ce", "logit", "ce_bits"),
        ("tuned_ce", "tuned", "ce_bits"),
    ):
        values = [float(r["value"]) for r in rows if (r["lens"], r["metric"]) == (kind, metric)]
        assert values == evaluation[key], key
    fields = {name: tuple(v) if isinstance(v, list) else v for name, v in evaluation.items()}
    assert (out / "evaluation.csv").read_text() == frame_csv(LensEvaluation(**fields).to_pandas())

    lens = load_lens(out)
    assert lens.model == "reference" and lens.record["dataset"] == str(plays)
    assert lens.record["optimiser"]["steps"] == 3 and lens.record["optimiser"]["lr"] == 0.01
    assert lens.record["train_seqs"] == 3 * 8 and len(lens.record["kl_bits_per_step"]) == 3
    record = json.loads((out / "run.json").read_text())
    config = record["config"]
    assert config["command"] == "tune-lens" and config["mode"] == "train" and config["lr"] == 0.01
    assert (config["tokens"], config["steps"], config["seq_len"], config["eval_seqs"]) == (768, 3, 32, 4)
    assert config["dataset"] == str(plays) and record["device"] == "cpu" and record["seed"] == 0
    assert record["dataset_fingerprint"] == lens.record["dataset_fingerprint"]
    assert sorted(record["files"]) == OUTPUTS

    lines = printed.splitlines()
    assert lines[0] == "reference: KL(final ‖ lens) on 124 held-out positions, bits"
    assert lines[1] == "layer  logit lens  tuned lens"
    for layer, line in enumerate(lines[2:8]):
        logit, tuned = evaluation["logit_kl"][layer], evaluation["tuned_kl"][layer]
        assert line.split() == [str(layer), f"{logit:.3f}", f"{tuned:.3f}"], line
    assert lines[8].startswith("wrote the lens (translators.safetensors, lens.json)") and str(out) in lines[8]
    assert len(lines) == 9


def test_tune_lens_eval_reproduces_the_evaluation(trained, tmp_path, capsys) -> None:
    out, _ = trained
    again = copy_of_lens(out, tmp_path / "again")  # the lens alone, as handed to someone else
    assert main(["tune-lens", *FAST, "--eval", "--out", str(again)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert sorted(p.name for p in again.iterdir()) == OUTPUTS
    assert_complete_files(again)
    assert json.loads((again / "evaluation.json").read_text()) == json.loads(
        (out / "evaluation.json").read_text()
    )
    assert (again / "evaluation.csv").read_text() == (out / "evaluation.csv").read_text()
    for name in LENS_FILES:  # the lens itself is not changed by evaluating it
        assert (again / name).read_bytes() == (out / name).read_bytes(), name
    config = json.loads((again / "run.json").read_text())["config"]
    assert config["mode"] == "eval" and config["dataset"] == load_lens(out).record["dataset"]
    assert "KL(final ‖ lens) on 124 held-out positions" in printed


def test_eval_on_the_training_corpus_refuses_windows_that_could_overlap_training(
    trained, tmp_path, capsys
) -> None:
    # another --seq-len or --seed on the lens's own corpus would draw windows overlapping the
    # training text (the review found 12 of 32 "held-out" windows were halves of training ones)
    out, _ = trained
    again = copy_of_lens(out, tmp_path / "again")
    for flag, value in (("--seq-len", "16"), ("--seed", "7")):
        err = expect_refused_in_place(
            ["tune-lens", *FAST, "--eval", flag, value], again, capsys, "only the windows training held out"
        )
        assert f"the training run's {flag}" in err and f"not {value};" in err, err


def test_eval_refuses_a_training_corpus_that_changed(trained, tmp_path, plays, capsys) -> None:
    out, _ = trained
    again = copy_of_lens(out, tmp_path / "again")
    record = json.loads((again / "lens.json").read_text())
    changed = tmp_path / "changed.txt"
    changed.write_text("An extra first line.\n" + plays.read_text(encoding="utf-8"), encoding="utf-8")
    record["training"]["dataset"] = str(changed)
    (again / "lens.json").write_text(json.dumps(record))
    expect_refused_in_place(
        ["tune-lens", *FAST, "--eval"], again, capsys, "has changed since the lens was trained"
    )


def test_eval_seed_on_another_corpus_is_used_and_recorded(trained, tmp_path, capsys) -> None:
    out, _ = trained
    again = copy_of_lens(out, tmp_path / "again")
    other = tmp_path / "other.txt"
    other.write_text("the king is dead, long live the king.\n" * 200, encoding="utf-8")
    code = main(
        [
            "tune-lens",
            *FAST,
            "--eval",
            "--dataset",
            str(other),
            "--eval-seqs",
            "3",
            "--seed",
            "7",
            "--out",
            str(again),
        ]
    )
    assert code == 0, capsys.readouterr().err
    evaluation = json.loads((again / "evaluation.json").read_text())
    assert "seed 7" in evaluation["sample"] and evaluation["num_sequences"] == 3, evaluation["sample"]
    run = json.loads((again / "run.json").read_text())
    assert run["seed"] == 7 and run["config"]["dataset"] == str(other) and run["config"]["eval_seqs"] == 3
    assert run["config"]["mode"] == "eval" and "lr" not in run["config"]


def test_shift_with_the_logit_lens_and_the_tuned_lens(trained, tmp_path, plays, capsys) -> None:
    lens_dir, _ = trained
    out = tmp_path / "shift"
    args = ["shift", *FAST, "--dataset", str(plays), "--num-seqs", "3", "--seq-len", "16", "--top-k", "3"]
    code = main([*args, "--decoder", "logit-lens", "--decoder", f"tuned:{lens_dir}", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    names = {p.name for p in out.glob("*.png")}
    assert {"decoders_reference.png", "comparison.png"} <= names
    for kind in ("match_rates", "similarity", "shift_depths"):  # per result, named by model and decoder
        assert sum(name.startswith(kind) for name in names) == 2, names
    assert_complete_files(out)
    report = json.loads((out / "shift.json").read_text())
    assert report["decoders"] == ["logit-lens", "tuned"]
    assert [m["decoder"] for m in report["models"]] == ["logit-lens", "tuned"]
    assert load_lens(lens_dir).fingerprint in report["models"][1]["decoding"]
    rows = list(csv.DictReader((out / "shift.csv").open()))  # per decoder, layer and metric (6)
    assert [r["decoder"] for r in rows] == ["logit-lens"] * 7 * 6 + ["tuned"] * 7 * 6
    assert [int(r["layer"]) for r in rows] == [layer for layer in range(7) for _ in range(6)] * 2
    for entry in report["models"]:
        assert (
            f"reference ({entry['decoder']}): {AlignmentResult.from_dict(entry).shift_text}" in captured.out
        )
    config = json.loads((out / "run.json").read_text())["config"]
    assert config["decoder"] == ["logit-lens", f"tuned:{lens_dir}"]

    single = tmp_path / "single"  # the tuned decoder alone: the same numbers
    assert main([*args, "--decoder", f"tuned:{lens_dir}", "--out", str(single)]) == 0
    alone = json.loads((single / "shift.json").read_text())["models"][0]
    assert alone == report["models"][1]
    assert "reference: shift layer" in capsys.readouterr().out  # one decoder: no decoder in the label


def test_lens_through_the_tuned_lens(trained, tmp_path, capsys) -> None:
    lens_dir, _ = trained
    out = tmp_path / "lens"
    code = main(
        [
            "lens",
            "--device",
            "cpu",
            "--text",
            TEXT,
            "--positions",
            "1:4",
            "--top-k",
            "2",
            "--decoder",
            f"tuned:{lens_dir}",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert sorted(p.name for p in out.iterdir()) == ["lens.html", "lens.json", "lens.png", "run.json"]
    assert_complete_files(out)
    report = json.loads((out / "lens.json").read_text())
    assert report["decoder"] == "tuned" and load_lens(lens_dir).fingerprint in report["decoding"]
    assert [row["position"] for row in report["positions"]] == [1, 2, 3]
    assert all(len(row["top_ids"]) == 7 for row in report["positions"])
    assert json.loads((out / "run.json").read_text())["config"]["decoder"] == f"tuned:{lens_dir}"
    assert "layers 0–6 (0 = embedding)" in captured.out


# --------------------------------------------------------------------------- bad input


def damaged_lens(trained, tmp_path: Path, kind: str) -> Path:
    path = copy_of_lens(trained[0], tmp_path / f"lens-{kind}")
    if kind == "json":
        (path / "lens.json").write_text('{"format": "resstream-tuned-lens/1", "n_lay')
    else:
        weights = path / "translators.safetensors"
        weights.write_bytes(weights.read_bytes()[:200])
    return path


def shift_args(plays: Path, *decoders: str) -> list[str]:
    args = ["shift", *FAST, "--dataset", str(plays), "--num-seqs", "2", "--seq-len", "16"]
    return args + [part for decoder in decoders for part in ("--decoder", decoder)]


def lens_args(decoder: str) -> list[str]:
    return ["lens", "--device", "cpu", "--text", TEXT, "--decoder", decoder]


@pytest.mark.parametrize("command", ["shift", "lens"])
def test_a_missing_lens_directory(command, tmp_path, plays, capsys) -> None:
    missing = tmp_path / "nowhere"
    args = shift_args(plays, f"tuned:{missing}") if command == "shift" else lens_args(f"tuned:{missing}")
    expect_usage_error(args, tmp_path / "out", capsys, str(missing), "does not exist", "tune-lens")


@pytest.mark.parametrize(
    ("command", "kind"), [("shift", "json"), ("lens", "json"), ("shift", "weights"), ("lens", "weights")]
)
def test_a_corrupt_lens(command, kind, trained, tmp_path, plays, capsys) -> None:
    path = damaged_lens(trained, tmp_path, kind)
    args = shift_args(plays, f"tuned:{path}") if command == "shift" else lens_args(f"tuned:{path}")
    pattern = "lens.json is not valid JSON" if kind == "json" else "translators.safetensors is corrupt"
    expect_usage_error(args, tmp_path / "out", capsys, str(path), pattern)


@pytest.mark.parametrize("command", ["shift", "lens"])
def test_a_lens_of_another_model(command, other_lens, tmp_path, plays, capsys) -> None:
    path = other_lens.save(tmp_path / "other")
    args = (
        shift_args(plays, "logit-lens", f"tuned:{path}") if command == "shift" else lens_args(f"tuned:{path}")
    )
    expect_usage_error(
        args,
        tmp_path / "out",
        capsys,
        f"expects fingerprint {other_lens.fingerprint}",
        str(path),
        "another model",
    )


@pytest.mark.parametrize("second", ["{lens}", "{lens}/"])
def test_the_same_lens_given_twice(second, trained, tmp_path, plays, capsys) -> None:
    lens_dir = trained[0]
    decoders = (f"tuned:{lens_dir}", "tuned:" + second.format(lens=lens_dir))
    expect_usage_error(shift_args(plays, *decoders), tmp_path / "out", capsys, "given twice")


#: tune-lens options that are bad input, and what the one-line message must say.
BAD_TRAINING = [
    (["--steps", "0"], ["--steps 0 is not allowed", ">= 1"]),
    (["--steps", "-2"], ["--steps -2 is not allowed"]),
    (["--tokens", "0"], ["--tokens 0 is not allowed", ">= 1"]),
    (["--eval-seqs", "0"], ["--eval-seqs 0 is not allowed"]),
    (["--checkpoint-every", "0"], ["--checkpoint-every 0 is not allowed", ">= 1"]),
    (
        ["--tokens", "1000000"],
        ["is too small for --tokens 1,000,000 in 3 steps", "and it holds", "lower --tokens"],
    ),
    (["--lr", "0"], ["--lr", "0"]),
    (["--lr", "-1"], ["--lr", "-1"]),
    (["--lr", "nan"], ["--lr", "nan"]),
]


@pytest.mark.parametrize(("args", "patterns"), BAD_TRAINING, ids=[" ".join(args) for args, _ in BAD_TRAINING])
def test_bad_training_options(args, patterns, tmp_path, plays, capsys) -> None:
    options = ["--tokens", "768", "--steps", "3", "--seq-len", "32", "--eval-seqs", "4", *LR]
    expect_usage_error(
        ["tune-lens", *FAST, *options, "--dataset", str(plays), *args], tmp_path / "out", capsys, *patterns
    )


def expect_refused_in_place(args: list[str], out: Path, capsys, *patterns: str) -> str:
    """Exit code 2, one line naming the patterns; `out` (which holds files) left exactly as it was."""
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    code = main([*args, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("resstream: error:"), err
    assert all(pattern in err for pattern in patterns), err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    return err


def test_eval_without_a_lens(tmp_path, capsys) -> None:
    missing = tmp_path / "missing"
    expect_usage_error(["tune-lens", *FAST, "--eval"], missing, capsys, str(missing), "does not exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    expect_usage_error(["tune-lens", *FAST, "--eval"], empty, capsys, "holds no lens.json")
    other_run = tmp_path / "run"
    other_run.mkdir()
    (other_run / "shift.json").write_text("{}")
    expect_refused_in_place(["tune-lens", *FAST, "--eval"], other_run, capsys, "holds no lens.json")


def test_eval_of_a_corrupt_lens_or_another_models(trained, other_lens, tmp_path, capsys) -> None:
    for kind, pattern in (
        ("json", "lens.json is not valid JSON"),
        ("weights", "translators.safetensors is corrupt"),
    ):
        path = damaged_lens(trained, tmp_path, kind)
        expect_refused_in_place(["tune-lens", *FAST, "--eval"], path, capsys, pattern)
    path = other_lens.save(tmp_path / "other")
    expect_refused_in_place(
        ["tune-lens", *FAST, "--eval"], path, capsys, f"expects fingerprint {other_lens.fingerprint}"
    )
