"""`resstream composition` end to end, in-process, and its answers to bad input.

Spec (issue 11, item 6): `composition [--model M] [--top N] --out DIR` writes composition.json,
composition.csv (one row per kind and pair of heads), composition_q/_k/_v.png and run.json, and prints
the random baseline and the strongest pairs of each kind; bad input is one line, exit 2,
nothing written.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from resstream.cli.main import main
from tests.cli_support import assert_complete_files, expect_usage_error, strict_json

FAST = ["--device", "cpu", "--quiet", "--samples", "16"]
FILES = ("composition.json", "composition.csv", "composition_q.png", "composition_k.png", "composition_v.png")

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


def hf_dir(root: Path, n_layer: int) -> Path:
    """A tiny Hugging Face GPT-2 (`n_layer` layers, 4 heads, d 32) with its BPE tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from resstream.data import train_bpe
    from tests.test_models_loading import SENTENCES

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    config = GPT2Config(
        n_layer=n_layer,
        n_embd=32,
        n_head=4,
        vocab_size=len(tokenizer),
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    path = root / f"gpt2-{n_layer}"
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_the_reference_model_end_to_end(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["composition", *FAST, "--top", "3", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert sorted(p.name for p in out.iterdir()) == sorted([*FILES, "run.json"])
    assert_complete_files(out)
    report = strict_json(out / "composition.json")
    assert report["model"] == "reference" and (report["n_layers"], report["n_heads"]) == (6, 4)
    assert len(report["pairs"]) == 4 * 4 * 15 and all(len(report["top"][k]) == 3 for k in "qkv")
    with (out / "composition.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    columns = ["kind", "writer_layer", "writer_head", "reader_layer", "reader_head", "score", "baseline"]
    assert len(rows) == 3 * 240 and list(rows[0]) == columns
    assert [row["kind"] for row in rows] == ["q"] * 240 + ["k"] * 240 + ["v"] * 240
    assert all(int(row["writer_layer"]) < int(row["reader_layer"]) for row in rows)
    first = report["pairs"][0]
    assert float(rows[240]["score"]) == pytest.approx(first["k"])  # the first pair's K score
    assert {float(row["baseline"]) for row in rows} == {report["baseline"]["mean"]}
    lines = captured.out.splitlines()
    baseline = report["baseline"]
    assert lines[0].startswith("reference: 6 layers × 4 heads; random baseline ")
    assert (
        f"{baseline['mean']:.4f}" in lines[0] and f"1/√d_model = {baseline['rms_analytic']:.4f}" in lines[0]
    )
    assert lines[1].startswith("Q-composition, top 3") and lines[5].startswith("K-composition, top 3")
    best = report["top"]["k"][0]
    pair = (
        f"L{best['layer_a']}.H{best['head_a']} -> L{best['layer_b']}.H{best['head_b']}  {best['score']:.4f}"
    )
    assert best["name"] == pair.split("  ")[0]
    assert lines[6].strip().startswith(pair), lines[6]
    assert lines[-1].startswith("wrote composition.json") and str(out) in lines[-1]
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["command"] == "composition" and record["config"]["top"] == 3
    assert record["seed"] == 0 and record["device"] == "cpu"


def test_a_hugging_face_directory(tmp_path, capsys):
    model = hf_dir(tmp_path, 3)
    out = tmp_path / "out"
    code = main(["composition", *FAST, "--model", str(model), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = strict_json(out / "composition.json")
    assert report["model"] == str(model) and report["n_layers"] == 3
    assert len(report["pairs"]) == 16 * 3 and len(report["top"]["v"]) == 10


def test_a_one_layer_model_has_no_pairs(tmp_path, capsys):
    model = hf_dir(tmp_path, 1)
    expect_usage_error(
        ["composition", *FAST, "--model", str(model)],
        tmp_path / "out",
        capsys,
        "has 1 layer",
        "at least 2 layers",
        str(model),
    )


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (["--top", "0"], ["--top 0 is not allowed; allowed: an integer >= 1"]),
        (["--top", "-2"], ["--top -2 is not allowed; allowed: an integer >= 1"]),
        (["--samples", "1"], ["--samples 1 must be >= 2"]),
    ],
)
def test_bad_numbers(tmp_path, capsys, args, patterns):
    expect_usage_error(
        ["composition", "--device", "cpu", "--quiet", *args], tmp_path / "out", capsys, *patterns
    )


def test_missing_model(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    expect_usage_error(
        ["composition", *FAST, "--model", str(missing)],
        tmp_path / "out",
        capsys,
        str(missing),
        "does not exist",
    )
