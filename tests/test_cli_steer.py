"""`resstream generate` and `resstream steer` end to end, in-process, on a tiny saved model
with directions read by `resstream directions`, and their answers to bad input (one line,
exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resstream.cli.main import main
from tests.cli_support import assert_complete_files, expect_usage_error, saved_tiny_model, strict_json

FAST = ["--device", "cpu", "--quiet"]

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random GPT-2 (2 blocks, width 32, context 16) saved with its one-character tokenizer."""
    return saved_tiny_model(tmp_path_factory.mktemp("models") / "gpt2")


@pytest.fixture(scope="module")
def direction_file(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """directions.safetensors of the tiny model: 'a'-texts against 'z'-texts."""
    root = tmp_path_factory.mktemp("directions")
    (root / "pos.txt").write_text("\n".join(f"aaa {i}" for i in range(8)) + "\n", encoding="utf-8")
    (root / "neg.txt").write_text("\n".join(f"zzz {i}" for i in range(8)) + "\n", encoding="utf-8")
    args = ["directions", *FAST, "--model", str(model_dir), "--positive", str(root / "pos.txt")]
    assert main([*args, "--negative", str(root / "neg.txt"), "--out", str(root / "out")]) == 0
    return root / "out" / "directions.safetensors"


def test_generate_writes_edited_and_unedited_continuations(model_dir, direction_file, tmp_path, capsys):
    out = tmp_path / "gen"
    args = ["generate", *FAST, "--model", str(model_dir), "--prompt", "Hi", "--prompt", "Yo"]
    edits = ["--edit", "add:L1.resid:40", "--edit", "scale:L1.resid:0.9", "--direction", str(direction_file)]
    code = main([*args, *edits, "--max-new-tokens", "5", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert {p.name for p in out.iterdir()} == {
        "generations.jsonl",
        "generate.json",
        "generations.html",
        "run.json",
    }
    assert_complete_files(out)
    rows = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["Hi", "Yo"]
    assert all(len(r["steered_ids"]) == 5 and len(r["unsteered_ids"]) == 5 for r in rows)
    assert [e["operation"] for e in rows[0]["edits"]] == ["add", "scale"]
    assert rows[0]["edits"][0]["vector"]["norm"] == pytest.approx(1.0)  # the unit direction, times coef
    assert "edited:" in captured.out and "unedited:" in captured.out
    record = strict_json(out / "run.json")
    assert record["config"]["edits"] == ["add:L1.resid:40", "scale:L1.resid:0.9"]


def test_steer_sweeps_and_scale_maps(model_dir, direction_file, tmp_path, capsys):
    out = tmp_path / "steer"
    args = ["steer", *FAST, "--model", str(model_dir), "--direction", str(direction_file), "--prompt", "Hi"]
    code = main(
        [
            *args,
            "--coef",
            "0",
            "--coef",
            "20",
            "--concept-token",
            "a",
            "--max-new-tokens",
            "3",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert {p.name for p in out.iterdir()} == {
        "steer.json",
        "steer.csv",
        "steer.png",
        "steer.html",
        "run.json",
    }
    report = strict_json(out / "steer.json")
    assert [(p["site"], p["coef"]) for p in report["points"]] == [("L1.resid", 0.0), ("L1.resid", 20.0)]
    assert report["settings"]["probe_site"].endswith(".resid")
    scale = tmp_path / "scale"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 20, encoding="utf-8")
    sample = ["--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "8"]
    code = main(
        [
            "steer",
            *FAST,
            "--model",
            str(model_dir),
            "--scale",
            "--alpha",
            "1",
            "--alpha",
            "0.5",
            *sample,
            "--out",
            str(scale),
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert {p.name for p in scale.iterdir()} == {
        "steer.json",
        "attenuation.csv",
        "attenuation.png",
        "run.json",
    }
    mapped = strict_json(scale / "steer.json")
    assert mapped["mode"] == "scale" and len(mapped["points"]) == 4  # 2 blocks × 2 factors


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (["generate", "--prompt", "Hi", "--edit", "add:L1.resid:4"], ["needs --direction"]),
        (["generate", "--prompt", "Hi", "--edit", "push:L1.resid"], ["unknown operation 'push'"]),
        (["generate"], ["give a prompt"]),
        (["generate", "--prompt", "Hi", "--edit", "scale:L7.resid:0.5"], ["layer 7 is out of range"]),
        (["generate", "--prompt", "Hi", "--max-new-tokens", "4000"], ["over the model's context"]),
        (["generate", "--prompt", "Hi", "--edit", "scale:L2.resid:0.5"], ["no block reads the final state"]),
        (["steer", "--scale", "--prompt", "Hi"], ["--prompt applies to steering with a direction"]),
        (["steer", "--scale", "--coef", "2"], ["applies to steering with a direction, not to --scale"]),
        (["steer", "--alpha", "0.5"], ["applies to the attenuation map"]),
        (["steer"], ["needs --direction"]),
    ],
)
def test_bad_input_is_one_line(model_dir, tmp_path, capsys, args, patterns):
    command, rest = args[0], args[1:]
    expect_usage_error(
        [command, *FAST, "--model", str(model_dir), *rest], tmp_path / "out", capsys, *patterns
    )


def test_a_direction_of_another_model_is_refused(model_dir, direction_file, tmp_path, capsys):
    other = saved_tiny_model(tmp_path / "llama", "llama")
    args = ["generate", *FAST, "--model", str(other), "--prompt", "Hi", "--edit", "add:L1.resid:4"]
    expect_usage_error(
        [*args, "--direction", str(direction_file)], tmp_path / "out", capsys, "was read from model"
    )
