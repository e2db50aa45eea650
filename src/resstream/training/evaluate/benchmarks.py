"""The benchmarks an evaluation can score, and reading their texts.

`BENCHMARKS` names them; `check_benchmarks` and `parse_benchmarks` are the one place a name is
validated (eval, sweep and compare); `load_benchmark_corpus` reads a benchmark's text (from
`data_dir`, env RESSTREAM_DATA or Hugging Face), turning any failure into a one-line UsageError
that names the benchmark; `find_benchmark_data` tries them all without refusing any.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from resstream.errors import UsageError, check_choice, short_reason

if TYPE_CHECKING:
    from resstream.data import Corpus

BENCHMARKS: tuple[str, ...] = ("wikitext-2", "lambada", "openwebtext", "fineweb-edu", "shakespeare")


def check_benchmarks(names: Iterable[str], *, allow_all: bool = False) -> tuple[str, ...]:
    """Benchmark names checked against `BENCHMARKS`: unique, in the given order.

    The one place a benchmark name is validated (eval, sweep and compare). With `allow_all`
    the name 'all' is accepted too and stands for every benchmark.
    """
    allowed = (*BENCHMARKS, "all") if allow_all else BENCHMARKS
    chosen: list[str] = []
    for name in names:
        check_choice("benchmark", name, allowed)
        chosen += BENCHMARKS if name == "all" else (name,)
    return tuple(dict.fromkeys(chosen))


def parse_benchmarks(benchmarks: str | Iterable[str]) -> tuple[str, ...]:
    """Benchmark names from a comma-separated string or a sequence; duplicates dropped."""
    names = benchmarks.split(",") if isinstance(benchmarks, str) else list(benchmarks)
    names = [name.strip() for name in names if name.strip()]
    if not names:
        raise UsageError(f"`benchmarks` is empty; allowed: {', '.join(BENCHMARKS)}")
    return check_benchmarks(names)


def check_data_dir(data_dir: str | os.PathLike[str] | None) -> None:
    """A local data directory, when one is given, must be a directory."""
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UsageError(f"`data_dir` {str(data_dir)!r} is not a directory")


def load_benchmark_corpus(name: str, data_dir: str | os.PathLike[str] | None) -> Corpus:
    """The benchmark's corpus; any failure to get it is a UsageError naming the benchmark."""
    from resstream.data import default_split, load_corpus

    try:
        return load_corpus(name, split=default_split(name), data_dir=data_dir)
    except UsageError as exc:
        message = str(exc).splitlines()[0] if str(exc) else "unavailable"
        raise UsageError(f"benchmark {name!r} is not available: {message}") from None
    except (OSError, ValueError, ConnectionError, RuntimeError) as exc:
        raise UsageError(
            f"benchmark {name!r} is not available (give `data_dir` or go online): "
            f"{type(exc).__name__}: {short_reason(exc)}"
        ) from None


def check_benchmark_data(names: Iterable[str], data_dir: str | os.PathLike[str] | None) -> None:
    """Refuse, before any work, benchmarks whose text cannot be loaded (UsageError naming it)."""
    check_data_dir(data_dir)
    for name in names:
        load_benchmark_corpus(name, data_dir)


@dataclass(frozen=True)
class BenchmarkData:
    """Which benchmarks' texts can be read here: the fingerprint of each readable one, and
    why each other one cannot be read (the one-line message of `load_benchmark_corpus`)."""

    fingerprints: dict[str, str]
    unavailable: dict[str, str]


def find_benchmark_data(names: Iterable[str], data_dir: str | os.PathLike[str] | None) -> BenchmarkData:
    """Try to read every benchmark of `names`; nothing is refused (see `check_benchmark_data`)."""
    check_data_dir(data_dir)
    fingerprints, unavailable = {}, {}
    for name in names:
        try:
            fingerprints[name] = load_benchmark_corpus(name, data_dir).fingerprint
        except UsageError as exc:
            unavailable[name] = str(exc)
    return BenchmarkData(fingerprints, unavailable)
