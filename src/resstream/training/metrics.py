"""A run's metrics log, `metrics.jsonl`: one JSON record per logged step or evaluation.

The trainer appends records as it trains (`MetricsLog`, rank 0 only); a resumed run first drops
the records written after its checkpoint, so the log reads as if the run had never stopped.
Readers (`read_records`, `iter_metrics`) skip a line cut short by a killed writer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from resstream.io import append_line, strict_json, write_text

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """Appends JSON records to metrics.jsonl (rank 0 only); on resume, drops later records."""

    def __init__(self, path: Path, enabled: bool, resume_step: int | None) -> None:
        self.path, self.enabled = path, enabled
        if enabled and resume_step is not None and path.exists():
            kept = [strict_json(rec) for rec in read_records(path) if rec.get("step", 0) <= resume_step]
            write_text(path, "".join(line + "\n" for line in kept))
        elif enabled and resume_step is None:
            write_text(path, "")

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` as one line (never through a link: `io.append_line`)."""
        if self.enabled:
            append_line(self.path, strict_json(record))


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """JSON records of a .jsonl log, in order; a line cut short by a killed writer is skipped."""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def iter_metrics(run_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of a run's metrics.jsonl, in order."""
    return read_records(Path(run_dir) / METRICS_FILE)
