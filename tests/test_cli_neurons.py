"""`resstream neurons` end to end, in-process, and its answers to bad input.

Spec (issue 11, items 4 and 7): `neurons [--model M] --layer L (--neuron K ... | --top N)
[--dataset D] [--num-seqs N] [--seq-len S] [--contexts N] --out DIR` writes neurons.json,
neurons.csv, neurons.png, neurons.html and run.json; bad input is one line on stderr naming
the value and the allowed range, exit code 2, nothing written to --out.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from resstream.cli.main import main
from resstream.reporting.text import show_token
from tests.cli_support import assert_complete_files, expect_usage_error, strict_json
from tests.test_cli_shift import TEXT

FAST = ["--device", "cpu", "--quiet"]
FILES = {"neurons.json", "neurons.csv", "neurons.png", "neurons.html", "run.json"}

#: No test here may reach the network (the hub fails at once); one torch thread.
pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small UTF-8 text corpus (the 5 MB built-in one takes seconds to tokenise)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def run_neurons(out: Path, corpus: Path, *args: str) -> int:
    sample = ["--dataset", str(corpus), "--num-seqs", "4", "--seq-len", "24"]
    return main(["neurons", *FAST, *sample, *args, "--out", str(out)])


def test_top_neurons_of_the_reference_model(tmp_path, corpus, capsys) -> None:
    out = tmp_path / "run"
    code = run_neurons(out, corpus, "--layer", "2", "--top", "3", "--contexts", "4", "--value-tokens", "6")
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert {p.name for p in out.iterdir()} == FILES
    assert_complete_files(out)
    report = strict_json(out / "neurons.json")
    assert report["model"] == "reference" and report["layer"] == 2 and report["num_positions"] == 4 * 24
    assert report["selection"].startswith("top 3: ")
    entries = report["neurons"]
    assert len(entries) == 3
    maxima = [n["max_activation"] for n in entries]
    assert maxima == sorted(maxima, reverse=True)
    for n in entries:
        assert 0 <= n["neuron"] < report["d_ff"]
        assert len(n["promoted"]) == len(n["suppressed"]) == 6
        assert n["promoted"][0]["score"] >= n["promoted"][-1]["score"] > n["suppressed"][-1]["score"]
        assert len(n["contexts"]) == 4 and n["contexts"][0]["activation"] == n["max_activation"]
        for c in n["contexts"]:
            assert c["window"][-1] == c["token"] and 0 <= c["position"] < 24 and len(c["window"]) <= 13
            assert c["token"].strip() == "" or c["token"].strip() in TEXT
    rows = list(csv.DictReader((out / "neurons.csv").read_text(encoding="utf-8").splitlines()))
    assert len(rows) == 3 * (6 + 6 + 4)
    assert {r["kind"] for r in rows} == {"promoted", "suppressed", "context"}
    assert {r["layer"] for r in rows} == {"2"}
    page = (out / "neurons.html").read_text(encoding="utf-8")
    assert page.count("<mark>") == 12 and "http" not in page
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["command"] == "neurons" and record["config"]["neurons"] == [
        n["neuron"] for n in entries
    ]
    assert printed.splitlines()[0].startswith("reference: layer 2 of 6, 3 of ")
    for n in entries:  # tokens as every output shows them (␣, ↵), not as Python reprs
        promoted = " ".join(show_token(p["token"]) for p in n["promoted"][:5])
        assert f"  L2.N{n['neuron']}: max m {n['max_activation']:.3g}; promotes {promoted};" in printed
    assert "wrote neurons.json, neurons.csv, neurons.png, neurons.html and run.json" in printed


def test_chosen_neurons_of_a_hugging_face_model(tmp_path, corpus, capsys) -> None:
    from resstream.data import train_bpe
    from tests.test_models_loading import SENTENCES, _tiny_gpt2

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    model_dir = tmp_path / "tiny-gpt2"
    _tiny_gpt2(len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "run"
    code = run_neurons(
        out, corpus, "--model", str(model_dir), "--layer", "0", "--neuron", "9", "--neuron", "4"
    )
    assert code == 0, capsys.readouterr().err
    report = strict_json(out / "neurons.json")
    assert [n["neuron"] for n in report["neurons"]] == [9, 4]
    assert report["selection"] == "the neurons given" and report["d_ff"] == 128
    assert all(len(n["contexts"]) == 10 and len(n["promoted"]) == 10 for n in report["neurons"])


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (["--layer", "6", "--top", "2"], ["--layer 6 is out of range; allowed: 0..5"]),
        (["--layer", "-1", "--top", "2"], ["--layer -1 is out of range; allowed: 0..5"]),
        (["--layer", "1", "--neuron", "5000"], ["--neuron 5000 is out of range for layer 1; allowed: 0.."]),
        (["--layer", "1", "--neuron", "3", "--top", "2"], ["give exactly one of --neuron", "--top"]),
        (["--layer", "1"], ["give exactly one of --neuron"]),
        (["--layer", "1", "--top", "0"], ["--top 0 must be >= 1"]),
        (["--layer", "1", "--top", "100000"], ["--top 100000 is more than layer 1's"]),
        (["--layer", "1", "--top", "1", "--contexts", "0"], ["--contexts 0 must be >= 1"]),
        (["--layer", "1", "--top", "1", "--value-tokens", "0"], ["--value-tokens 0 must be >= 1"]),
        (["--top", "1"], ["--layer"]),
    ],
)
def test_bad_input(tmp_path, corpus, capsys, args, patterns) -> None:
    sample = ["--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "8"]
    expect_usage_error(["neurons", *FAST, *sample, *args], tmp_path / "out", capsys, *patterns)


def test_unknown_dataset(tmp_path, capsys) -> None:
    expect_usage_error(
        ["neurons", *FAST, "--layer", "1", "--top", "1", "--dataset", "no-such-corpus"],
        tmp_path / "out",
        capsys,
        "no-such-corpus",
    )
