"""One reproduction's plan: a scale with the user's choices, checked before anything is written.

`Plan.settings()` is what the stages' fingerprints cover (`resstream.study.fingerprints`);
`Plan.path` is how every stage reaches a file inside the reproduction's directory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resstream.errors import UsageError, check_choice
from resstream.io import check_inside
from resstream.study.scales import SCALES, Scale


@dataclass(frozen=True)
class Plan:
    """One reproduction: a scale with the user's choices (what the fingerprints cover)."""

    scale: Scale
    out: Path
    models: tuple[str, ...]
    seeds: tuple[int, ...]
    data_dir: str | None = None
    device: str = "auto"
    nproc_per_node: int = 1
    quiet: bool = False

    def settings(self) -> dict[str, Any]:
        """Everything a stage may depend on, as plain data (paths and devices excluded)."""
        scale = dataclasses.asdict(self.scale)
        return {**scale, "models": list(self.models), "seeds": list(self.seeds)}

    def path(self, *parts: str) -> Path:
        """A path inside the reproduction's directory, reached without a link (`io.check_inside`:
        a link planted in the directory would take what is read and written there elsewhere)."""
        path = self.out.joinpath(*parts)
        check_inside(self.out, path, None)
        return path


def make_plan(
    scale: str,
    out: str | Path,
    *,
    models: Sequence[str] = (),
    seeds: Sequence[int] = (),
    data_dir: str | None = None,
    device: str = "auto",
    nproc_per_node: int = 1,
    quiet: bool = False,
) -> Plan:
    """Check the choices and build the plan (UsageError, one line, for a bad one)."""
    check_choice("scale", scale, SCALES)
    chosen = SCALES[scale]
    if nproc_per_node < 1:
        raise UsageError(f"`nproc_per_node` must be >= 1, got {nproc_per_node}")
    if any(seed < 0 for seed in seeds):
        raise UsageError(f"`seeds` must be >= 0, got {', '.join(map(str, seeds))}")
    check_models_and_device(models or chosen.models, device)
    return Plan(
        scale=chosen,
        out=Path(out),
        models=tuple(dict.fromkeys(models)) or chosen.models,
        seeds=tuple(dict.fromkeys(seeds)) or chosen.seeds,
        data_dir=data_dir,
        device=device,
        nproc_per_node=nproc_per_node,
        quiet=quiet,
    )


def check_models_and_device(models: Sequence[str], device: str) -> None:
    """Refuse a device or a pretrained model that the stages would refuse, before anything is
    written (`resstream.models.check_model`: path, config, family, tokenizer; no weights read)."""
    from resstream.devices import resolve_device
    from resstream.models.loading import check_model

    resolve_device(device)
    for model in models:
        check_model(model, device=device)


def model_slug(spec: str) -> str:
    """A folder name for a model spec ('google/gemma-2-2b' -> 'google--gemma-2-2b')."""
    text = Path(spec).name if Path(spec).is_dir() else spec
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text.replace("/", "--")) or "model"


def model_dirs(plan: Plan, kind: str) -> list[Path]:
    """The folder of each pretrained model's `kind` output (shift, lens, eval)."""
    return [plan.path(kind, model_slug(model)) for model in plan.models]
