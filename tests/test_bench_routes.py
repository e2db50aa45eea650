"""The routes benchmarks run end to end in their small modes, and what they print holds.

`benchmarks/bench_routes.py --quick`: every variant timed, the memory probe calibrated and the
importance pass's peak below one layer's (H, T, T, d) terms at a budget smaller than those.
`benchmarks/routes_vs_patching.py` on a few short prompts of the built-in model: one agreement
row per measure and path, every figure in its range; its statistics on hand-built prompts.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def _script(name: str) -> ModuleType:
    """A benchmark script imported as a module (registered, so its dataclasses resolve), with
    the benchmarks folder on the path for the sibling scripts it imports, as when it is run."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _run(script: str, *args: str, tmp_path: Path) -> tuple[str, dict]:
    """Run a benchmark with `--json`; its stdout and the JSON it wrote."""
    out = tmp_path / "figures.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("RESSTREAM_CACHE", str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


@pytest.mark.slow
def test_bench_routes_quick_runs_and_the_importance_pass_stays_below_a_layer(tmp_path):
    budget = 16 * 2**10  # (H, N, T) proximities of 10 of the 32 query positions at a time
    stdout, record = _run("bench_routes.py", "--quick", "--budget", str(budget), tmp_path=tmp_path)
    timing = record["timing"]
    expected = {"forward", "trunk forward", "whole route", "internals", "importances", "edges"}
    assert set(timing["median_seconds"]) == expected
    assert all(len(times) == 1 and times[0] > 0 for times in timing["seconds"].values())
    assert math.isfinite(timing["ratio_whole_to_forward"]) and timing["ratio_whole_to_forward"] > 0
    assert timing["edges"] >= 1  # of the top node's two terms (residual, MLP) one has importance ≥ 1/2
    assert "whole route:" in stdout and "target ≤ 3×" in stdout
    memory = record["memory"]
    if "skipped" in memory:
        pytest.skip(memory["skipped"])
    layers, seq_len = record["layers"], record["seq_len"]
    assert (layers, seq_len) == (2, 32)
    one_layer = memory["one_layer_terms"]
    assert one_layer == 12 * seq_len * seq_len * 768 * 4 and memory["all_layer_terms"] == 2 * one_layer
    rows = memory["rows"]
    assert {(row["layers"], row["budget"]) for row in rows} == {(2, budget), (2, 12 * 32 * 4 * 2)}
    calibration = rows[0]["calibration"]
    assert 0.9 * 256 * 2**20 < calibration < 1.3 * 256 * 2**20  # the probe sees a tensor it made
    for row in rows:
        assert row["block"] <= max(row["budget"], 12 * seq_len * 4)
        assert 0 < row["peak"] < one_layer, row


@pytest.mark.slow
def test_routes_vs_patching_reports_every_measure_against_every_path(tmp_path):
    stdout, record = _run("routes_vs_patching.py", "--num-prompts", "3", "--seq-len", "12", tmp_path=tmp_path)
    assert record["model"] == "reference" and record["num_prompts"] == 3
    rows = record["agreement"]
    assert [(r["effect"], r["path"], r["measure"]) for r in rows] == [
        (effect, path, measure)
        for effect in ("|Δ log p|", "KL")
        for path in ("total", "direct")
        for measure in ("flow", "kept edges", "|C|", "|DLA|")
    ]
    for row in rows:
        assert row["mode"] == "zero" and 0 <= row["prompts"] <= 3
        for key in ("rho", "low", "high", "pooled"):
            assert row[key] is None or -1.0 - 1e-9 <= row[key] <= 1.0 + 1e-9, row
        assert row["overlap"] is None or 0.0 <= row["overlap"] <= 1.0
    flow = rows[0]
    assert flow["prompts"] == 3 and flow["rho"] is not None  # the flow of 24 heads is never constant
    assert "Spearman ρ" in stdout and "pooled ρ" in stdout


EFFECT = ("zero", "total", "KL")


def _prompt(module: ModuleType, measure: list[float], effect: list[float]):
    prompt = module.Prompt("text", "x")
    prompt.measures = {"flow": torch.tensor(measure, dtype=torch.float64)}
    prompt.effects = {("zero", "total", "KL"): torch.tensor(effect, dtype=torch.float64)}
    return prompt


def test_agreement_ranks_magnitudes_and_leaves_constant_measures_out():
    module = _script("routes_vs_patching")
    same = _prompt(module, [0.1, 0.5, 0.2, 0.9], [-0.01, 0.3, -0.1, -2.0])  # |effect| in the same order
    reversed_ = _prompt(module, [0.1, 0.5, 0.2, 0.9], [2.0, -0.1, 0.3, -0.01])  # the opposite order
    constant = _prompt(module, [0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0])
    found = module.agreement([same, same, constant], "flow", EFFECT, k=1)
    assert found.rho == pytest.approx(1.0) and found.prompts == 2 and found.overlap == 1.0
    assert (found.low, found.high) == (pytest.approx(1.0), pytest.approx(1.0))  # no spread
    mixed = module.agreement([same, reversed_], "flow", EFFECT, k=1)
    assert mixed.rho == pytest.approx(0.0) and mixed.overlap == 0.5
    assert math.isnan(mixed.low) or mixed.low < 0 < mixed.high
    alone = module.agreement([constant], "flow", EFFECT, k=2)
    assert alone.prompts == 0 and math.isnan(alone.rho) and math.isnan(alone.overlap)


def test_head_grid_refuses_a_missing_head():
    module = _script("routes_vs_patching")
    grid = module.head_grid([(0, 0, 1.0), (0, 1, 2.0), (1, 0, 3.0), (1, 1, 4.0)], 2, 2)
    assert grid.tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(RuntimeError, match="missing"):
        module.head_grid([(0, 0, 1.0)], 2, 2)


def test_bench_routes_quick_mode_and_the_budget_block():
    module = _script("bench_routes")
    args = module.parse_args(["--quick"])
    assert (args.layers, args.seq_len, args.rounds) == (2, 32, 1)
    assert module.memory_rows(args, 12) == [(2, args.budget), (2, 12 * 32 * 4 * 2)]  # blocks of T/16
    per_query = 12 * 128 * 4  # (H, 1, T) float32 proximities of GPT-2 small at 128 tokens
    assert module.block_bytes(12, 128, 2**18) == (2**18 // per_query) * per_query
    assert module.block_bytes(12, 128, 1) == per_query  # at least one query position
    assert module.block_bytes(12, 128, 2**40) == 128 * per_query  # at most the whole layer
    assert module.vector_bytes(12, 128, 768) == per_query * 768
    assert module.term_bytes(12, 12, 128, 768) == 12 * 128 * 768 * per_query
