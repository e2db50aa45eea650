"""The misalignment stage: `shift` of each seed's trained models on held-out text, then the
per-variant table of their final-layer metrics (`resstream.reporting.misalignment`) in
misalignment.json / .csv / .md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resstream.errors import RunError, UsageError
from resstream.io import write_json
from resstream.study.argv import common_flags, data_flags
from resstream.study.pipeline import OUT, Step
from resstream.study.plan import Plan

if TYPE_CHECKING:
    from resstream.reporting.misalignment import TaggedShift
    from resstream.training.records import RunRecord


def misalignment_steps(plan: Plan) -> list[Step]:
    """`shift` of each seed's trained models on held-out text, then the per-variant table."""
    from resstream.training.records import find_runs

    s = plan.scale
    sweep = plan.path("sweep")
    runs = find_runs(sweep)
    steps = []
    for seed in plan.seeds:
        mine = [run for run in runs if run.seed == seed]
        if not mine:
            raise UsageError(f"seed {seed} has no finished runs in {str(sweep)!r}; run the sweep stage first")
        where = [f"{OUT}/sweep/{_folder(run).relative_to(sweep).as_posix()}" for run in mine]
        models = [arg for path in where for arg in ("--model", path)]
        argv = ("shift", *models, "--dataset", s.heldout_dataset, "--num-seqs", str(s.heldout_seqs))
        argv += ("--seq-len", str(s.heldout_seq_len))
        argv += ("--top-k", str(s.top_k), *data_flags(plan), *common_flags(plan))
        steps.append(
            Step(f"shift of seed {seed}'s models", (*argv, "--out", f"{OUT}/misalignment/seed-{seed}"))
        )
    steps.append(Step("misalignment table", action=write_misalignment))
    return steps


def write_misalignment(plan: Plan) -> None:
    """Gather the per-seed shift.json files into misalignment.json / .csv / .md."""
    from resstream.io import write_text
    from resstream.reporting.misalignment import misalignment_csv, misalignment_markdown, misalignment_table
    from resstream.training.records import find_runs

    runs = [run for run in find_runs(plan.path("sweep")) if run.seed in plan.seeds]
    tagged: list[TaggedShift] = []
    shifts: list[dict[str, Any]] = []
    for seed in plan.seeds:
        path = plan.path("misalignment", f"seed-{seed}", "shift.json")
        shifts.append(json.loads(path.read_text(encoding="utf-8")))
        tagged += _tagged(seed, shifts[-1], [run for run in runs if run.seed == seed])
    s = plan.scale
    table = misalignment_table(
        tagged,
        dataset=s.heldout_dataset,
        top_k=s.top_k,
        decoder="logit-lens",
        num_sequences=shifts[0]["num_seqs"],
        seq_len=shifts[0]["seq_len"],
    )
    folder = plan.path("misalignment")
    write_json(folder / "misalignment.json", table)
    write_text(folder / "misalignment.csv", misalignment_csv(table))
    write_text(folder / "misalignment.md", misalignment_markdown(table))


def _tagged(seed: int, shift: dict[str, Any], runs: list[RunRecord]) -> list[TaggedShift]:
    """Each of the seed's runs with its entry in the seed's shift.json (RunError for a run
    that has none)."""
    from resstream.reporting.misalignment import TaggedShift

    entries = {_run_key(entry["model"]): entry for entry in shift["models"]}
    tagged = []
    for run in runs:
        key = _run_key(_folder(run))
        if key not in entries:
            raise RunError(
                f"misalignment/seed-{seed}/shift.json has no entry for the run {key}; "
                "run the misalignment stage again (`only` misalignment)"
            )
        tagged.append(TaggedShift(seed, run.name, key, entries[key]))
    return tagged


def _folder(run: RunRecord) -> Path:
    """The folder of a run that `find_runs` found (it gives every run its folder)."""
    if run.path is None:
        raise RunError(f"the sweep's run {run.name!r} of seed {run.seed} has no folder")
    return run.path


def _run_key(path: str | Path) -> str:
    """A sweep run's place inside the sweep, 'seed-<s>/<name>' (its last two path parts)."""
    return "/".join(Path(path).parts[-2:])
