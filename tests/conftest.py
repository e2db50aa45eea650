"""Shared pytest fixtures.

`shared_data`: the offline data copies in ``../shared/data`` beside the repository (or
``$RESSTREAM_DATA``); tests that use it are skipped, not failed, when it is absent.
`hf_offline`: Hugging Face offline mode, so that fallbacks fail at once.
`no_data_dir`: no ``RESSTREAM_DATA`` in the environment.
`default_signal_handlers`: Python's own SIGINT handler, and no remembered interrupt, around a
test that sends itself signals.

The suite runs in one worker process per core (pytest-xdist, `-n auto` in pyproject.toml's
addopts; at most `MAX_WORKERS`), files kept whole so that module fixtures are built once; each
worker takes its share of the cores as torch threads (one each on two cores), since two
processes of two threads on two cores stall each other's small forward passes. `-n 0` runs
the suite in this one process with OMP_NUM_THREADS threads: the way to check it passes with
1 and with 2 BLAS threads.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from resstream.resources import usable_cpus

#: The most worker processes `-n auto` starts: each imports torch and builds its own session
#: fixtures, which stops paying beyond a few.
MAX_WORKERS = 8


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core this process may use, at most `MAX_WORKERS`."""
    return max(1, min(MAX_WORKERS, usable_cpus()))


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker: its share of the cores as torch's intra-op threads."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        torch.set_num_threads(max(1, usable_cpus() // int(workers)))


def shared_data_path() -> Path:
    """``$RESSTREAM_DATA`` if set, else ``shared/data`` beside the repository root."""
    env = os.environ.get("RESSTREAM_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path of the offline data directory; skips the test when it is absent."""
    path = shared_data_path()
    if not path.is_dir():
        pytest.skip(f"offline data directory {path} is absent")
    return path


@pytest.fixture
def hf_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hugging Face offline mode: hub look-ups fail fast instead of retrying."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture
def no_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """No data directory from the environment."""
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)


@pytest.fixture(scope="session")
def gpt2_tokenizer(shared_data: Path):
    """The GPT-2 BPE built from the offline copy of its files; skips when they are absent."""
    from resstream.data import load_tokenizer

    return load_tokenizer("gpt2", data_dir=shared_data)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module: on a small shared machine two threads
    oversubscribe the cores and a tiny forward pass stalls (observed ~0.5 s instead of ~5 ms);
    results do not change."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def default_signal_handlers():
    """Python's default SIGINT handler during the test, nothing remembered before or after
    (`resstream.interrupts`); the SIGINT and SIGTERM handlers found are put back after it."""
    from resstream import interrupts

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupts.reset()
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    interrupts.reset()
