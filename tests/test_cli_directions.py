"""`resstream directions` end to end, in-process, and its answers to bad input.

Spec: from two sets of texts (--positive/--negative, --pairs) or a built-in concept of the
plays (--concept), at every layer: DiffMean, PCA of paired differences and a probe, each with
its held-out ROC-AUC; writes directions.json, directions.csv, directions_auc.png,
directions.safetensors, directions.gguf and run.json; bad input is one line, exit 2, nothing
written.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from resstream.cli import directions as directions_command
from resstream.cli.main import main
from tests.cli_support import assert_complete_files, expect_usage_error, saved_tiny_model, strict_json

FAST = ["--device", "cpu", "--quiet"]
FILES = (*directions_command.FILES, "run.json")

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random GPT-2 (2 blocks, width 32) saved with its one-character tokenizer."""
    return saved_tiny_model(tmp_path_factory.mktemp("models") / "gpt2")


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Positive and negative text files (a .jsonl and a .txt) and a file of pairs."""
    root = tmp_path_factory.mktemp("texts")
    positive = [f"a happy day number {i}!" for i in range(8)]
    negative = [f"a sad night, number {i}." for i in range(8)]
    files = {
        "positive": root / "positive.jsonl",
        "negative": root / "negative.txt",
        "pairs": root / "pairs.jsonl",
        "few": root / "few.txt",
        "blank": root / "blank.txt",
    }
    files["positive"].write_text("".join(json.dumps({"text": t}) + "\n" for t in positive), encoding="utf-8")
    files["negative"].write_text("\n".join(negative) + "\n", encoding="utf-8")
    rows = (json.dumps({"positive": p, "negative": n}) for p, n in zip(positive, negative, strict=True))
    files["pairs"].write_text("\n".join(rows) + "\n", encoding="utf-8")
    files["few"].write_text("one\ntwo\n", encoding="utf-8")
    files["blank"].write_text("\n  \n", encoding="utf-8")
    return files


def test_two_files_on_a_saved_model_end_to_end(model_dir: Path, texts: dict[str, Path], tmp_path, capsys):
    out = tmp_path / "out"
    sets = ["--positive", str(texts["positive"]), "--negative", str(texts["negative"])]
    args = ["directions", *FAST, "--model", str(model_dir), *sets, "--token", "h", "--token", "s"]
    code = main([*args, "--position", "mean", "--batch-size", "3", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert_complete_files(out)
    report = strict_json(out / "directions.json")
    assert report["position"] == "mean" and report["texts"]["positive"] == report["texts"]["negative"] == 8
    assert [entry["site"] for entry in report["layers"]] == ["L0.resid", "L1.resid", "L2.resid"]
    assert report["model_fingerprint"] and [t["token"] for t in report["tokens"]] == ["h", "s"]
    with (out / "directions.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 9 and {row["method"] for row in rows} == {"diffmean", "pca", "probe"}
    assert "cos_unembed:h" in rows[0] and "cos_unembed:s" in rows[0]
    record = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert record["config"]["command"] == "directions" and record["config"]["tokens"] == ["h", "s"]
    assert record["config"]["gguf_method"] == "diffmean" and record["seed"] == 0
    from resstream.analysis.steering import load_directions

    saved = load_directions(out / "directions.safetensors", fingerprint=report["model_fingerprint"])
    assert saved.position == "mean" and saved.metadata["family"] == "gpt2"
    assert "held-out ROC-AUC" in captured.out and "best:" in captured.out
    assert "wrote directions.json, directions.csv, directions_auc.png" in captured.out


def test_pairs_and_another_gguf_method(model_dir: Path, texts: dict[str, Path], tmp_path, capsys):
    import gguf

    out = tmp_path / "out"
    args = ["directions", *FAST, "--model", str(model_dir), "--pairs", str(texts["pairs"])]
    code = main(
        [*args, "--gguf-method", "pca", "--gguf-scale", "unit", "--held-out", "0.5", "--out", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    report = strict_json(out / "directions.json")
    assert report["pairing"] == "given" and report["texts"]["test_positive"] == 4
    reader = gguf.GGUFReader(str(out / "directions.gguf"))
    assert reader.fields["controlvector.method"].contents() == "pca"
    assert [t.name for t in reader.tensors] == ["direction.1"]
    assert abs(float((reader.tensors[0].data.astype("float64") ** 2).sum()) - 1.0) < 1e-5


def test_the_reference_model_with_a_concept_of_the_plays_prints_its_json(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        ["directions", *FAST, "--concept", "comedy-tragedy", "--token", " love", "--out", str(out), "--json"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report == strict_json(out / "directions.json")
    assert report["model"] == "reference" and report["source"].startswith("concept comedy-tragedy")
    assert report["texts"] == {
        "positive": 256,
        "negative": 256,
        "train_positive": 192,
        "test_positive": 64,
        "train_negative": 192,
        "test_negative": 64,
        "pairs": 192,
    }
    assert len(report["layers"]) == 7 and report["best"]["auc"] > 0.6
    assert "best:" in captured.err  # the table goes to standard error with --json


def _bad(args: list[str], tmp_path: Path, capsys, *patterns: str | tuple[str, ...]) -> str:
    return expect_usage_error(["directions", *FAST, *args], tmp_path / "out", capsys, *patterns)


def test_bad_input_is_one_line_exit_2_and_nothing_written(
    model_dir: Path, texts: dict[str, Path], tmp_path, capsys
):
    model = ["--model", str(model_dir)]
    pos, neg = ["--positive", str(texts["positive"])], ["--negative", str(texts["negative"])]
    missing = str(tmp_path / "missing.txt")
    _bad(
        [*model, "--positive", missing, *neg], tmp_path, capsys, "--positive", "missing.txt", "does not exist"
    )
    _bad([*model, *pos, "--negative", str(texts["blank"])], tmp_path, capsys, "--negative", "holds no text")
    _bad(
        [*model, *pos, "--negative", str(texts["few"])],
        tmp_path,
        capsys,
        "--negative has 2 texts",
        "at least 3",
    )
    _bad([*model, *pos, *neg, "--position", "first"], tmp_path, capsys, "--position", "'first'")
    _bad([*model, *pos, *neg, "--token", "ab"], tmp_path, capsys, "--token: 'ab' is 2 tokens")
    _bad([*model, "--concept", "farce"], tmp_path, capsys, "unknown --concept 'farce'", "comedy-tragedy")
    _bad([*model, "--concept", "speaker:NOBODY"], tmp_path, capsys, "no speaker 'NOBODY'")
    _bad([*model, *pos], tmp_path, capsys, "--positive needs --negative")
    _bad([*model, *pos, *neg, "--concept", "comedy-tragedy"], tmp_path, capsys, "give the texts one way")
    _bad([*model], tmp_path, capsys, "give the texts one way", "none was given")
    _bad([*model, *pos, *neg, "--held-out", "1"], tmp_path, capsys, "--held-out")
    _bad([*model, *pos, *neg, "--batch-size", "0"], tmp_path, capsys, "--batch-size")
    _bad([*model, *pos, *neg, "--gguf-scale", "big"], tmp_path, capsys, "--gguf-scale", "'big'")
