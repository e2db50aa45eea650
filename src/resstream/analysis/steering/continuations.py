"""What `resstream.generate` returns: each prompt's continuation under the edits and without.

`GenerationResult.to_pandas()` has one row per prompt: prompt, steered (the continuation
under the edits), unsteered (without; empty when not asked), their token ids, and the number
of new tokens before an end-of-text token. `to_dict()` is generations.jsonl's rows with the
settings (the edits as records, the sampling rule, the model).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from resstream.display import Displayable
from resstream.reprs import summary


@dataclass(frozen=True)
class Continuation:
    """One prompt's generation: its text and token ids, and the continuation's text and ids
    under the edits (`steered`) and without them (`unsteered`; None when not asked)."""

    prompt: str
    prompt_ids: tuple[int, ...]
    steered: str
    steered_ids: tuple[int, ...]
    unsteered: str | None = None
    unsteered_ids: tuple[int, ...] | None = None

    @property
    def changed(self) -> bool | None:
        """Whether the edits changed the continuation's tokens (None: no unsteered one)."""
        return None if self.unsteered_ids is None else self.steered_ids != self.unsteered_ids


@dataclass(frozen=True)
class GenerationResult(Displayable, renderer="resstream.reporting.generation"):
    """Every prompt's `Continuation`, with the `edits` (records: operation, site, positions,
    values), the `sampling` rule and `where` the edits acted (prompt, new or all positions)."""

    model: str
    continuations: tuple[Continuation, ...]
    edits: tuple[dict[str, Any], ...]
    sampling: dict[str, Any]
    where: str
    settings: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        changed = sum(bool(c.changed) for c in self.continuations)
        compared = sum(c.changed is not None for c in self.continuations)
        edits = ", ".join(e["label"] for e in self.edits) or "no edits"
        return summary(
            self,
            f"model={self.model!r}",
            f"{len(self.continuations)} prompt{'s' * (len(self.continuations) != 1)}",
            edits,
            f"changed {changed}/{compared}" if compared else "",
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: settings, then one record per prompt."""
        return {
            "model": self.model,
            "edits": list(self.edits),
            "sampling": self.sampling,
            "where": self.where,
            "generations": [asdict(c) | {"changed": c.changed} for c in self.continuations],
        }


__all__ = ["Continuation", "GenerationResult"]
