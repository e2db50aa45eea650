"""`resstream attribute` end to end, in-process, and its answers to bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from resstream.cli.main import main
from resstream.reporting.attribute import CORPUS_LEVELS, SINGLE_LEVELS
from tests.cli_support import assert_complete_files, expect_usage_error

TEXT = "The king said that the queen"
FAST = ["--device", "cpu", "--quiet"]

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


def test_attribute_one_text_writes_every_output(tmp_path: Path, capsys) -> None:
    out = tmp_path / "attr"
    code = main(
        ["attribute", *FAST, "--text", TEXT, "--target", ",", "--foil", ".", "--top", "5", "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert_complete_files(out)
    names = {p.name for p in out.iterdir()}
    for name in (
        "attribute.json",
        "attribute.html",
        "run.json",
        "layers.png",
        "heads.png",
        "trajectory.png",
        "linearity.png",
        "neurons.png",
        "layers.csv",
        "heads.csv",
        "sources.csv",
        "neurons.csv",
        "trajectory.csv",
        "query_contributions.csv",
    ):
        assert name in names, name
    report = json.loads((out / "attribute.json").read_text())
    assert report["model"] == "reference" and report["target"] == "," and report["foil"] == "."
    assert report["position"] == 5 and len(report["layers"]) == 6
    assert len(report["trajectory"]) == 13 and report["trajectory"][0]["point"] == "L_in_0"
    assert len(report["neurons"]) == 5 and len(report["sources"]) == 5
    assert report["check"]["decomposition_relative"] <= 1e-5 and report["check"]["dla_residual"] <= 1e-4
    dla = (
        report["embed_dla"] + report["bias_dla"] + sum(x["attn_dla"] + x["mlp_dla"] for x in report["layers"])
    )
    assert dla == pytest.approx(report["logit_difference"], abs=1e-4)
    rows = list(csv.DictReader((out / "heads.csv").read_text().splitlines()))
    assert len(rows) == len(report["heads"])
    for level in SINGLE_LEVELS:  # each a level of to_pandas(), with the columns it uses
        assert (out / f"{level.name}.csv").read_text().splitlines()[0] == ",".join(level.columns)
    assert "check: decomposition" in printed and "wrote attribute.json" in printed
    assert report["rank_by"] == "dla" and "\ntop layers by |DLA|: L" in printed
    assert "resstream ablate --faithfulness" in printed  # where C and DLA are checked against ablation
    largest = sorted(report["neurons"], key=lambda n: -abs(n["dla"]))
    assert report["neurons"] == largest  # listed by |DLA|, C beside it
    html = (out / "attribute.html").read_text()
    assert "http://" not in html and "https://" not in html.replace("https://www.w3.org", "")


def test_attribute_defaults_to_the_top_prediction_at_the_last_position(tmp_path: Path, capsys) -> None:
    out = tmp_path / "attr"
    args = ["attribute", *FAST, "--text", TEXT, "--no-sources", "--no-neurons", "--rank-by", "c"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "\ntop layers by |C|: L0.mlp +" in printed and "(DLA " in printed  # the seed paper's order
    assert json.loads((out / "run.json").read_text())["config"]["rank_by"] == "c"
    report = json.loads((out / "attribute.json").read_text())
    assert report["rank_by"] == "c"
    assert report["rank"] == 0 and report["position"] == 5
    assert report["sources"] == [] and report["neurons"] == [] and report["linearity"] is None
    assert not (out / "neurons.png").exists()


def test_attribute_without_contributions_says_what_it_computed(tmp_path: Path, capsys) -> None:
    out = tmp_path / "attr"
    assert main(["attribute", *FAST, "--text", TEXT, "--no-contributions", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "computed: DLA of every layer, head, source and neuron; no C beyond the layers'" in printed
    assert "fewer: --no-sources, --no-neurons; more: --rank-by c" in printed
    report = json.loads((out / "attribute.json").read_text())
    assert all(head["contribution"] is None for head in report["heads"])  # NaN: not computed
    assert report["linearity"] is None and "no C" in report["computed"]
    assert json.loads((out / "run.json").read_text())["config"]["contributions"] is False
    assert main(["attribute", *FAST, "--text", TEXT, "--out", str(tmp_path / "default")]) == 0
    assert (
        "fewer: --no-sources, --no-neurons, --no-contributions; more: --rank-by c" in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (["--text", TEXT, "--rank-by", "c", "--no-contributions"], ("--rank-by", "--no-contributions")),
        (["--text", TEXT, "--target", " queen said"], ("--target", "2 tokens", "one token")),
        (["--text", TEXT, "--position", "6"], ("--position 6", "0..5")),
        (["--text", TEXT, "--position", "-7"], ("--position -7",)),
        (["--text", "The"], ("1 token", "at least 2")),
        (["--text", TEXT, "--target", ",", "--foil", ","], ("--foil", "target token itself")),
        (["--text", TEXT, "--top", "0"], ("--top 0", "an integer >= 1")),
        (["--text", TEXT, "--rank-by", "abs"], ("--rank-by 'abs'", "dla, c")),
        (["--text", TEXT, "--target", ",", "--target-id", "3"], ("--target", "--target-id", "not both")),
        (["--text", TEXT, "--target-id", "999999"], ("--target-id 999999", "vocabulary")),
        (["--text", TEXT, "--dataset", "shakespeare"], ("--dataset", "not both")),
        ([], ("exactly one of --text or --text-file",)),
        (["--dataset", "shakespeare", "--candidates", "0"], ("--candidates 0", "1 or more")),
        (["--dataset", "shakespeare", "--position", "3"], ("--position applies to one text",)),
        (["--dataset", "shakespeare", "--target", ","], ("--target applies to one text",)),
        (["--dataset", "shakespeare", "--foil", ","], ("--foil applies to one text",)),
        (["--text", TEXT, "--candidates", "8"], ("--candidates applies to corpus mode",)),
        (["--text", TEXT, "--num-seqs", "8"], ("--num-seqs applies to corpus mode",)),
        (["--text", TEXT, "--seq-len", "8"], ("--seq-len applies to corpus mode",)),
        (["--dataset", "shakespeare", "--batch-size", "0"], ("--batch-size 0", ">= 1")),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys, args: list[str], patterns: tuple[str, ...]
) -> None:
    expect_usage_error(["attribute", *FAST, *args], tmp_path / "attr", capsys, *patterns)


def test_attribute_corpus_mode(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The king said that the queen was there, and the prince went home. " * 40)
    out = tmp_path / "attr"
    code = main(
        [
            "attribute",
            *FAST,
            "--dataset",
            str(corpus),
            "--num-seqs",
            "3",
            "--seq-len",
            "12",
            "--top",
            "4",
            "--candidates",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "attribute.json").read_text())
    assert report["kind"] == "attribute-corpus" and report["num_seqs"] == 3 and report["positions"] == 3 * 11
    assert len(report["neurons"]) == 4 and len(report["layers"]) == 6
    assert (
        report["layers"][0]["attn_contribution"]["low"] <= report["layers"][0]["attn_contribution"]["value"]
    )
    assert (out / "attribute.html").exists() and (out / "layers.png").exists()
    assert report["sample"] and report["dataset_fingerprint"]
    for level in CORPUS_LEVELS:
        assert (out / f"{level.name}.csv").read_text().splitlines()[0] == ",".join(level.columns)
    neurons = list(csv.DictReader((out / "neurons.csv").read_text().splitlines()))
    assert len(neurons) == 2 * len(report["neurons"])  # C and DLA
    run = json.loads((out / "run.json").read_text())
    assert run["dataset_fingerprint"] == report["dataset_fingerprint"] and run["config"]["sources"] is None


def test_attribute_a_hugging_face_model_from_a_local_directory(tmp_path: Path, capsys) -> None:
    """The path a user takes with `--model gpt2` online, from a `save_pretrained` directory."""
    from tests.test_cli_composition import hf_dir

    model_dir = hf_dir(tmp_path, 2)
    out = tmp_path / "attr"
    code = main(
        ["attribute", *FAST, "--model", str(model_dir), "--text", "the cat sat on the mat", "--out", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "attribute.json").read_text())
    assert report["model"] == str(model_dir) and len(report["layers"]) == 2
    assert report["check"]["decomposition_relative"] <= 1e-5 and report["check"]["dla_residual"] <= 1e-4
    assert report["query_contributions"] and all(q["residual"] <= 1e-4 for q in report["query_contributions"])


def test_api_skips_the_neuron_pass(tmp_path: Path) -> None:
    import resstream

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The king said that the queen was there, and the prince went home. " * 40)
    result = resstream.attribute_corpus(
        dataset=str(corpus), num_seqs=2, seq_len=10, neurons=False, progress=False
    )
    assert result.neurons == () and "not scored" in result.neuron_rule and len(result.heads) == 24


def test_an_unsupported_family_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    """A causal LM of a family without an adapter (BERT as a decoder) saved as a Hugging Face
    directory: one line naming the supported families, exit 2, nothing written."""
    from transformers import BertConfig, BertLMHeadModel

    from resstream.data import train_bpe
    from tests.test_models_loading import SENTENCES

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        is_decoder=True,
    )
    path = tmp_path / "bert"
    BertLMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    expect_usage_error(
        ["attribute", *FAST, "--model", str(path), "--text", "the cat sat"],
        tmp_path / "attr",
        capsys,
        "unsupported family 'bert'",
        "supported families",
        "docs/adding-a-model.md",
    )
