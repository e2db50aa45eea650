"""The record that lets a reproduction resume: ``DIR/reproduce.json``, rewritten atomically
after every step, with each stage's fingerprint, status, finished steps and result id."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resstream.errors import UsageError
from resstream.io import write_json

FORMAT = "resstream-reproduce/1"
STATE_FILE = "reproduce.json"


@dataclass
class StageRecord:
    """What reproduce.json keeps of one stage."""

    fingerprint: str
    status: str = "running"  # running | done
    steps_done: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    result: str | None = None  # changes whenever the stage finishes a run
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data for reproduce.json."""
        return dataclasses.asdict(self)


@dataclass
class State:
    """reproduce.json: the scale and every stage's record."""

    scale: str
    stages: dict[str, StageRecord] = field(default_factory=dict)

    def save(self, out: Path) -> None:
        """Rewrite reproduce.json atomically."""
        stages = {name: record.to_dict() for name, record in self.stages.items()}
        write_json(out / STATE_FILE, {"format": FORMAT, "scale": self.scale, "stages": stages})


def load_state(out: Path, scale: str) -> State:
    """The record in `out` (a fresh one when there is none); UsageError for another scale's."""
    path = out / STATE_FILE
    if not path.exists():
        return State(scale)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            raise ValueError("not a resstream reproduction record")
        stages = {name: StageRecord(**record) for name, record in data["stages"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"{str(path)!r} is not a readable reproduction record ({exc}); use another `out`"
        ) from None
    if data["scale"] != scale:
        raise UsageError(
            f"`out` {str(out)!r} holds a {data['scale']}-scale reproduction, not {scale}; use another `out`"
        )
    return State(scale, stages)
