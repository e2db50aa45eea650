"""What every benchmark here measures with: one copy of the timing, memory and machine helpers.

The scripts beside this file import it by name (`from harness import timed`), as they import
each other: a script run as `python benchmarks/bench_x.py` has this folder on its path.

* timing: `sync` (wait for the device), `timed` / `seconds` (wall time of one call, the device
  synchronised on both sides);
* interleaved rounds (absolute times on shared machines are noise; variants measured side by
  side, in an order that rotates every round, so drift in the machine's load falls on all of
  them alike): `rotation`, `rounds_of`, `interleaved`, `medians`, `round_ratios` (each
  round's ratio of two variants, which cancels a change of load between rounds) and
  `median_ratio` (their median);
* memory: `status_kib` (a field of /proc/self/status), `release_free_memory`, `peak_growth`
  (how far the resident set peaks above its level before a call; Linux), `cuda_peak_growth`
  (the same for the CUDA allocator), `fresh_process_peaks` (a script's own memory child, run
  in fresh processes);
* the peers (TransformerLens, nnsight, in a side environment): `load_peer` (the module, or
  why it is unavailable), `transformer_lens_bridge` (TransformerLens around a copy of a model);
* the machine: `cpu_name`, `device_name`, `load_average`, `load_averages`;
* the model most benchmarks time: `random_gpt2` (GPT-2 small's shape, random weights);
* `write_record`: a run's figures as JSON (`--json PATH`).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "cpu_name",
    "cuda_peak_growth",
    "device_name",
    "fresh_process_peaks",
    "interleaved",
    "load_average",
    "load_averages",
    "load_peer",
    "median_ratio",
    "medians",
    "peak_growth",
    "random_gpt2",
    "release_free_memory",
    "rotation",
    "round_ratios",
    "rounds_of",
    "seconds",
    "status_kib",
    "sync",
    "timed",
    "transformer_lens_bridge",
    "write_record",
]

# ---------------------------------------------------------------- timing


def sync(device: str | torch.device) -> None:
    """Wait until `device` has finished its queued work (a no-op off CUDA)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: str | torch.device = "cpu") -> tuple[float, Any]:
    """Seconds of `fn()` (the device synchronised on both sides) and what it returned."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def seconds(fn: Callable[[], Any], device: str | torch.device = "cpu") -> float:
    """Seconds of `fn()`, the device synchronised on both sides."""
    return timed(fn, device)[0]


# ---------------------------------------------------------------- interleaved rounds


def rotation(names: list[str], round_: int) -> list[str]:
    """`names` in the order of round `round_` (0-based): each round starts one name later."""
    shift = round_ % len(names) if names else 0
    return names[shift:] + names[:shift]


def rounds_of(
    measures: dict[str, Callable[[], float]], rounds: int, *, report: str | None = None
) -> dict[str, list[float]]:
    """What each measure returns (seconds it timed itself, usually) in each of `rounds` rounds,
    measures called in rotating order. `report`: a format (".2f") to print each round's line
    in as it ends, `round 1: name 1.23 s, ...`; None prints nothing."""
    names = list(measures)
    values: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in rotation(names, round_):
            values[name].append(measures[name]())
        if report is not None:
            line = ", ".join(f"{name} {values[name][-1]:{report}} s" for name in names)
            print(f"round {round_ + 1}: {line}", flush=True)
    return values


def interleaved(
    variants: dict[str, Callable[[], Any]],
    rounds: int,
    device: str | torch.device = "cpu",
    *,
    warm_ups: dict[str, Callable[[], Any]] | None = None,
    report: str | None = None,
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Seconds of one call of each variant per round, in rotating order, after one warm-up call
    of each (`warm_ups[name]` in its place where given), and what each variant returned last
    (its warm-up where no round ran). `report` as in `rounds_of`."""
    results: dict[str, Any] = {}
    for name, run in variants.items():
        if warm_ups is not None and name in warm_ups:
            warm_ups[name]()
        else:
            results[name] = run()
    sync(device)

    def one_call(name: str) -> float:
        took, results[name] = timed(variants[name], device)
        return took

    measures = {name: partial(one_call, name) for name in variants}
    return rounds_of(measures, rounds, report=report), results


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """The median over rounds of each variant's figures."""
    return {name: statistics.median(values) for name, values in times.items()}


def round_ratios(times: dict[str, list[float]], num: str, den: str) -> list[float]:
    """Each round's time of `num` over that round's time of `den` (both ran within the round,
    so a change of the machine's load between rounds cancels)."""
    return [a / b for a, b in zip(times[num], times[den], strict=True)]


def median_ratio(times: dict[str, list[float]], num: str, den: str) -> float | None:
    """The median over rounds of `round_ratios(times, num, den)`; None where either is missing."""
    if num not in times or den not in times:
        return None
    return statistics.median(round_ratios(times, num, den))


# ---------------------------------------------------------------- memory


def status_kib(field: str) -> int:
    """One field of /proc/self/status (VmRSS, VmHWM, ...), in KiB."""
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no {field} in /proc/self/status")
    return int(match.group(1))


def release_free_memory() -> None:
    """glibc's malloc_trim(0): hand freed heap pages back to the OS (no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_growth(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes the resident set peaked above its level before `fn()` ran, and what it returned.
    Freed heap pages go back to the OS first, so that the level is live memory, not pages
    malloc kept; the peak (VmHWM) is reset to the current RSS (Linux's clear_refs)."""
    gc.collect()
    release_free_memory()
    Path("/proc/self/clear_refs").write_text("5")
    before = status_kib("VmRSS")
    out = fn()
    return (status_kib("VmHWM") - before) * 1024, out


def cuda_peak_growth(fn: Callable[[], Any], device: str | torch.device) -> tuple[int, Any]:
    """Bytes the CUDA allocator's peak rose above what it held before `fn()` ran on `device`,
    and what `fn` returned."""
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - before, out


def fresh_process_peaks(command: list[str], repeats: int = 1) -> tuple[list[int], str | None]:
    """What a benchmark's memory child says, from `repeats` fresh processes of `command` (the
    script with its hidden memory flag): each prints a last JSON line with "extra_bytes" (the
    `peak_growth` of one warmed call), or with "skipped" and the reason. The children run with
    glibc's mmap threshold at 64 KiB (`MALLOC_MMAP_THRESHOLD_`), so that a freed tensor leaves
    the resident set and the peak follows the live tensors. Returns the readings and, where a
    child was skipped or failed, why (the readings stop there)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    values: list[int] = []
    for _ in range(repeats):
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        record = json.loads(lines[-1]) if done.returncode == 0 and lines else {}
        if "skipped" in record:
            return values, f"skipped: {record['skipped']}"
        if "extra_bytes" not in record:
            return values, f"child failed ({done.returncode}): {done.stderr.strip()[-400:]}"
        values.append(int(record["extra_bytes"]))
    return values, None


# ---------------------------------------------------------------- the peers


def load_peer(module: str, package: str) -> tuple[Any, str]:
    """The imported peer module, or None; and its version, or why it is unavailable (a peer
    lives in a side environment; the benchmarks run without it)."""
    try:
        imported = importlib.import_module(module)
    except ImportError as error:
        return None, f"{package} does not import here ({type(error).__name__}: {error})"
    return imported, f"{package} {importlib.metadata.version(package)}"


def transformer_lens_bridge(model: Any) -> Any:
    """TransformerLens's `TransformerBridge` around a deep copy of a `GPT2LMHeadModel`
    (`build_bridge_from_module`: no Hub access), in eval mode. The bridge rewires the module
    tree it wraps and switches it to eager attention, hence the copy. ImportError where
    TransformerLens is not installed (`load_peer` says so first)."""
    from transformer_lens.model_bridge.sources import build_bridge_from_module

    twin = copy.deepcopy(model)
    return build_bridge_from_module(twin, "GPT2LMHeadModel", hf_config=twin.config).eval()


# ---------------------------------------------------------------- the machine


def cpu_name() -> str:
    """The CPU's model name and core count (Linux), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str | torch.device) -> str:
    """The GPU's name for a CUDA device, else the CPU's (`cpu_name`)."""
    return torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else cpu_name()


def load_averages() -> tuple[float, float, float]:
    """The 1-, 5- and 15-minute load averages (zeros where the platform has none)."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return (0.0, 0.0, 0.0)


def load_average() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    return load_averages()[0]


# ---------------------------------------------------------------- the model


def random_gpt2(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, **config: Any) -> Any:
    """A `GPT2LMHeadModel` of GPT-2 small's shape (`GPT2Config`'s defaults: 12 layers, 12
    heads, d_model 768, vocab 50257; `config` overrides them), random weights from seed 0,
    in eval mode on `device` in `dtype`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**config)).eval().to(device=device, dtype=dtype)


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write a run's figures to `path` as indented JSON (its folder made) and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
