"""What decides whether a finished stage can be reused: its fingerprint covers its settings
(the `Plan.settings()` keys it names), the content of the corpora it reads and the results of
the stages it needs; a stage's result id changes whenever it runs, so everything after a stage
that ran again runs again too."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

from resstream.io import strict_json
from resstream.study.pipeline import Stage
from resstream.study.plan import Plan
from resstream.study.state import State


def digest(obj: Any) -> str:
    """A short content hash of plain data (strict JSON, keys sorted)."""
    return hashlib.sha256(strict_json(obj, sort_keys=True).encode()).hexdigest()[:16]


def stage_fingerprint(stage: Stage, plan: Plan, state: State, corpora: dict[str, str]) -> str:
    """Of the stage's settings, its corpora's content and the results of the stages it needs."""
    settings = plan.settings()
    upstream = {name: state.stages[name].result for name in stage.needs if name in state.stages}
    return digest(
        {
            "stage": stage.name,
            "settings": {key: settings[key] for key in stage.settings},
            "corpora": {name: corpora[name] for name in stage.datasets(plan)},
            "upstream": upstream,
        }
    )


def result_id(fingerprint: str) -> str:
    """A new id for the result of a stage that has just finished a run with `fingerprint`."""
    return digest({"fingerprint": fingerprint, "finished": time.time()})


def corpus_fingerprints(names: Sequence[str], data_dir: str | None) -> dict[str, str]:
    """The content fingerprint of each named corpus; UsageError when one cannot be read."""
    from resstream.data import default_split, stream_corpus

    found = {}
    for name in dict.fromkeys(names):
        stream = stream_corpus(name, split=default_split(name), data_dir=data_dir)
        found[name] = stream.scan()
    return found
