"""`resstream sweep` and `resstream compare` end to end, in-process, and their answers to bad input."""

from __future__ import annotations

import json

import matplotlib.image
import pytest

from resstream.cli.main import main
from tests.test_reporting import EVALS, VAL, write_sweep
from tests.test_sweep import write_corpus, write_data_dir

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
    "--max-steps",
    "3",
    "--eval-interval",
    "3",
    "--eval-batches",
    "1",
    "--checkpoint-interval",
    "3",
    "--warmup-steps",
    "1",
    "--threads",
    "1",
    "--device",
    "cpu",
]


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path)
    write_data_dir(tmp_path)
    return tmp_path


def sweep_args(root, *extra):
    return [
        "sweep",
        "--preset",
        "tiny",
        "--dataset",
        str(root / "corpus.txt"),
        "--cache-dir",
        str(root / "cache"),
        "--data-dir",
        str(root / "data"),
        *TINY,
        *extra,
    ]


def test_sweep_then_compare(setup, capsys):
    out = setup / "out"
    code = main(
        sweep_args(
            setup,
            "--seeds",
            "0,1",
            "--layers",
            "1",
            "--alpha",
            "0.25",
            "--benchmarks",
            "openwebtext,lambada",
            "--max-eval-tokens",
            "150",
            "--out",
            str(out),
        )
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "sweep [1/6] seed 0 baseline: training" in captured.err
    assert "sweep of 6 runs finished" in captured.out
    runs = {str(p.parent.relative_to(out)) for p in out.glob("seed-*/*/model.json")}
    assert runs == {f"seed-{s}/{n}" for s in (0, 1) for n in ("baseline", "fixed-k1", "learned")}
    assert all((out / r / "eval.json").is_file() for r in runs)
    for name in ("sweep.json", "sweep.csv", "run.json", "sweep_val_loss.png", "learned_gate_heatmap.png"):
        assert (out / name).is_file(), name
    for name in ("sweep_val_loss.png", "learned_gate_heatmap.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert matplotlib.image.imread(out / name).shape[0] > 200
    data = json.loads((out / "sweep.json").read_text())
    assert data["alpha"] == 0.25 and data["layers"] == [1]
    assert data["runs"]["1"]["fixed-k1"]["alpha"] == 0.25
    assert set(data["runs"]["0"]["baseline"]["eval"]) == {"openwebtext", "lambada"}
    assert (out / "seed-0" / "learned" / "gate_history.json").is_file()
    csv_lines = (out / "sweep.csv").read_text().splitlines()
    assert len(csv_lines) == 7 and "openwebtext/perplexity" in csv_lines[0]

    # compare re-uses the saved evaluations: nothing is evaluated again.
    stamps = {r: (out / r / "eval.json").stat().st_mtime_ns for r in runs}
    cmp = setup / "cmp"
    assert main(["compare", str(out), "--out", str(cmp), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(
        "| model | n | val loss | lambada ppl | lambada last-word acc (%) | openwebtext ppl |"
    )
    assert "| best fixed cut (k=1, α=0.25) | 2 |" in printed
    assert {r: (out / r / "eval.json").stat().st_mtime_ns for r in runs} == stamps
    for name in ("compare.md", "compare.csv", "compare.json", "run.json"):
        assert (cmp / name).is_file(), name
    assert (cmp / "compare.md").read_text() == printed
    assert json.loads((cmp / "compare.json").read_text())["best_fixed_cut"]["cut_layer"] == 1

    # A seed folder works as input, and a benchmark nobody evaluated yet is evaluated now.
    cmp2 = setup / "cmp2"
    assert (
        main(
            [
                "compare",
                str(out / "seed-1"),
                "--benchmarks",
                "openwebtext",
                "--data-dir",
                str(setup / "data"),
                "--max-eval-tokens",
                "100",
                "--out",
                str(cmp2),
                "--quiet",
            ]
        )
        == 0
    )
    assert "| baseline | 1 |" in (cmp2 / "compare.md").read_text()


def test_sweep_restart_skips_finished(setup, capsys):
    args = sweep_args(setup, "--layers", "0", "--no-learned", "--out", str(setup / "out"))
    assert main(args) == 0
    first = json.loads((setup / "out" / "sweep.json").read_text())
    assert not (setup / "out" / "learned_gate_heatmap.png").exists()
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "sweep [1/2] seed 0 baseline: finished earlier, skipped" in err
    assert "sweep [2/2] seed 0 fixed-k0: finished earlier, skipped" in err
    assert json.loads((setup / "out" / "sweep.json").read_text())["runs"] == first["runs"]


def test_compare_on_fixtures(tmp_path, capsys):
    sweep = write_sweep(tmp_path / "sweep", VAL, EVALS)
    assert main(["compare", str(sweep), "--out", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr().out
    assert "| best fixed cut (k=1, α=0.5) | 2 | **2.600 ± 0.141** |" in printed
    csv_text = (tmp_path / "cmp" / "compare.csv").read_text()
    assert csv_text.splitlines()[0].startswith("row,label,cut_layer,alpha,n,")
    record = json.loads((tmp_path / "cmp" / "run.json").read_text())
    assert record["config"]["inputs"] == [str(sweep)] and record["config"]["runs"] == 10


def assert_refused(tmp_path, capsys, args, *patterns, out_name="out"):
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error:"), err
    for pattern in patterns:
        assert pattern in err, err
    assert not (tmp_path / out_name).exists()


@pytest.mark.parametrize(
    ("extra", "patterns"),
    [
        (["--seeds", "0,x"], ["--seeds: 'x' is not an integer"]),
        (["--seeds", "0.5"], ["--seeds: '0.5' is not an integer"]),
        (["--layers", "0,2"], ["--layers: 2 is outside [0, 2) for 2 layers"]),
        (["--layers", "-1"], ["--layers: -1 is outside [0, 2)"]),
        (["--layers", "one"], ["--layers: 'one' is not an integer"]),
        (["--preset", "huge"], ["unknown preset 'huge'"]),
        (["--n-layr", "3"], ["unknown config key '--n-layr'", "'--n-layer'"]),
        (["--alpha", "0"], ["--alpha 0.0 is outside (0, 1]"]),
        (["--gate", "fixed"], ["--gate is set by the sweep"]),
        (["--seed", "3"], ["--seed is set by the sweep", "--seeds"]),
        (["--benchmarks", "wikitxt-2"], ["unknown benchmark 'wikitxt-2'", "did you mean 'wikitext-2'"]),
        (["--benchmarks", "wikitext-2"], ["benchmark 'wikitext-2' is not available"]),
        (["--benchmarks", "lambada", "--max-eval-tokens", "1"], ["--max-eval-tokens must be >= 2, got 1"]),
        (["--max-eval-tokens", "many"], ["--max-eval-tokens: 'many' is not an integer"]),
        (["--alpha", "half"], ["--alpha: 'half' is not a valid float"]),
    ],
)
def test_bad_sweep_input(setup, capsys, extra, patterns):
    assert_refused(setup, capsys, sweep_args(setup, *extra, "--out", str(setup / "out")), *patterns)


def test_sweep_refuses_missing_corpus(setup, capsys):
    args = ["sweep", "--dataset", str(setup / "nope.txt"), *TINY, "--out", str(setup / "out")]
    assert_refused(setup, capsys, args, "nope.txt")


def test_sweep_out_is_a_file(setup, capsys):
    (setup / "file").write_text("x")
    args = sweep_args(setup, "--out", str(setup / "file"))
    assert main(args) == 2
    assert "is a file" in capsys.readouterr().err


def test_bad_compare_input(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    sweep = write_sweep(tmp_path / "sweep", VAL, EVALS)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("x")
    (tmp_path / "unfinished" / "seed-0" / "baseline").mkdir(parents=True)
    out = ["--out", str(tmp_path / "out")]
    cases = [
        ([str(tmp_path / "missing")], ["'" + str(tmp_path / "missing") + "' does not exist", "sweep"]),
        ([str(tmp_path / "plain")], [str(tmp_path / "plain"), "is not a sweep directory", "sweep.json"]),
        ([str(tmp_path / "plain" / "notes.txt")], ["notes.txt", "is not a sweep directory"]),
        ([str(sweep), str(tmp_path / "plain")], ["'" + str(tmp_path / "plain") + "' is not a sweep"]),
        ([str(tmp_path / "unfinished")], ["no finished runs found", "unfinished"]),
        ([str(sweep), "--benchmarks", "lambda"], ["unknown benchmark 'lambda'", "did you mean 'lambada'"]),
        ([str(sweep), "--max-eval-tokens", "0"], ["--max-eval-tokens must be >= 2, got 0"]),
    ]
    for args, patterns in cases:
        assert_refused(tmp_path, capsys, ["compare", *args, *out], *patterns)


def test_compare_refuses_unavailable_benchmark_for_runs_to_evaluate(setup, capsys):
    assert (
        main(sweep_args(setup, "--layers", "0", "--no-learned", "--out", str(setup / "out"), "--quiet")) == 0
    )
    capsys.readouterr()
    assert_refused(
        setup,
        capsys,
        ["compare", str(setup / "out"), "--benchmarks", "fineweb-edu", "--out", str(setup / "cmp")],
        "benchmark 'fineweb-edu' is not available",
        out_name="cmp",
    )
