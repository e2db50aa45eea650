"""resources: memory available to this process, CPUs, and the one-line refusals of what exceeds them."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from resstream import resources
from resstream.errors import UsageError
from resstream.resources import (
    MAX_RUN_SECONDS,
    cgroup_headroom_bytes,
    check_duration,
    check_fits,
    check_threads,
    format_bytes,
    format_duration,
)


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1500, "1.5 KB"),
        (12.3e9, "12.3 GB"),
        (48e12, "48.0 TB"),
        (3e30, "3e+06 YB"),
    ],
)
def test_format_bytes(count, text):
    assert format_bytes(count) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.2, "200 ms"),
        (1e-4, "0.1 ms"),
        (40, "40 s"),
        (90, "1.5 min"),
        (3.5 * 3600, "3.5 h"),
        (86400 * 2.1, "2.1 days"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_duration_of_absurd_runs_stays_short():
    assert format_duration(1e16) == "3.2e+08 years"


def _cgroup_v2(root: Path, path: str, limit: str, current: int, inactive: int) -> None:
    directory = root / path.lstrip("/")
    directory.mkdir(parents=True)
    (directory / "memory.max").write_text(limit + "\n")
    (directory / "memory.current").write_text(f"{current}\n")
    (directory / "memory.stat").write_text(f"anon 5\ninactive_file {inactive}\nactive_file 7\n")


def test_cgroup_v2_limit_minus_unreclaimable_usage(tmp_path):
    _cgroup_v2(tmp_path, "/job", "8000000000", current=3_000_000_000, inactive=1_000_000_000)
    assert cgroup_headroom_bytes(tmp_path, "0::/job\n") == 6_000_000_000


def test_cgroup_v2_without_limit_and_without_cgroup(tmp_path):
    _cgroup_v2(tmp_path, "/job", "max", current=3_000_000_000, inactive=0)
    assert cgroup_headroom_bytes(tmp_path, "0::/job\n") is None
    assert cgroup_headroom_bytes(tmp_path / "none", "0::/job\n") is None


def test_cgroup_v1_memory_controller_at_the_mount(tmp_path):
    """Inside a container the v1 mount is the container's own cgroup, whatever its path says."""
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / "memory.limit_in_bytes").write_text("4000000000\n")
    (memory / "memory.usage_in_bytes").write_text("1000000000\n")
    membership = "5:devices:/\n4:memory:/process_api/abc\n0::/\n"
    assert cgroup_headroom_bytes(tmp_path, membership) == 3_000_000_000
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_headroom_bytes(tmp_path, membership) is None


def test_available_memory_is_positive_and_at_most_the_machine():
    available = resources.host_available_bytes()
    physical = resources.physical_memory_bytes()
    assert available > 0 and (physical is None or available <= physical)


def test_available_memory_respects_the_address_space_limit():
    """A process under RLIMIT_AS sees at most that limit (minus what it has mapped)."""
    limit = 3_000_000_000

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    code = "from resstream.resources import host_available_bytes; print(host_available_bytes())"
    done = subprocess.run(
        [sys.executable, "-c", code], preexec_fn=cap, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert 0 < int(done.stdout) < limit


def test_cuda_memory_is_the_devices_free_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (5_000_000_000, 80_000_000_000))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resources.available_bytes("cuda:1") == 5_000_000_000
    with pytest.raises(
        UsageError, match=r"^`d_model` 9 needs ~6.0 GB for the weights; 5.0 GB available on cuda:1$"
    ):
        check_fits("`d_model` 9", 6e9, "cuda:1", purpose="for the weights")


def test_check_fits_names_value_need_and_what_is_available(monkeypatch):
    monkeypatch.setattr(resources, "host_available_bytes", lambda: 12_300_000_000)
    check_fits("`n_layer` 4", 12e9, purpose="for the weights")
    expected = r"^`n_layer` 1000000000 needs ~48.0 TB for the weights; 12.3 GB available on this machine$"
    with pytest.raises(UsageError, match=expected):
        check_fits("`n_layer` 1000000000", 48e12, purpose="for the weights")


def test_check_duration_refuses_beyond_the_bound_only():
    check_duration("`max_steps` 5", MAX_RUN_SECONDS, basis="at most 1 step/s")
    with pytest.raises(UsageError) as info:
        check_duration("`max_steps` 5", 1e16, basis="at most 1 step/s", allowed="`max_steps` <= 3")
    assert str(info.value) == (
        "`max_steps` 5 would take at least ~3.2e+08 years (at most 1 step/s); "
        "allowed: `max_steps` <= 3, runs estimated under 1.0 years"
    )
    with pytest.raises(UsageError):
        check_duration("`x` 1", float("inf"), basis="b")


def test_threads_beyond_a_few_per_cpu_are_refused(monkeypatch):
    monkeypatch.setattr(resources, "usable_cpus", lambda: 2)
    check_threads("threads", 0)
    check_threads("threads", 8)
    with pytest.raises(
        UsageError, match=r"^`threads` 9 is more than 4 per CPU: .* 2 CPU\(s\); allowed: 0 .* to 8$"
    ):
        check_threads("threads", 9)


# ------------------------------------------ refusals that must come without allocating
#: Rows of the hostile-input table whose value would allocate terabytes or build 10⁹ modules:
#: run again in a process whose address space is capped, so that a refusal that comes too
#: late fails the test (MemoryError, an abort) instead of taking the machine down.
ALLOCATING = (
    "train-n-layer-1e9",
    "train-d-model-1e9",
    "train-block-size-1e12",
    "train-bpe-vocab-size-1e9",
    "sweep-n-layer-1e9",
    "simulate-layers-1e9",
    "simulate-tokens-1e9",
    "shift-model-json-n-layer-1e9",
    "eval-model-json-n-layer-1e9",
    "shift-config-json-n-layer-1e9",
    "shift-config-json-vocab-size-1e12",
    "shift-config-json-n-positions-1e12",
    "shift-config-json-n-embd-1e9",
)
#: The cap: the interpreter with torch and transformers maps ~1 GB.
ADDRESS_SPACE_LIMIT = 4_000_000_000


#: One row per command in the default suite, the rest in the slow one. Each set runs in one
#: child process under the cap (`_refusals_under_the_cap`): a process importing torch is ~3 s
#: on two cores, most of what a case costs.
ALLOCATING_BY_DEFAULT = (
    "train-n-layer-1e9",
    "sweep-n-layer-1e9",
    "simulate-tokens-1e9",
    "shift-config-json-vocab-size-1e12",
    "eval-model-json-n-layer-1e9",
)
ALLOCATING_CASES = [
    name if name in ALLOCATING_BY_DEFAULT else pytest.param(name, marks=pytest.mark.slow)
    for name in ALLOCATING
]

#: The child: each command of argv[1] (a JSON list of argument lists) run in this process as
#: `resstream` runs it, its exit code and what it wrote on stderr printed as JSON.
REFUSING_CHILD = r"""
import contextlib, io, json, sys

from resstream.cli.main import main

outcomes = []
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(args)
    outcomes.append({"code": code, "stderr": err.getvalue()})
print(json.dumps(outcomes))
"""


def _refusals_under_the_cap(names: Sequence[str], root: Path) -> dict[str, dict]:
    """Each case of `names` (`BUDGET_CASES`) run, one after another, by one child process
    whose address space is capped at `ADDRESS_SPACE_LIMIT`; name -> its exit code, stderr and
    folder."""
    from tests.test_hostile_inputs import BUDGET_CASES, fill
    from tests.test_train import corpus_text

    commands, folders = [], {}
    for name in names:
        case = next(case for case in BUDGET_CASES if case.name == name)
        folders[name] = folder = root / name
        folder.mkdir()
        (folder / "corpus.txt").write_text(corpus_text(), encoding="utf-8")
        if case.setup is not None:
            case.setup(folder)
        commands.append(fill(case.command, folder))

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))

    # The cap is for what the commands allocate, not for the libraries' start-up: OpenBLAS's
    # per-thread buffers on a many-core machine alone can exceed it.
    quiet_start = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", REFUSING_CHILD, json.dumps(commands)],
        preexec_fn=cap,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **quiet_start},
    )
    assert done.returncode == 0, done.stderr[-2000:]  # a case that exhausted the cap, say
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: {**outcome, "folder": folders[name]} for name, outcome in zip(names, outcomes, strict=True)}


@pytest.fixture(scope="module")
def default_refusals(tmp_path_factory) -> dict[str, dict]:
    return _refusals_under_the_cap(ALLOCATING_BY_DEFAULT, tmp_path_factory.mktemp("refusals"))


@pytest.fixture(scope="module")
def slow_refusals(tmp_path_factory) -> dict[str, dict]:
    names = [name for name in ALLOCATING if name not in ALLOCATING_BY_DEFAULT]
    return _refusals_under_the_cap(names, tmp_path_factory.mktemp("refusals"))


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the CUDA driver cannot initialise under a 4 GB address-space cap (it warns on stderr)",
)
@pytest.mark.parametrize("name", ALLOCATING_CASES)
def test_absurd_sizes_are_refused_under_a_memory_limit(name, request):
    from tests.test_hostile_inputs import BUDGET_CASES

    case = next(case for case in BUDGET_CASES if case.name == name)
    group = "default_refusals" if name in ALLOCATING_BY_DEFAULT else "slow_refusals"
    done = request.getfixturevalue(group)[name]
    assert done["code"] == 2, done["stderr"][-2000:]
    err = done["stderr"]
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error:"), err
    assert all(pattern in err for pattern in case.patterns), err
    assert not (done["folder"] / "out").exists()
