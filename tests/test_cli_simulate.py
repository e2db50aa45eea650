"""`resstream simulate` end to end, in-process, and its answers to bad input.

Spec (issue): `simulate` writes simulate.json (`mean_attention[layer][query][key]`,
`stderr[layer][query][key]`; with `--grid`, `{"configurations": [...]}` of four entries, each
with those keys and a `label`), simulate.npz (`labels`, `mean_attention` and `stderr` of shape
(configs, layers, n, n)), simulate.png and run.json, and prints a recency verdict per layer.
Bad input is one line on stderr naming the value and what is allowed, exit code 2, nothing
written to --out; Ctrl-C is exit code 130 and leaves nothing half-written.
"""

from __future__ import annotations

import importlib
import math
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

#: Small, fast runs (2 shared CPU cores): a few hundred simulations of a short, shallow stack.
FAST = ["--quiet", "--sims", "400", "--tokens", "5", "--layers", "2"]

#: No test here may reach the network (the hub fails at once); one torch thread.
pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")
OUTPUTS = ("simulate.json", "simulate.npz", "simulate.png", "run.json")


@pytest.fixture
def no_plots(monkeypatch):
    """Skip rendering simulate.png in tests that only read the numbers."""
    import resstream.reporting.attention as rendering

    monkeypatch.setattr(rendering, "plot_attention_grid", lambda *args, **kwargs: None)


def run_simulate(out: Path, *args: str) -> int:
    return main(["simulate", *FAST, *args, "--out", str(out)])


def check_attention(mean: list, stderr: list, *, layers: int, tokens: int) -> None:
    """(layers, n, n) causal attention: rows are distributions over keys j <= i."""
    assert len(mean) == layers and len(stderr) == layers
    for layer_mean, layer_err in zip(mean, stderr, strict=True):
        assert len(layer_mean) == tokens and all(len(row) == tokens for row in layer_mean)
        assert len(layer_err) == tokens and all(len(row) == tokens for row in layer_err)
        for i, row in enumerate(layer_mean):
            assert abs(sum(row) - 1.0) <= 1e-6, (i, sum(row))
            assert all(value == 0.0 for value in row[i + 1 :]), (i, row)  # causal: no future keys
            assert all(0.0 <= value <= 1.0 + 1e-6 for value in row[: i + 1]), (i, row)
        for i, row in enumerate(layer_err):
            assert all(e is not None and math.isfinite(e) and e >= 0.0 for e in row), (i, row)
            assert all(e == 0.0 for e in row[i + 1 :]), (i, row)
    # the first query has a single key: all of its attention, with no spread
    assert all(layer[0][0] == pytest.approx(1.0, abs=1e-6) for layer in mean)


# --------------------------------------------------------------------------- end to end


def test_single_configuration(tmp_path, capsys):
    out = tmp_path / "a" / "b"  # nested, created on demand
    code = main(
        [
            "simulate",
            "--quiet",
            "--sims",
            "600",
            "--tokens",
            "5",
            "--layers",
            "3",
            "--dim",
            "16",
            "--gamma",
            "0.2",
            "--seed",
            "3",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for name in OUTPUTS:
        assert (out / name).is_file(), name
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)
    assert_complete_files(out)

    report = strict_json(out / "simulate.json")
    assert "configurations" not in report
    assert {"label", "mean_attention", "stderr"} <= set(report)
    check_attention(report["mean_attention"], report["stderr"], layers=3, tokens=5)
    assert "LayerNorm" in report["label"] and "0.2" in report["label"]
    if "config" in report:
        config = report["config"]
        assert (config["layers"], config["tokens"], config["dim"], config["simulations"]) == (3, 5, 16, 600)
        assert config["gamma"] == 0.2 and config["seed"] == 3 and config["layernorm"] is True

    with np.load(out / "simulate.npz") as arrays:  # no pickled objects needed
        assert set(arrays.files) >= {"labels", "mean_attention", "stderr"}
        assert arrays["mean_attention"].shape == (1, 3, 5, 5)
        assert arrays["stderr"].shape == (1, 3, 5, 5)
        assert list(arrays["labels"]) == [report["label"]]
        np.testing.assert_allclose(
            arrays["mean_attention"][0], np.array(report["mean_attention"]), atol=1e-12
        )
        np.testing.assert_allclose(arrays["stderr"][0], np.array(report["stderr"]), atol=1e-12)

    record = strict_json(out / "run.json")
    assert record["config"]["command"] == "simulate" and record["seed"] == 3
    assert record["config"]["layers"] == 3 and record["config"]["gamma"] == 0.2
    assert record["device"] == "cpu" and "versions" in record

    # the trend leads, in the JSON and in the terminal: one entry per layer
    assert list(report)[:2] == ["label", "trend"] and len(report["trend"]) == 3
    for layer, trend in zip(report["layers"], report["trend"], strict=True):
        assert layer["trend"] == trend and trend["samples"] == 600
        assert trend["direction"] in ("recency", "primacy", "none")
        assert trend["spearman"]["low"] <= trend["spearman"]["value"] <= trend["spearman"]["high"]
        assert [band["distances"] for band in trend["bands"]] == [[0, 0], [1, 3], [4, 4]]
    # a trend line per layer, each naming its layer, with the strict verdicts below it
    assert verdict_layers(captured.out) == [1, 2, 3], captured.out
    assert "wrote simulate.json" in captured.out


def test_grid_gives_the_four_standard_configurations(tmp_path, capsys):
    out = tmp_path / "out"
    code = run_simulate(out, "--grid", "--gamma", "0.3")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)
    assert_complete_files(out)

    report = strict_json(out / "simulate.json")
    assert set(report) == {"configurations"}
    configurations = report["configurations"]
    assert len(configurations) == 4
    labels = [entry["label"] for entry in configurations]
    assert len(set(labels)) == 4, labels
    for entry in configurations:
        assert {"label", "mean_attention", "stderr"} <= set(entry)
        check_attention(entry["mean_attention"], entry["stderr"], layers=2, tokens=5)
    no_ln, ln_iso, ln_aniso, ln_residual = labels
    assert "no LayerNorm" in no_ln
    assert all("LayerNorm" in label and "no LayerNorm" not in label for label in labels[1:]), labels
    assert "γ = 0" in ln_iso and "0.3" in ln_aniso and "0.3" in ln_residual, labels
    assert "residual" in ln_residual and not any("residual" in label for label in labels[:3]), labels
    if "config" in configurations[0]:
        flags = [
            (e["config"]["layernorm"], e["config"]["gamma"], e["config"]["residual"]) for e in configurations
        ]
        assert flags == [(False, 0.0, False), (True, 0.0, False), (True, 0.3, False), (True, 0.3, True)]

    with np.load(out / "simulate.npz") as arrays:
        assert arrays["mean_attention"].shape == (4, 2, 5, 5)
        assert arrays["stderr"].shape == (4, 2, 5, 5)
        assert list(arrays["labels"]) == labels
        np.testing.assert_allclose(
            arrays["mean_attention"], np.array([e["mean_attention"] for e in configurations]), atol=1e-12
        )

    assert strict_json(out / "run.json")["config"]["grid"] is True
    # every configuration is named and gets a verdict line for each of its layers
    for label in labels:
        assert label in captured.out, label
    assert verdict_layers(captured.out) == [1, 2] * 4, captured.out


def test_simulations_is_the_flag_and_sims_its_alias(tmp_path, capsys, no_plots):
    import resstream
    from resstream.errors import UsageError

    for flag in ("--simulations", "--sims"):
        out = tmp_path / flag.strip("-")
        assert run_simulate(out, flag, "321") == 0, capsys.readouterr().err
        assert strict_json(out / "simulate.json")["config"]["simulations"] == 321
        assert strict_json(out / "run.json")["config"]["simulations"] == 321
    # the library's name is the flag's: a user who writes sims= is told which name it is
    with pytest.raises(UsageError, match=r"unknown simulation field 'sims' \(did you mean 'simulations'\?\)"):
        resstream.simulate(sims=5, progress=False)
    assert resstream.simulate(simulations=3, tokens=3, layers=1).results[0][1].config.simulations == 3


def test_grid_without_gamma_uses_a_positive_one(tmp_path, capsys, no_plots):
    out = tmp_path / "out"
    assert run_simulate(out, "--grid") == 0, capsys.readouterr().err
    labels = [e["label"] for e in strict_json(out / "simulate.json")["configurations"]]
    assert len(labels) == 4 and "γ = 0" in labels[1]
    # the anisotropic configurations do not silently fall back to γ = 0
    assert all(re.search(r"γ = 0\.\d*[1-9]", label) for label in labels[2:]), labels


def test_same_seed_gives_identical_results(tmp_path, capsys, no_plots):
    texts = []
    for name in ("first", "second"):
        out = tmp_path / name
        assert run_simulate(out, "--seed", "7", "--gamma", "0.4") == 0, capsys.readouterr().err
        texts.append((out / "simulate.json").read_text(encoding="utf-8"))
    assert texts[0] == texts[1]
    # ... and another seed draws other embeddings
    other = tmp_path / "other"
    assert run_simulate(other, "--seed", "8", "--gamma", "0.4") == 0, capsys.readouterr().err
    assert (other / "simulate.json").read_text(encoding="utf-8") != texts[0]


def test_means_do_not_depend_on_the_chunk_size(tmp_path, capsys, no_plots):
    means = []
    for chunk in ("0", "128", "1000"):  # 0: the default (one chunk of all 1000 simulations)
        out = tmp_path / f"chunk{chunk}"
        code = main(
            [
                "simulate",
                "--quiet",
                "--sims",
                "1000",
                "--tokens",
                "6",
                "--layers",
                "3",
                "--chunk-size",
                chunk,
                "--out",
                str(out),
            ]
        )
        assert code == 0, capsys.readouterr().err
        report = strict_json(out / "simulate.json")
        means.append((np.array(report["mean_attention"]), np.array(report["stderr"])))
    (base, base_err), *others = means
    for mean, err in others:
        np.testing.assert_allclose(mean, base, atol=1e-6, rtol=0)
        np.testing.assert_allclose(err, base_err, atol=1e-6, rtol=0)


def test_residual_and_no_layernorm_flags_reach_the_run(tmp_path, capsys, no_plots):
    out = tmp_path / "out"
    code = run_simulate(out, "--no-layernorm", "--residual", "--residual-scale", "0.5", "--sigma", "0.5")
    assert code == 0, capsys.readouterr().err
    report = strict_json(out / "simulate.json")
    check_attention(report["mean_attention"], report["stderr"], layers=2, tokens=5)
    assert "no LayerNorm" in report["label"] and "residual" in report["label"], report["label"]
    config = strict_json(out / "run.json")["config"]
    assert config["layernorm"] is False and config["residual"] is True
    assert config["residual_scale"] == 0.5 and config["sigma"] == 0.5


def test_one_simulation_claims_no_trend(tmp_path, capsys, no_plots):
    """--sims 1 is allowed, but one sample has no standard error: no row can pass a z-test."""
    out = tmp_path / "out"
    assert run_simulate(out, "--sims", "1") == 0, capsys.readouterr().err
    report = strict_json(out / "simulate.json")
    for layer in report["layers"]:
        for direction in ("recency", "primacy"):
            assert not any(row["holds"] for row in layer[direction]["rows"]), (layer["layer"], direction)


# --------------------------------------------------------------------------- bad input


def _bad(
    tmp_path: Path, capsys, args: list[str], *patterns: str | tuple[str, ...], out: Path | None = None
) -> str:
    """Exit code 2, one line on stderr naming the value and what is allowed, nothing written."""
    return expect_usage_error(["simulate", *FAST, *args], out or tmp_path / "out", capsys, *patterns)


@pytest.mark.parametrize(
    ("extra", "patterns"),
    [
        (["--gamma", "1.0"], ["gamma 1.0", "0 <= gamma < 1"]),
        (["--gamma", "-0.1"], ["gamma -0.1", "0 <= gamma < 1"]),
        (["--gamma", "nan"], ["gamma nan", "0 <= gamma < 1"]),
        (["--tokens", "1"], ["tokens 1", ">= 2"]),
        (["--dim", "1"], ["dim 1", ">= 2"]),
        (["--layers", "0"], ["layers 0", ">= 1"]),
        (["--sims", "0"], ["--simulations 0", ">= 1"]),
        (["--simulations", "0"], ["--simulations 0", ">= 1"]),
        (["--sigma", "0"], ["sigma 0", "> 0"]),
        (["--sigma", "-1"], ["sigma -1", "> 0"]),
        (["--residual-scale", "0", "--residual"], [("--residual-scale 0", "residual_scale 0"), "> 0"]),
        (
            ["--residual-scale", "-0.5", "--residual"],
            [("--residual-scale -0.5", "residual_scale -0.5"), "> 0"],
        ),
        (["--threshold", "0"], ["threshold 0", "> 0"]),
        (["--chunk-size", "-3"], [("--chunk-size -3", "chunk_size -3"), ">= 1"]),
        (["--seed", "-1"], ["seed -1"]),
        (["--device", "tpu"], ["'tpu'", "cpu"]),
        (["--device", "nonsense"], ["'nonsense'", "cpu"]),
        (["--dim", "two"], ["--dim", "'two'"]),
    ],
)
def test_bad_options(tmp_path, capsys, extra, patterns):
    err = _bad(tmp_path, capsys, extra, *patterns)
    assert "allowed" in err or "'two'" in err, err


def test_repeated_option_names_the_value_that_was_used(tmp_path, capsys):
    # FAST already holds --layers 2; the later --layers two is the one click parses
    _bad(tmp_path, capsys, ["--layers", "two"], "--layers", "'two'")


def test_unavailable_cuda_device(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    _bad(tmp_path, capsys, ["--device", "cuda"], "'cuda'", "cpu")


def test_bad_value_in_a_grid_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):

    def must_not_run(*args, **kwargs):
        raise AssertionError("a simulation ran although a configuration was bad")

    monkeypatch.setattr(importlib.import_module("resstream.api.simulate"), "run_simulation", must_not_run)
    _bad(tmp_path, capsys, ["--grid", "--gamma", "1.0"], "gamma 1.0", "0 <= gamma < 1")


def test_chunk_that_cannot_fit_in_memory_says_how_much_it_needs(tmp_path, capsys):
    err = _bad(
        tmp_path,
        capsys,
        ["--sims", "100000000", "--chunk-size", "100000000", "--tokens", "1000"],
        ("--chunk-size 100000000", "chunk_size 100000000"),
        "PB",
    )
    need = re.search(r"needs ~([\d.]+) PB", err)
    assert need and float(need.group(1)) > 1, err
    fits = re.search(r"chunk_size <= (\d+)", err)
    assert fits and 0 < int(fits.group(1)) < 100_000_000, err


def test_out_is_an_existing_file(tmp_path, capsys):
    target = tmp_path / "out"
    target.write_text("keep me")
    code = run_simulate(target)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--out" in err and str(target) in err, err
    assert target.read_text() == "keep me"


def test_bad_input_into_an_existing_empty_out_dir_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    _bad(tmp_path, capsys, ["--tokens", "1"], "tokens", out=out)


# --------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_during_the_simulation_writes_nothing(tmp_path, capsys, monkeypatch):

    monkeypatch.setattr(importlib.import_module("resstream.api.simulate"), "run_simulation", interrupt)
    out = tmp_path / "out"
    check_interrupted(run_simulate(out), capsys)
    assert_nothing_written(out)


def test_ctrl_c_in_the_last_grid_configuration_writes_nothing(tmp_path, capsys, monkeypatch):

    real = importlib.import_module("resstream.api.simulate").run_simulation
    calls = []

    def simulate(config, progress=None):
        calls.append(config)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(config, progress=progress)

    monkeypatch.setattr(importlib.import_module("resstream.api.simulate"), "run_simulation", simulate)
    out = tmp_path / "out"
    check_interrupted(run_simulate(out, "--grid"), capsys)
    assert len(calls) == 4
    assert_nothing_written(out)


def test_ctrl_c_while_plotting_writes_nothing(tmp_path, capsys, monkeypatch):
    import resstream.reporting.attention

    monkeypatch.setattr(resstream.reporting.attention, "plot_attention_grid", interrupt)
    out = tmp_path / "out"
    check_interrupted(run_simulate(out), capsys)
    assert_nothing_written(out)  # simulate.json and simulate.npz were staged: gone with the rest


def test_ctrl_c_inside_a_file_write_leaves_nothing(tmp_path, capsys, monkeypatch, no_plots):
    import resstream.io

    real = resstream.io.write_text
    written: list[str] = []

    def write_text(path, text):
        written.append(Path(path).name)
        if len(written) == 2:  # the second text file: half written into its temporary, then Ctrl-C
            with resstream.io.atomic_path(path) as tmp:
                tmp.write_text(text[: len(text) // 2], encoding="utf-8")
                raise KeyboardInterrupt
        real(path, text)

    monkeypatch.setattr(resstream.io, "write_text", write_text)
    out = tmp_path / "out"
    check_interrupted(run_simulate(out), capsys)
    assert len(written) == 2
    assert_nothing_written(out)


@pytest.mark.parametrize(
    ("extra", "patterns"),
    [
        (["--tokens", "1000000000"], ["--tokens 1000000000 needs ~", "allowed: --tokens <= "]),
        (["--layers", "1000000000"], ["--layers 1000000000 needs ~", "allowed: --layers <= "]),
        (
            ["--sims", "1000000000000000"],
            [
                "--simulations 1000000000000000 with --layers 2 and --tokens 5 would take at least ~",
                "--simulations <= ",
            ],
        ),
    ],
)
def test_absurd_sizes_are_refused_up_front_naming_the_option_given(
    tmp_path, capsys, monkeypatch, extra, patterns
):
    def must_not_run(*args, **kwargs):
        raise AssertionError("a simulation ran although it cannot fit or finish")

    monkeypatch.setattr(importlib.import_module("resstream.api.simulate"), "run_simulation", must_not_run)
    err = _bad(tmp_path, capsys, extra, *patterns)
    assert "--chunk-size" not in err, err
