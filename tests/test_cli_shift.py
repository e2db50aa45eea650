"""`resstream shift` end to end, in-process, and its answers to bad input.

Spec (issue 3): `shift` writes shift.json, shift.csv, run.json and plots (one comparison figure
on a relative-depth axis with several models); bad input is one line on stderr naming the value
and what is allowed, exit code 2, nothing written to --out; Ctrl-C is exit code 130 and leaves
only complete files. A `.jsonl` of `input_ids` rows is used exactly as given.

(One file for the command's whole contract, so every bad input of the spec sits in one
table; hence longer than the ~500 lines we aim for.)
"""

from __future__ import annotations

import csv
import importlib
import json
import math
from pathlib import Path

import pytest

from resstream.analysis.shift.alignment import AlignmentResult
from resstream.api.shift import ShiftReport
from resstream.cli.main import main
from resstream.reporting.notebook import frame_csv
from tests.cli_support import (
    assert_complete_files,
    assert_nothing_written,
    check_interrupted,
    check_non_finite,
    expect_usage_error,
    interrupt,
    overflowing,
)
from tests.conftest import shared_data_path
from tests.test_models_loading import SENTENCES, _tiny_gpt2

#: Keys every per-model entry of shift.json must carry (the issue's schema).
MODEL_KEYS = {
    "model",
    "num_layers",
    "layers",
    "in_match",
    "out_match",
    "in_match_ci",
    "out_match_ci",
    "cos_in",
    "cos_out",
    "projection",
    "shift_layer",
    "num_tokens",
}

TEXT = (
    "\n".join(
        SENTENCES
        + [
            "to be or not to be that is the question",
            "whether tis nobler in the mind to suffer the slings and arrows of outrageous fortune",
            "or to take arms against a sea of troubles and by opposing end them",
            "now is the winter of our discontent made glorious summer by this sun of york",
        ]
        * 3
    )
    + "\n"
)

#: Fast, deterministic options shared by the runs below.
FAST = ["--device", "cpu", "--quiet"]

#: No test here may reach the network (the hub fails at once); one torch thread.
pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small UTF-8 text corpus (the 5 MB built-in one takes seconds to tokenise)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    """A tiny 2-layer GPT-2 (context 32) saved with save_pretrained, with its BPE tokenizer."""
    from resstream.data import train_bpe

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    path = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    _tiny_gpt2(len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def no_plots(monkeypatch):
    """Skip rendering PNGs (about 1 s a run) in tests that only read shift.json."""
    import resstream.reporting.shift as rendering

    for name in ("plot_match_rates", "plot_similarity", "plot_shift_depths", "plot_comparison"):
        monkeypatch.setattr(rendering, name, lambda *args, **kwargs: None)


def run_shift(out: Path, *args: str) -> int:
    return main(["shift", *FAST, *args, "--out", str(out)])


def check_model_entry(entry: dict, *, top_k: int, num_tokens: int | None = None) -> None:
    """The issue's per-model schema, with the ranges the metrics must respect."""
    assert set(entry) >= MODEL_KEYS, MODEL_KEYS - set(entry)
    n = entry["num_layers"]
    assert n >= 1 and entry["layers"] == list(range(n + 1))
    for key in ("in_match", "out_match", "in_match_ci", "out_match_ci", "cos_in", "cos_out", "projection"):
        assert len(entry[key]) == n + 1, key
    for rate_key in ("in_match", "out_match"):
        for rate, (lo, hi) in zip(entry[rate_key], entry[f"{rate_key}_ci"], strict=True):
            assert 0.0 <= rate <= 1.0
            assert 0.0 <= lo <= rate + 1e-12 and rate - 1e-12 <= hi <= 1.0, (rate_key, lo, rate, hi)
    for value in entry["cos_in"] + entry["cos_out"]:
        assert -1.0 - 1e-6 <= value <= 1.0 + 1e-6
    assert all(v is not None and math.isfinite(v) for v in entry["projection"])
    assert entry["shift_layer"] is None or 0.0 <= entry["shift_layer"] <= n
    if "top_k" in entry:
        assert entry["top_k"] == top_k
    if num_tokens is not None:
        assert entry["num_tokens"] == num_tokens
    if "shift_depths" in entry:
        assert sum(entry["shift_depths"]) + entry["never_shifted"] == entry["num_tokens"]


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_shift_reference_model_on_the_built_in_corpus(tmp_path, capsys, monkeypatch):
    # the whole 5 MB corpus is tokenised (seconds); tokenizers' threads only contend on 2 cores
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    out = tmp_path / "a" / "b"  # nested, created on demand
    code = run_shift(
        out,
        "--dataset",
        "shakespeare",
        "--num-seqs",
        "3",
        "--seq-len",
        "24",
        "--top-k",
        "3",
        "--batch-size",
        "2",
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for name in ("shift.json", "shift.csv", "run.json"):
        assert (out / name).is_file(), name
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["match_rates_reference.png", "shift_depths_reference.png", "similarity_reference.png"]
    assert_complete_files(out)

    report = json.loads((out / "shift.json").read_text())
    assert isinstance(report["models"], list) and len(report["models"]) == 1
    entry = report["models"][0]
    assert entry["model"] == "reference" and entry["num_layers"] == 6
    assert len(entry["layers"]) == entry["num_layers"] + 1
    # the reference tokenizer adds no BOS: every window scores seq_len - 1 positions
    check_model_entry(entry, top_k=3, num_tokens=3 * 23)

    rows = list(csv.DictReader((out / "shift.csv").open()))
    assert len(rows) == 7 * 6 and sorted({int(r["layer"]) for r in rows}) == list(range(7))
    assert (out / "shift.csv").read_text() == frame_csv(report_of(report).to_pandas())  # the frame

    record = json.loads((out / "run.json").read_text())
    assert record["seed"] == 0
    assert record["dataset_fingerprint"] and record["dataset_fingerprint"] == report["dataset_fingerprint"]
    assert record["config"]["command"] == "shift" and record["config"]["dataset"] == "shakespeare"
    assert record["config"]["top_k"] == 3 and record["config"]["num_seqs"] == 3
    assert "versions" in record and record["device"] == "cpu"
    assert "shift layer" in captured.out and "wrote shift.json" in captured.out


def test_two_models_in_one_run(tmp_path, corpus, gpt2_dir, capsys, monkeypatch):
    import resstream.reporting.shift as rendering
    from resstream.assets import reference_model_dir
    from resstream.reporting.figures import model_file_stem

    # per-model plots are checked above; here only the comparison figure is rendered
    drawn = []
    for name in ("plot_match_rates", "plot_similarity", "plot_shift_depths"):
        monkeypatch.setattr(rendering, name, lambda result, path: drawn.append(Path(path).name))

    out = tmp_path / "out"
    ref_dir = reference_model_dir()  # the built-in reference model, named by its directory
    code = run_shift(
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
        "16",
        "--top-k",
        "2",
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert (out / "comparison.png").is_file()
    assert sorted(drawn) == sorted(  # each model's plots are named after it
        f"{kind}_{stem}.png"
        for kind in ("match_rates", "similarity", "shift_depths")
        for stem in (model_file_stem(str(ref_dir)), model_file_stem(str(gpt2_dir)))
    )
    assert_complete_files(out)
    report = json.loads((out / "shift.json").read_text())
    assert len(report["models"]) == 2
    first, second = report["models"]
    assert first["model"] == str(ref_dir) and first["num_layers"] == 6
    assert second["model"] == str(gpt2_dir) and second["num_layers"] == 2
    for entry in report["models"]:
        check_model_entry(entry, top_k=2, num_tokens=3 * 15)
    rows = list(csv.DictReader((out / "shift.csv").open()))
    assert len(rows) == (7 + 3) * 6 and {r["model"] for r in rows} == {str(ref_dir), str(gpt2_dir)}
    assert (out / "shift.csv").read_text() == frame_csv(report_of(report).to_pandas())
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["models"] == [str(ref_dir), str(gpt2_dir)]
    assert str(gpt2_dir) in captured.out
    # two tokenizers: each model drew its own windows, and each line and entry says which
    assert first["sample"] != second["sample"] and report["sample"] is None
    lines = captured.out.splitlines()
    for entry in (first, second):
        assert any(line.startswith(entry["model"] + ":") and entry["sample"] in line for line in lines), lines


def report_of(data: dict) -> ShiftReport:
    """The `ShiftReport` a shift.json holds."""
    results = tuple(AlignmentResult.from_dict(entry) for entry in data["models"])
    fingerprint, num_seqs, seq_len = data["dataset_fingerprint"], data["num_seqs"], data["seq_len"]
    return ShiftReport(results, data["dataset"], fingerprint, num_seqs, seq_len)


def write_rows(path: Path, rows: list[list[int]]) -> Path:
    path.write_text("".join(json.dumps({"input_ids": row}) + "\n" for row in rows), encoding="utf-8")
    return path


PINNED = [[5, 17, 300, 42, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9], [100, 7, 7, 250, 31, 64, 12, 90, 4000, 3, 8, 11]]


def test_pinned_jsonl_rows_are_used_exactly_as_given(tmp_path, capsys, no_plots):
    rows = write_rows(tmp_path / "pinned.jsonl", PINNED)
    reports = []
    for i, (num_seqs, seq_len) in enumerate([("2", "16"), ("50", "64")]):
        out = tmp_path / f"out{i}"
        code = run_shift(
            out, "--dataset", str(rows), "--num-seqs", num_seqs, "--seq-len", seq_len, "--top-k", "2"
        )
        assert code == 0, capsys.readouterr().err
        reports.append(json.loads((out / "shift.json").read_text()))
    first, second = reports
    entry = first["models"][0]
    # no BOS added, no re-tokenisation, no sampling: one sequence per row, len - 1 targets each
    assert entry["num_tokens"] == sum(len(r) - 1 for r in PINNED)
    assert first["num_seqs"] == len(PINNED)
    check_model_entry(entry, top_k=2)
    # --num-seqs / --seq-len do not apply to pinned rows
    assert first["models"] == second["models"]
    assert first["num_seqs"] == second["num_seqs"] and first["seq_len"] == second["seq_len"]


def test_embedding_decoder(tmp_path, corpus, capsys, no_plots):
    out = tmp_path / "out"
    code = run_shift(
        out, "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "16", "--decoder", "embedding"
    )
    assert code == 0, capsys.readouterr().err
    entry = json.loads((out / "shift.json").read_text())["models"][0]
    check_model_entry(entry, top_k=5, num_tokens=2 * 15)
    assert entry.get("decoder", "embedding") == "embedding"
    assert json.loads((out / "run.json").read_text())["config"]["decoder"] == "embedding"


def test_results_do_not_depend_on_the_batch_size(tmp_path, corpus, capsys, no_plots):
    reports = []
    for batch in ("1", "3"):
        out = tmp_path / f"b{batch}"
        code = run_shift(
            out,
            "--dataset",
            str(corpus),
            "--num-seqs",
            "3",
            "--seq-len",
            "16",
            "--top-k",
            "3",
            "--batch-size",
            batch,
        )
        assert code == 0, capsys.readouterr().err
        reports.append(json.loads((out / "shift.json").read_text()))
    assert reports[0] == reports[1]


needs_shared_data = pytest.mark.skipif(
    not (shared_data_path() / "wikitext-2" / "wikitext-2-raw-v1.test.hf-rows.txt").is_file(),
    reason="shared/data (offline corpora) is not present",
)


@needs_shared_data
def test_real_corpus_wikitext2(tmp_path, capsys, no_plots):
    out = tmp_path / "out"
    code = run_shift(
        out,
        "--dataset",
        "wikitext-2",
        "--data-dir",
        str(shared_data_path()),
        "--num-seqs",
        "4",
        "--seq-len",
        "32",
        "--top-k",
        "5",
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "shift.json").read_text())
    assert report["dataset"] == "wikitext-2" and "wikitext-2" in report["sample"]
    check_model_entry(report["models"][0], top_k=5, num_tokens=4 * 31)
    record = json.loads((out / "run.json").read_text())
    assert record["dataset_fingerprint"] == report["dataset_fingerprint"] and record["seed"] == 0


# --------------------------------------------------------------------------- bad input


def _bad(
    tmp_path: Path, capsys, args: list[str], *patterns: str, out: Path | None = None, one_line: bool = True
) -> str:
    """Exit code 2, one line on stderr naming the value, nothing written to --out."""
    return expect_usage_error(
        ["shift", *FAST, *args], out or tmp_path / "out", capsys, *patterns, one_line=one_line
    )


@pytest.mark.parametrize(
    ("extra", "patterns"),
    [
        (["--top-k", "0"], ["--top-k 0", "[1, 4096]"]),
        (["--top-k", "4097"], ["--top-k 4097", "[1, 4096]"]),
        (["--top-k", "abc"], ["'abc'"]),
        (["--seq-len", "129"], ["--seq-len 129", "128"]),
        (["--seq-len", "1"], ["--seq-len 1"]),
        (["--num-seqs", "0"], ["--num-seqs 0", ">= 1"]),
        (["--num-seqs", "1000"], ["--num-seqs 1000", "corpus.txt", "it has"]),
        (["--decoder", "embeding"], ["'embeding'", "did you mean 'embedding'", "logit-lens"]),
        (["--decoder", "bogus"], ["unknown decoder 'bogus'", "logit-lens, embedding, tuned:DIR"]),
        (["--decoder", "tuned"], ["'tuned' needs its lens directory: tuned:DIR"]),
        (["--decoder", "tuned:"], ["'tuned' needs its lens directory: tuned:DIR"]),
        (["--decoder", "logit-lens", "--decoder", "logit-lens"], ["decoder 'logit-lens' is given twice"]),
        (["--batch-size", "0"], ["--batch-size 0", ">= 1"]),
        (["--dtype", "float64"], ["'float64'", "float32"]),
        (["--device", "tpu"], ["'tpu'", "cpu"]),
    ],
)
def test_bad_options(tmp_path, corpus, capsys, extra, patterns):
    _bad(
        tmp_path, capsys, ["--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "16", *extra], *patterns
    )


def test_more_sequences_than_the_corpus_holds_says_how_many_it_holds(tmp_path, corpus, capsys):
    err = _bad(tmp_path, capsys, ["--dataset", str(corpus), "--num-seqs", "1000", "--seq-len", "16"])
    import re

    held = re.search(r"it has (\d+)", err)
    assert held and 0 < int(held.group(1)) < 1000, err


HF_BAD = [
    (["--seq-len", "33"], ["--seq-len 33", "32"]),  # the tiny GPT-2's context is 32
    (["--top-k", "301"], ["--top-k 301", "300"]),  # its vocabulary is 300
]


@pytest.mark.parametrize(("extra", "patterns"), HF_BAD)
def test_bad_options_for_a_hf_model(tmp_path, corpus, gpt2_dir, capsys, extra, patterns):
    # the message itself (the strict one-line rule is checked just below)
    _bad(
        tmp_path,
        capsys,
        ["--model", str(gpt2_dir), "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "16", *extra],
        *patterns,
        one_line=False,
    )


@pytest.mark.parametrize(("extra", "patterns"), HF_BAD[:1])
def test_bad_options_for_a_hf_model_one_line(tmp_path, corpus, gpt2_dir, capsys, extra, patterns):
    _bad(
        tmp_path,
        capsys,
        ["--model", str(gpt2_dir), "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "16", *extra],
        *patterns,
    )


# ----- models


def test_model_path_that_does_not_exist(tmp_path, corpus, capsys):
    missing = tmp_path / "nowhere"
    _bad(
        tmp_path, capsys, ["--model", str(missing), "--dataset", str(corpus)], str(missing), "does not exist"
    )


def test_hub_name_offline(tmp_path, corpus, capsys):
    _bad(
        tmp_path,
        capsys,
        ["--model", "no-such-org/no-such-model", "--dataset", str(corpus)],
        "'no-such-org/no-such-model'",
        "offline",
    )


def test_directory_without_config(tmp_path, corpus, capsys):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    _bad(tmp_path, capsys, ["--model", str(empty), "--dataset", str(corpus)], str(empty), "config.json")


def test_model_path_that_is_a_file(tmp_path, corpus, capsys):
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"x")
    _bad(tmp_path, capsys, ["--model", str(weights), "--dataset", str(corpus)], str(weights), "is a file")


def _save_config(path: Path, config) -> Path:
    config.save_pretrained(path)
    return path


def test_unsupported_causal_family_lists_the_supported_ones(tmp_path, corpus, capsys):
    from transformers import OPTConfig

    from resstream.models.adapters.registry import supported_families

    opt = _save_config(
        tmp_path / "tiny-opt",
        OPTConfig(
            num_hidden_layers=1,
            hidden_size=16,
            ffn_dim=32,
            num_attention_heads=2,
            vocab_size=50,
            word_embed_proj_dim=16,
            architectures=["OPTForCausalLM"],
        ),
    )
    err = _bad(tmp_path, capsys, ["--model", str(opt), "--dataset", str(corpus)], str(opt), "'opt'")
    for family in supported_families():
        assert family in err, family


def test_decoder_configured_bert_is_an_unsupported_family(tmp_path, corpus, capsys):
    from transformers import BertConfig

    bert = _save_config(
        tmp_path / "bert-decoder",
        BertConfig(
            num_hidden_layers=1,
            hidden_size=16,
            num_attention_heads=2,
            intermediate_size=32,
            vocab_size=50,
            is_decoder=True,
            architectures=["BertLMHeadModel"],
        ),
    )
    _bad(
        tmp_path,
        capsys,
        ["--model", str(bert), "--dataset", str(corpus)],
        str(bert),
        "'bert'",
        "gpt2",
        "llama",
    )


@pytest.mark.parametrize("kind", ["bert-mlm", "t5"])
def test_non_causal_models(tmp_path, corpus, capsys, kind):
    from transformers import BertConfig, T5Config

    if kind == "bert-mlm":
        config = BertConfig(
            num_hidden_layers=1,
            hidden_size=16,
            num_attention_heads=2,
            intermediate_size=32,
            vocab_size=50,
            architectures=["BertForMaskedLM"],
        )
    else:
        config = T5Config(
            num_layers=1,
            d_model=16,
            d_ff=32,
            num_heads=2,
            d_kv=8,
            vocab_size=50,
            architectures=["T5ForConditionalGeneration"],
        )
    path = _save_config(tmp_path / kind, config)
    _bad(tmp_path, capsys, ["--model", str(path), "--dataset", str(corpus)], str(path), "not a causal LM")


def test_missing_tokenizer(tmp_path, corpus, capsys):
    path = tmp_path / "no-tokenizer"
    _tiny_gpt2(300).save_pretrained(path)
    _bad(tmp_path, capsys, ["--model", str(path), "--dataset", str(corpus)], str(path), "tokenizer")


def test_a_bad_second_model_writes_nothing(tmp_path, corpus, capsys):
    from resstream.assets import reference_model_dir

    missing = tmp_path / "nowhere"
    _bad(
        tmp_path,
        capsys,
        [
            "--model",
            str(reference_model_dir()),
            "--model",
            str(missing),
            "--dataset",
            str(corpus),
            "--num-seqs",
            "2",
            "--seq-len",
            "16",
        ],
        str(missing),
    )


# ----- datasets


def test_unknown_dataset_name_suggests_and_lists(tmp_path, capsys):
    _bad(tmp_path, capsys, ["--dataset", "wikitext-3"], "'wikitext-3'", "wikitext-2", "shakespeare")


def test_missing_file(tmp_path, capsys):
    _bad(tmp_path, capsys, ["--dataset", str(tmp_path / "missing.txt")], "missing.txt", "does not exist")
    _bad(tmp_path, capsys, ["--dataset", str(tmp_path / "missing.jsonl")], "missing.jsonl", "does not exist")


@pytest.mark.parametrize(("name", "content"), [("blank.txt", b"  \n\n"), ("empty.jsonl", b"")])
def test_empty_file(tmp_path, capsys, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    _bad(tmp_path, capsys, ["--dataset", str(path)], name, "empty")


@pytest.mark.parametrize("name", ["latin1.txt", "latin1.jsonl"])
def test_non_utf8_file_names_the_file_and_the_byte_offset(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_bytes(b'{"text": "caf\xe9 au lait"}\n' if name.endswith(".jsonl") else b"caf\xe9 au lait\n")
    offset = path.read_bytes().index(b"\xe9")
    _bad(tmp_path, capsys, ["--dataset", str(path)], name, f"byte offset {offset}")


def test_dataset_that_is_a_directory(tmp_path, capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    _bad(tmp_path, capsys, ["--dataset", str(folder)], str(folder))


@pytest.mark.parametrize(
    ("rows", "pattern"),
    [
        ([[5]], "fewer than 2"),
        ([[1, 2, 3], [7]], "row 2"),
        ([["a", "b"]], "input_ids"),
    ],
)
def test_bad_pinned_rows(tmp_path, capsys, rows, pattern):
    path = write_rows(tmp_path / "rows.jsonl", rows)
    _bad(tmp_path, capsys, ["--dataset", str(path)], "rows.jsonl", pattern)


def test_pinned_row_longer_than_the_context(tmp_path, capsys):
    path = write_rows(tmp_path / "long.jsonl", [[1, 2, 3], list(range(3, 3 + 129))])
    _bad(tmp_path, capsys, ["--dataset", str(path)], "129", "128")


def test_pinned_row_with_an_id_outside_the_vocabulary(tmp_path, capsys):
    path = write_rows(tmp_path / "oov.jsonl", [[1, 2, 3], [4, 5000, 6]])
    _bad(tmp_path, capsys, ["--dataset", str(path)], "oov.jsonl", "5000", "4096")


# ----- --out


def test_out_is_an_existing_file(tmp_path, corpus, capsys):
    target = tmp_path / "out"
    target.write_text("keep me")
    code = run_shift(target, "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "16")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--out" in err and str(target) in err, err
    assert target.read_text() == "keep me"


def test_bad_input_into_an_existing_empty_out_dir_writes_nothing(tmp_path, corpus, capsys):
    out = tmp_path / "out"
    out.mkdir()
    _bad(tmp_path, capsys, ["--dataset", str(corpus), "--top-k", "0"], "--top-k 0", out=out)


def test_non_finite_states_are_one_line_and_exit_1(tmp_path, corpus, capsys, monkeypatch):
    module = importlib.import_module("resstream.api.shift")
    monkeypatch.setattr(module, "residual_states", overflowing(module.residual_states))
    out = tmp_path / "out"
    code = run_shift(out, "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "16")
    check_non_finite(code, capsys, out)


# --------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_during_the_forward_pass_writes_nothing(tmp_path, corpus, capsys, monkeypatch):

    monkeypatch.setattr(importlib.import_module("resstream.api.shift"), "residual_states", interrupt)
    out = tmp_path / "out"
    code = run_shift(out, "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "16")
    check_interrupted(code, capsys)
    assert_nothing_written(out)


def test_ctrl_c_says_it_was_interrupted(tmp_path, corpus, capsys, monkeypatch):

    monkeypatch.setattr(importlib.import_module("resstream.api.shift"), "residual_states", interrupt)
    code = run_shift(tmp_path / "out", "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "16")
    err = capsys.readouterr().err.strip()
    assert code == 130
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error: interrupted"), err


def test_ctrl_c_while_plotting_keeps_the_previous_set(tmp_path, corpus, capsys, monkeypatch):
    import resstream.reporting.shift

    out = tmp_path / "out"
    assert run_shift(out, "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "16") == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(resstream.reporting.shift, "plot_similarity", interrupt)
    code = run_shift(out, "--dataset", str(corpus), "--num-seqs", "3", "--seq-len", "16")
    check_interrupted(code, capsys)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert_complete_files(out)


def test_ctrl_c_inside_a_file_write_leaves_nothing(tmp_path, corpus, capsys, monkeypatch):
    import resstream.io

    real = resstream.io.write_text
    written: list[str] = []

    def write_text(path, text):
        written.append(Path(path).name)
        if len(written) == 2:  # the second file: half written into its temporary, then Ctrl-C
            with resstream.io.atomic_path(path) as tmp:
                tmp.write_text(text[: len(text) // 2], encoding="utf-8")
                raise KeyboardInterrupt
        real(path, text)

    monkeypatch.setattr(resstream.io, "write_text", write_text)
    out = tmp_path / "out"
    code = run_shift(out, "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "16")
    check_interrupted(code, capsys)
    assert len(written) == 2
    assert_nothing_written(out)


# --------------------------------------------------------------------------- the sequence length


def _refuse_loading(monkeypatch) -> None:
    """Make loading any model fail the test: a refusal must come before it."""
    import resstream.api.inputs as inputs

    monkeypatch.setattr(inputs, "load_model", lambda *args, **kwargs: pytest.fail("a model was loaded"))


def test_the_default_length_is_clipped_to_the_shortest_context_with_a_note(
    tmp_path, corpus, gpt2_dir, capsys, no_plots
):
    out = tmp_path / "out"
    code = run_shift(
        out, "--model", str(gpt2_dir), "--model", "reference", "--dataset", str(corpus), "--num-seqs", "2"
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    note = [line for line in captured.err.splitlines() if line.startswith("resstream: note:")]
    assert note == [
        f"resstream: note: --seq-len 32: the default 128 is longer than the context of model "
        f"{str(gpt2_dir)!r} (32 tokens)"
    ]
    report = json.loads((out / "shift.json").read_text())
    assert report["seq_len"] == 32 and json.loads((out / "run.json").read_text())["config"]["seq_len"] == 32
    assert all(entry["num_tokens"] == 2 * 31 for entry in report["models"])


def test_a_default_that_fits_gives_no_note(tmp_path, corpus, capsys, no_plots):
    code = run_shift(tmp_path / "out", "--dataset", str(corpus), "--num-seqs", "2")
    captured = capsys.readouterr()
    assert code == 0 and "note" not in captured.err, captured.err


@pytest.mark.parametrize(
    ("extra", "patterns"),
    [
        (
            ["--seq-len", "64"],
            ["--seq-len 64 is longer than the context of model", "(32 tokens); allowed: 2..32"],
        ),
        (["--seq-len", "1"], ["--seq-len 1 is too short"]),
        (["--num-seqs", "0"], ["--num-seqs 0 must be >= 1"]),
        (["--dataset", "no-such-corpus"], ["unknown dataset 'no-such-corpus'"]),
    ],
)
def test_bad_sample_requests_are_refused_before_any_model_loads(
    tmp_path, corpus, gpt2_dir, capsys, monkeypatch, extra, patterns
):
    _refuse_loading(monkeypatch)
    _bad(tmp_path, capsys, ["--model", str(gpt2_dir), "--dataset", str(corpus), *extra], *patterns)
