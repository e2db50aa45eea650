"""`resstream sweep` and `resstream compare` end to end, in-process, and their answers to bad input."""

from __future__ import annotations

import json

import matplotlib.image
import pytest

from resstream.cli.main import main
from resstream.reporting.notebook import frame_csv
from resstream.reporting.tables import COMPARE_COLUMNS, SWEEP_COLUMNS
from resstream.training.records import load_sweep
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


@pytest.mark.slow
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
    for run in runs:  # each run has the figures `train` writes: a loss curve, a gate for gated runs
        pngs = sorted(p.name for p in (out / run).glob("*.png"))
        assert pngs == (["gate.png", "loss_curve.png"] if run.endswith("learned") else ["loss_curve.png"]), (
            run
        )
    csv_lines = (out / "sweep.csv").read_text().splitlines()  # per run: val loss, 3 + 4 scores
    assert csv_lines[0] == ",".join(SWEEP_COLUMNS) and len(csv_lines) == 1 + 6 * (1 + 3 + 4)
    assert "0,baseline,none,,,openwebtext,perplexity," in (out / "sweep.csv").read_text()
    assert (out / "sweep.csv").read_text() == frame_csv(load_sweep(out).to_pandas())
    assert json.loads(json.dumps(load_sweep(out).to_dict())) == data  # the result read back

    # With no data folder, compare compares what it can read here (the built-in shakespeare),
    # says which benchmarks it skipped and why, and evaluates with the sweep's --max-eval-tokens.
    before = {r: entries(out / r) for r in runs}
    cmp = setup / "cmp"
    assert main(["compare", str(out), "--out", str(cmp), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("| model | n | val loss | shakespeare ppl |\n"), captured.out
    err = captured.err.splitlines()
    assert err[0] == (
        "compare: skipped wikitext-2, lambada, openwebtext, fineweb-edu: no data directory is set "
        "(give --data-dir or set RESSTREAM_DATA) and Hugging Face could not be reached; "
        "comparing validation loss and shakespeare"
    ), err
    assert err[1:] == [SWEEPS_CAP, "compare: evaluated now: shakespeare (6 runs: not evaluated before)"], err
    for r in runs:
        after = entries(out / r)
        assert after["shakespeare"]["max_tokens"] == 150 and after["shakespeare"]["num_tokens"] == 149
        assert {k: after[k] for k in ("lambada", "openwebtext")} == before[r]  # kept as they were
    for name in ("compare.md", "compare.csv", "compare.json", "compare.png", "run.json"):
        assert (cmp / name).is_file(), name
    assert (cmp / "compare.md").read_text() == captured.out
    saved = json.loads((cmp / "compare.json").read_text())
    assert saved["best_fixed_cut"]["cut_layer"] == 1 and saved["max_eval_tokens"] == 150
    assert saved["max_eval_tokens_from"] == "sweep"
    assert set(saved["skipped"]) == {"wikitext-2", "lambada", "openwebtext", "fineweb-edu"}

    # Named benchmarks whose scores are cached for these weights and token cap are reused,
    # even without their data (which compare then cannot compare, and says so).
    stamps = {r: (out / r / "eval.json").stat().st_mtime_ns for r in runs}
    cmp1 = setup / "cmp1"
    assert (
        main(["compare", str(out), "--benchmarks", "openwebtext,lambada", "--out", str(cmp1), "--quiet"]) == 0
    )
    captured = capsys.readouterr()
    assert captured.out.startswith(
        "| model | n | val loss | openwebtext ppl | lambada ppl | lambada last-word acc (%) |"
    )
    assert "| best fixed cut (k=1, α=0.25) | 2 |" in captured.out
    assert captured.err.splitlines() == [
        SWEEPS_CAP,
        "compare: reused cached scores from the runs' eval.json: openwebtext (6 runs), lambada (6 runs); "
        "same max_tokens (150), same weights and same benchmark data "
        "(data of openwebtext, lambada not readable here: not compared)",
    ]
    assert {r: (out / r / "eval.json").stat().st_mtime_ns for r in runs} == stamps

    # Another token cap: the cached score no longer answers, it is evaluated again (never the
    # old figure under a new label), and the entry says which cap it was made with.
    cmp2 = setup / "cmp2"
    args = ["--data-dir", str(setup / "data"), "--quiet"]
    assert main(["compare", str(out), "--benchmarks", "openwebtext", "--max-eval-tokens", "100",
                 "--out", str(cmp2), *args]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "compare: evaluated now: openwebtext (6 runs: cached with max_tokens 150)" in err, err
    for r in runs:
        after = entries(out / r)
        assert after["openwebtext"]["max_tokens"] == 100 and after["openwebtext"]["num_tokens"] == 99
        assert after["lambada"] == before[r]["lambada"]
    row = json.loads((cmp2 / "compare.json").read_text())["rows"][0]["cells"]["openwebtext/perplexity"]
    baselines = [entries(out / f"seed-{s}/baseline")["openwebtext"]["perplexity"] for s in (0, 1)]
    assert row["values"] == baselines

    # The default benchmarks do not follow the earlier calls: every benchmark readable with
    # this data folder, at the sweep's own cap (150), reusing only what matches.
    cmp3 = setup / "cmp3"
    assert main(["compare", str(out), "--out", str(cmp3), *args]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("compare: skipped wikitext-2, fineweb-edu: they are not in the data directory")
    assert err[1] == SWEEPS_CAP
    assert err[2] == (
        "compare: reused cached scores from the runs' eval.json: lambada (6 runs), shakespeare (6 runs); "
        "same max_tokens (150), same weights and same benchmark data"
    )
    assert err[3] == "compare: evaluated now: openwebtext (6 runs: cached with max_tokens 100)"

    # New weights (the run trained on): its cached scores are of the old weights.
    baseline = out / "seed-0" / "baseline"
    assert main(["train", "--resume", "--out", str(baseline), "--max-steps", "4", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["compare", str(out), "--benchmarks", "lambada", "--out", str(setup / "cmp4"), *args]) == 0
    err = capsys.readouterr().err
    assert "compare: evaluated now: lambada (1 run: cached for other weights)" in err, err

    # A seed folder works as input, and a benchmark nobody evaluated yet is evaluated now.
    cmp5 = setup / "cmp5"
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
                "120",
                "--out",
                str(cmp5),
                "--quiet",
            ]
        )
        == 0
    )
    assert "| baseline | 1 |" in (cmp5 / "compare.md").read_text()


#: compare's note when it takes the sweep's own --max-eval-tokens (150 in `test_sweep_then_compare`).
SWEEPS_CAP = (
    "compare: at most 150 tokens per benchmark, the sweeps' own (their run.json), "
    "so their cached scores are reused"
)


def entries(run_dir):
    """A run's eval.json entries by benchmark name."""
    return {e["name"]: e for e in json.loads((run_dir / "eval.json").read_text())["benchmarks"]}


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
    assert csv_text.splitlines()[0] == ",".join(COMPARE_COLUMNS)
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
        (["--benchmarks", "lambada", "--max-eval-tokens", "1"], ["--max-eval-tokens must be >= 2", "got 1"]),
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
        ([str(sweep), "--max-eval-tokens", "0"], ["--max-eval-tokens must be >= 2", "got 0"]),
        ([str(sweep), "--max-eval-tokens", "many"], ["--max-eval-tokens: 'many' is not an integer or 'all'"]),
    ]
    for args, patterns in cases:
        assert_refused(tmp_path, capsys, ["compare", *args, *out], *patterns)


def test_compare_asks_for_a_cap_when_the_sweeps_were_evaluated_with_different_ones(tmp_path, capsys):
    sweeps = [write_sweep(tmp_path / name, VAL, EVALS) for name in ("a", "b")]
    for sweep, cap in zip(sweeps, (150, 20000), strict=True):
        (sweep / "run.json").write_text(json.dumps({"config": {"max_eval_tokens": cap}}))
    assert_refused(
        tmp_path,
        capsys,
        ["compare", *map(str, sweeps), "--out", str(tmp_path / "out")],
        "the sweeps were evaluated with different --max-eval-tokens (150, 20000); give --max-eval-tokens",
    )
    assert (
        main(["compare", *map(str, sweeps), "--max-eval-tokens", "150", "--out", str(tmp_path / "out")]) == 0
    )


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
