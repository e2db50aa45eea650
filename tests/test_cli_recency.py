"""`resstream recency` end to end, in-process, and its answers to bad input.

Spec (issue): `recency` writes recency.json (dataset, dataset_fingerprint, seq_len and, per
model, model, num_layers, num_heads, seq_len, num_sequences, mean_attention[layer][q][k],
stderr and layers with by_distance and per-head recency / primacy / by_distance), recency.npz
(`mean_attention_heads_<i>` of shape (L, H, T, T)), recency.png, distance.png (distance_<i>.png
for several models) and run.json. Bad input is one line on stderr naming the value and what is
allowed, exit code 2, nothing written to --out; Ctrl-C is exit code 130.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from resstream.cli.main import main
from tests.cli_support import (
    assert_complete_files,
    assert_nothing_written,
    check_interrupted,
    expect_usage_error,
    interrupt,
    strict_json,
    verdict_layers,
)
from tests.test_cli_shift import TEXT, write_rows
from tests.test_models_loading import SENTENCES, _tiny_gpt2

FAST = ["--device", "cpu", "--quiet"]

#: No test here may reach the network (the hub fails at once); one torch thread.
pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")
MODEL_KEYS = {
    "model",
    "num_layers",
    "num_heads",
    "seq_len",
    "num_sequences",
    "mean_attention",
    "stderr",
    "layers",
}
HEAD_KEYS = {"head", "trend", "recency", "primacy", "by_distance"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small UTF-8 text corpus (the 5 MB built-in one takes seconds to tokenise)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    """A tiny 2-layer, 4-head GPT-2 (context 32) saved with save_pretrained, with its BPE tokenizer."""
    from resstream.data import train_bpe

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    path = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    _tiny_gpt2(len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def no_plots(monkeypatch):
    """Skip rendering PNGs in tests that only read the numbers."""
    import resstream.reporting.attention as rendering

    for name in ("plot_attention_grid", "plot_distance_profiles"):
        monkeypatch.setattr(rendering, name, lambda *args, **kwargs: None)


def run_recency(out: Path, *args: str) -> int:
    return main(["recency", *FAST, *args, "--out", str(out)])


def check_model_entry(
    entry: dict, *, num_layers: int, num_heads: int, seq_len: int, num_sequences: int
) -> None:
    """The issue's per-model schema, with causal rows that are distributions over keys j <= i."""
    assert set(entry) >= MODEL_KEYS, MODEL_KEYS - set(entry)
    assert (entry["num_layers"], entry["num_heads"], entry["seq_len"], entry["num_sequences"]) == (
        num_layers,
        num_heads,
        seq_len,
        num_sequences,
    )
    mean, stderr = np.array(entry["mean_attention"], dtype=float), np.array(entry["stderr"], dtype=float)
    assert mean.shape == stderr.shape == (num_layers, seq_len, seq_len)
    np.testing.assert_allclose(mean.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(mean, k=1) == 0.0), "attention to future keys"
    assert np.all(mean >= 0.0) and np.all(mean <= 1.0 + 1e-6)
    if num_sequences >= 2:
        assert np.all(np.isfinite(stderr)) and np.all(stderr >= 0.0)
    assert len(entry["layers"]) == num_layers
    # the trend leads: one entry per layer at the top, the same as each layer's own
    assert len(entry["trend"]) == num_layers
    for number, layer in enumerate(entry["layers"], start=1):
        assert layer["layer"] == number
        assert {"trend", "recency", "primacy", "by_distance", "heads"} <= set(layer)
        assert list(layer)[:2] == ["layer", "trend"] and layer["trend"] == entry["trend"][number - 1]
        check_trend(layer["trend"], seq_len, num_sequences)
        by_distance = layer["by_distance"]
        assert len(by_distance) == seq_len
        # δ tokens back, averaged over the queries where that distance exists
        expected = [np.mean([mean[number - 1][i][i - d] for i in range(d, seq_len)]) for d in range(seq_len)]
        np.testing.assert_allclose(by_distance, expected, atol=1e-9)
        assert [head["head"] for head in layer["heads"]] == list(range(num_heads))
        for head in layer["heads"]:
            assert set(head) >= HEAD_KEYS, HEAD_KEYS - set(head)
            assert len(head["by_distance"]) == seq_len
            assert head["recency"]["direction"] == "recency" and head["primacy"]["direction"] == "primacy"
            check_trend(head["trend"], seq_len, num_sequences)
            assert isinstance(head["recency"]["holds"], bool)


def check_trend(trend: dict, seq_len: int, num_sequences: int) -> None:
    """A layer's or head's trend: direction, ρ in [−1, 1] inside its interval, one ratio per band."""
    assert trend["direction"] in ("recency", "primacy", "none", "untestable")
    assert trend["samples"] == num_sequences and trend["level"] == 0.95
    rho = trend["spearman"]
    assert -1.0 <= rho["value"] <= 1.0
    if num_sequences >= 2:
        assert rho["low"] <= rho["value"] <= rho["high"]
    bands = [band["distances"] for band in trend["bands"]]
    assert bands[0] == [0, 0] and bands[1][0] == 1 and bands[-1][1] == seq_len - 1
    for band in trend["bands"]:
        assert band["ratio"]["value"] >= 0.0


def check_head_arrays(out: Path, report: dict) -> None:
    """recency.npz: (L, H, T, T) per-head means whose head average is recency.json's matrix."""
    with np.load(out / "recency.npz") as arrays:
        for index, entry in enumerate(report["models"]):
            heads = arrays[f"mean_attention_heads_{index}"]
            shape = (entry["num_layers"], entry["num_heads"], entry["seq_len"], entry["seq_len"])
            assert heads.shape == shape, (index, heads.shape)
            np.testing.assert_allclose(heads.sum(-1), 1.0, atol=1e-5)
            np.testing.assert_allclose(heads.mean(axis=1), np.array(entry["mean_attention"]), atol=1e-6)
            # each head's distance profile in recency.json comes from the same per-head matrices
            for layer_index, layer in enumerate(entry["layers"]):
                for head in layer["heads"]:
                    matrix = heads[layer_index, head["head"]]
                    t = matrix.shape[0]
                    first = np.mean(np.diag(matrix))
                    assert head["by_distance"][0] == pytest.approx(first, abs=1e-6)
                    assert head["by_distance"][t - 1] == pytest.approx(matrix[t - 1, 0], abs=1e-6)


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_reference_model_on_the_built_in_corpus(tmp_path, capsys, monkeypatch):
    # the whole 5 MB corpus is tokenised (seconds); tokenizers' threads only contend on 2 cores
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    out = tmp_path / "a" / "b"  # nested, created on demand
    code = run_recency(
        out, "--dataset", "shakespeare", "--num-seqs", "3", "--seq-len", "12", "--batch-size", "2"
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    names = sorted(p.name for p in out.iterdir())
    names_expected = ["distance_reference.png", "recency.json", "recency.npz", "recency.png", "run.json"]
    assert names == names_expected, names
    assert_complete_files(out)

    report = strict_json(out / "recency.json")
    assert {"dataset", "dataset_fingerprint", "seq_len", "models"} <= set(report)
    assert report["dataset"] == "shakespeare" and report["seq_len"] == 12 and report["dataset_fingerprint"]
    assert len(report["models"]) == 1
    entry = report["models"][0]
    assert entry["model"] == "reference"
    check_model_entry(entry, num_layers=6, num_heads=4, seq_len=12, num_sequences=3)
    check_head_arrays(out, report)

    record = strict_json(out / "run.json")
    assert record["config"]["command"] == "recency" and record["config"]["dataset"] == "shakespeare"
    assert record["config"]["num_seqs"] == 3 and record["config"]["seq_len"] == 12
    assert record["seed"] == 0 and record["device"] == "cpu"
    assert record["dataset_fingerprint"] == report["dataset_fingerprint"]
    assert verdict_layers(captured.out) == [1, 2, 3, 4, 5, 6], captured.out
    assert "reference" in captured.out and "wrote recency.json" in captured.out
    assert "distance_reference.png" in captured.out
    # the rule that makes a layer "none" despite a clear ρ, once, after the verdicts
    assert captured.out.count("direction: recency (primacy) when ρ's 95% interval") == 1
    assert "at least 5% off uniform" in captured.out
    # under each layer's trend and strict lines, its heads' directions and ρ
    assert len(re.findall(r"^\s+heads: .*\(ρ by head( [+-]\d\.\d\d){4}\)$", captured.out, re.MULTILINE)) == 6


def test_two_models_write_one_distance_plot_each(tmp_path, corpus, gpt2_dir, capsys):
    from resstream.assets import reference_model_dir

    out = tmp_path / "out"
    ref_dir = reference_model_dir()
    code = run_recency(
        out,
        "--model",
        str(ref_dir),
        "--model",
        str(gpt2_dir),
        "--dataset",
        str(corpus),
        "--num-seqs",
        "3",
        "--seq-len",
        "10",
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    names = sorted(p.name for p in out.iterdir())
    # one distance plot per model, named after its last two path parts
    assert names == [
        "distance_assets_reference.png",
        f"distance_{gpt2_dir.parent.name}_tiny-gpt2.png",
        "recency.json",
        "recency.npz",
        "recency.png",
        "run.json",
    ], names
    assert_complete_files(out)

    report = strict_json(out / "recency.json")
    assert report["seq_len"] == 10 and report["dataset"] == str(corpus)
    first, second = report["models"]
    assert first["model"] == str(ref_dir) and second["model"] == str(gpt2_dir)
    check_model_entry(first, num_layers=6, num_heads=4, seq_len=10, num_sequences=3)
    check_model_entry(second, num_layers=2, num_heads=4, seq_len=10, num_sequences=3)
    check_head_arrays(out, report)
    with np.load(out / "recency.npz") as arrays:
        assert arrays["mean_attention_heads_0"].shape == (6, 4, 10, 10)
        assert arrays["mean_attention_heads_1"].shape == (2, 4, 10, 10)

    assert strict_json(out / "run.json")["config"]["models"] == [str(ref_dir), str(gpt2_dir)]
    assert str(gpt2_dir) in captured.out
    assert verdict_layers(captured.out) == [1, 2, 3, 4, 5, 6, 1, 2], captured.out


def test_model_trained_without_positional_embeddings(tmp_path, capsys, no_plots, monkeypatch):
    from tests.test_train import corpus_text

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    corpus = tmp_path / "train.txt"
    corpus.write_text(corpus_text(), encoding="utf-8")
    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            "--pos-emb",
            "none",
            "--max-steps",
            "2",
            "--dataset",
            str(corpus),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(run_dir),
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    meta = json.loads((run_dir / "model.json").read_text())
    assert meta["config"]["model"]["pos_emb"] == "none"

    out = tmp_path / "out"
    code = run_recency(
        out, "--model", str(run_dir), "--dataset", str(corpus), "--num-seqs", "3", "--seq-len", "12"
    )
    assert code == 0, capsys.readouterr().err
    report = strict_json(out / "recency.json")
    entry = report["models"][0]
    assert entry["model"] == str(run_dir)
    check_model_entry(entry, num_layers=2, num_heads=2, seq_len=12, num_sequences=3)
    check_head_arrays(out, report)


def test_pinned_jsonl_rows_of_one_length(tmp_path, capsys, no_plots):
    rows = [[5, 17, 300, 42, 9, 11], [1, 2, 3, 4, 5, 6], [100, 7, 7, 250, 31, 64], [8, 9, 10, 11, 12, 13]]
    path = write_rows(tmp_path / "pinned.jsonl", rows)
    out = tmp_path / "out"
    # --num-seqs / --seq-len do not apply to pinned rows: every row is used as given
    code = run_recency(out, "--dataset", str(path), "--num-seqs", "2", "--seq-len", "16", "--batch-size", "3")
    assert code == 0, capsys.readouterr().err
    report = strict_json(out / "recency.json")
    assert report["seq_len"] == 6
    check_model_entry(report["models"][0], num_layers=6, num_heads=4, seq_len=6, num_sequences=4)
    check_head_arrays(out, report)


def test_results_do_not_depend_on_the_batch_size(tmp_path, corpus, capsys, no_plots):
    reports = []
    for batch in ("1", "3"):
        out = tmp_path / f"b{batch}"
        code = run_recency(
            out, "--dataset", str(corpus), "--num-seqs", "3", "--seq-len", "8", "--batch-size", batch
        )
        assert code == 0, capsys.readouterr().err
        reports.append(strict_json(out / "recency.json"))
    first, second = (np.array(r["models"][0]["mean_attention"]) for r in reports)
    np.testing.assert_allclose(first, second, atol=1e-6)
    assert reports[0]["models"][0]["num_sequences"] == reports[1]["models"][0]["num_sequences"] == 3


def test_one_sequence_claims_no_trend(tmp_path, corpus, capsys, no_plots):
    out = tmp_path / "out"
    assert run_recency(out, "--dataset", str(corpus), "--num-seqs", "1", "--seq-len", "8") == 0, (
        capsys.readouterr().err
    )
    for layer in strict_json(out / "recency.json")["models"][0]["layers"]:
        for direction in ("recency", "primacy"):
            assert not layer[direction]["holds"] and not layer[direction]["holding_rows"], (
                layer["layer"],
                direction,
            )


# --------------------------------------------------------------------------- bad input


def _bad(tmp_path: Path, capsys, args: list[str], *patterns: str, out: Path | None = None) -> str:
    """Exit code 2, one line on stderr naming the value and what is allowed, nothing written."""
    return expect_usage_error(["recency", *FAST, *args], out or tmp_path / "out", capsys, *patterns)


@pytest.mark.parametrize(
    ("extra", "patterns"),
    [
        (["--seq-len", "129"], ["--seq-len 129", "128"]),
        (["--seq-len", "1"], ["--seq-len 1"]),
        (["--num-seqs", "0"], ["--num-seqs 0", ">= 1"]),
        (["--num-seqs", "1000"], ["--num-seqs 1000", "corpus.txt", "it has"]),
        (["--batch-size", "0"], ["--batch-size 0", ">= 1"]),
        (["--threshold", "0"], ["--threshold 0", "> 0"]),
        (["--threshold", "-1"], ["--threshold -1", "> 0"]),
        (["--dtype", "float64"], ["'float64'", "float32"]),
        (["--device", "tpu"], ["'tpu'", "cpu"]),
        (["--batch-size", "many"], ["--batch-size", "'many'"]),
    ],
)
def test_bad_options(tmp_path, corpus, capsys, extra, patterns):
    _bad(tmp_path, capsys, ["--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "8", *extra], *patterns)


def test_more_sequences_than_the_corpus_holds_says_how_many_it_holds(tmp_path, corpus, capsys):
    err = _bad(tmp_path, capsys, ["--dataset", str(corpus), "--num-seqs", "1000", "--seq-len", "16"])
    held = re.search(r"it has (\d+)", err)
    assert held and 0 < int(held.group(1)) < 1000, err


def test_seq_len_over_a_hf_models_context(tmp_path, corpus, gpt2_dir, capsys):
    # the tiny GPT-2's context is 32
    _bad(
        tmp_path,
        capsys,
        ["--model", str(gpt2_dir), "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "33"],
        "--seq-len 33",
        "32",
    )


def test_the_default_length_is_clipped_to_a_short_context_with_a_note(
    tmp_path, corpus, gpt2_dir, capsys, no_plots
):
    # the default 64 tokens exceed the tiny GPT-2's context of 32: clipped, and said so
    out = tmp_path / "out"
    code = run_recency(out, "--model", str(gpt2_dir), "--dataset", str(corpus), "--num-seqs", "2")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert (
        f"resstream: note: --seq-len 32: the default 64 is longer than the context of model "
        f"{str(gpt2_dir)!r} (32 tokens)" in captured.err.splitlines()
    )
    assert json.loads((out / "recency.json").read_text())["seq_len"] == 32


def test_seq_len_over_the_second_models_context_writes_nothing(tmp_path, corpus, gpt2_dir, capsys):
    from resstream.assets import reference_model_dir

    _bad(
        tmp_path,
        capsys,
        [
            "--model",
            str(reference_model_dir()),
            "--model",
            str(gpt2_dir),
            "--dataset",
            str(corpus),
            "--num-seqs",
            "2",
            "--seq-len",
            "40",
        ],
        "--seq-len 40",
        "32",
    )


def test_model_path_that_does_not_exist(tmp_path, corpus, capsys):
    missing = tmp_path / "nowhere"
    _bad(
        tmp_path, capsys, ["--model", str(missing), "--dataset", str(corpus)], str(missing), "does not exist"
    )


def test_a_bad_second_model_writes_nothing(tmp_path, corpus, capsys):
    missing = tmp_path / "nowhere"
    _bad(
        tmp_path,
        capsys,
        [
            "--model",
            "reference",
            "--model",
            str(missing),
            "--dataset",
            str(corpus),
            "--num-seqs",
            "2",
            "--seq-len",
            "8",
        ],
        str(missing),
    )


def test_unknown_dataset_name_suggests_and_lists(tmp_path, capsys):
    _bad(tmp_path, capsys, ["--dataset", "wikitext-3"], "'wikitext-3'", "wikitext-2", "shakespeare")


def test_missing_dataset_file(tmp_path, capsys):
    _bad(tmp_path, capsys, ["--dataset", str(tmp_path / "missing.txt")], "missing.txt", "does not exist")


def test_pinned_rows_of_different_lengths(tmp_path, capsys):
    path = write_rows(tmp_path / "ragged.jsonl", [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]])
    err = _bad(tmp_path, capsys, ["--dataset", str(path)], "ragged.jsonl", "one length")
    assert "recency" in err, err


def test_pinned_row_with_an_id_outside_the_vocabulary(tmp_path, capsys):
    path = write_rows(tmp_path / "oov.jsonl", [[1, 2, 3], [4, 5000, 6]])
    _bad(tmp_path, capsys, ["--dataset", str(path)], "oov.jsonl", "5000", "4096")


def test_out_is_an_existing_file(tmp_path, corpus, capsys):
    target = tmp_path / "out"
    target.write_text("keep me")
    code = run_recency(target, "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "8")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--out" in err and str(target) in err, err
    assert target.read_text() == "keep me"


def test_bad_input_into_an_existing_empty_out_dir_writes_nothing(tmp_path, corpus, capsys):
    out = tmp_path / "out"
    out.mkdir()
    _bad(tmp_path, capsys, ["--dataset", str(corpus), "--batch-size", "0"], "--batch-size 0", out=out)


# --------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_during_the_forward_pass_writes_nothing(tmp_path, corpus, capsys, monkeypatch):

    monkeypatch.setattr(importlib.import_module("resstream.api.recency"), "attention_probs", interrupt)
    out = tmp_path / "out"
    check_interrupted(run_recency(out, "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "8"), capsys)
    assert_nothing_written(out)


def test_ctrl_c_while_plotting_writes_nothing(tmp_path, corpus, capsys, monkeypatch):
    import resstream.reporting.attention

    monkeypatch.setattr(resstream.reporting.attention, "plot_distance_profiles", interrupt)
    out = tmp_path / "out"
    check_interrupted(run_recency(out, "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "8"), capsys)
    assert_nothing_written(out)  # recency.json and recency.npz were staged: they are gone with the rest
