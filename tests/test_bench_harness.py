"""benchmarks/harness.py, the one copy of the benchmarks' timing, memory and machine helpers: no
script keeps a copy of its own, and the helpers do what the scripts rely on (warm-ups, the
rotating order, per-round ratios, a peak reading that sees an allocation)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

#: Helpers that once stood in several scripts (`sync` in four, a `timed` in six, ...).
SHARED = {
    "sync",
    "timed",
    "seconds",
    "interleaved",
    "interleaved_medians",
    "rounds_of",
    "round_ratio",
    "per_round_ratios",
    "median",
    "medians",
    "load_average",
    "cpu_name",
    "device_name",
    "status_kib",
    "release_free_memory",
    "peak_growth",
    "peak_mb",
    "gpt2_small",
    "gpt2_model",
    "random_gpt2",
    "write_record",
    "load_peer",
    "median_ratio",
    "fresh_process_peaks",
    "transformer_lens_bridge",
}


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    """benchmarks/harness.py imported as the scripts import it (the folder on the path)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("harness", BENCHMARKS / "harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def scripts() -> dict[str, ast.Module]:
    """Every script beside the harness, parsed (not run)."""
    paths = sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "harness.py")
    return {p.name: ast.parse(p.read_text(encoding="utf-8")) for p in paths}


def test_no_script_keeps_its_own_copy_of_a_shared_helper(scripts):
    assert len(scripts) >= 15
    defined = {
        name: {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} for name, tree in scripts.items()
    }
    assert {name: sorted(found & SHARED) for name, found in defined.items() if found & SHARED} == {}


def test_every_script_that_times_imports_the_harness(scripts):
    for name, tree in scripts.items():
        if not name.startswith("bench_") or name == "bench_revisions.py":  # it times other revisions
            continue
        imported = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
        assert "harness" in imported, name


def test_interleaved_warms_up_then_rotates_and_keeps_the_last_results(harness):
    calls: list[str] = []

    def variant(name: str):
        def run() -> str:
            calls.append(name)
            return f"{name}{len(calls)}"

        return run

    variants = {name: variant(name) for name in "abc"}
    warm = {"b": lambda: calls.append("b-warm")}
    times, results = harness.interleaved(variants, 3, "cpu", warm_ups=warm)
    assert calls == ["a", "b-warm", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {name: len(values) for name, values in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(value >= 0 for values in times.values() for value in values)
    assert results == {"a": "a11", "b": "b12", "c": "c10"}
    _, warmed = harness.interleaved({"a": lambda: 7}, 0)
    assert warmed == {"a": 7}  # no round: the warm-up's result


def test_rounds_of_reports_each_round_and_ratios_pair_rounds(harness, capsys):
    figures = iter([1.0, 4.0, 2.0, 3.0])  # round 1: a then b; round 2: b then a
    times = harness.rounds_of({"a": lambda: next(figures), "b": lambda: next(figures)}, 2, report=".1f")
    assert times == {"a": [1.0, 3.0], "b": [4.0, 2.0]}
    assert capsys.readouterr().out.splitlines() == ["round 1: a 1.0 s, b 4.0 s", "round 2: a 3.0 s, b 2.0 s"]
    assert harness.round_ratios(times, "a", "b") == [0.25, 1.5]
    assert harness.medians(times) == {"a": 2.0, "b": 3.0}
    assert harness.rotation([], 3) == []


def test_timed_returns_the_result_and_the_machine_helpers_answer(harness):
    took, value = harness.timed(lambda: 41 + 1)
    assert value == 42 and took >= 0 and harness.seconds(lambda: None) >= 0
    assert isinstance(harness.cpu_name(), str) and harness.cpu_name()
    assert harness.device_name("cpu") == harness.cpu_name()
    assert len(harness.load_averages()) == 3 and harness.load_average() >= 0


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's clear_refs")
def test_peak_growth_sees_an_allocation_made_and_freed_inside(harness, monkeypatch):
    monkeypatch.setattr(harness.gc, "collect", lambda: 0)  # a full collection here takes ~0.5 s
    size = 32 * 2**20
    grown, total = harness.peak_growth(lambda: float(torch.ones(size // 4).sum()))
    assert total == size // 4
    assert grown >= size // 2  # the tensor's pages, touched then freed, raised the peak
    assert harness.status_kib("VmRSS") > 0


def test_write_record_makes_its_folder(harness, tmp_path, capsys):
    path = tmp_path / "deep" / "figures.json"
    harness.write_record(path, {"ratio": 1.5})
    assert path.read_text() == '{\n  "ratio": 1.5\n}\n' and f"wrote {path}" in capsys.readouterr().out
