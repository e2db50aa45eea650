"""The residual-attenuation study as `resstream reproduce` runs it: scales and stages.

Stages, in order (`STAGE_TABLE`; the engine is `resstream.cli.pipeline`):

* ``tokens``: the sharded token store of the training corpus (scales that train on a streamed
  corpus: `paper`);
* ``shift``: `shift` and `lens` of each pretrained model on the analysis corpus;
* ``sweep``: `sweep`: baseline, a fixed cut per layer and the learned gate, per seed;
* ``eval``: every trained model (`sweep --benchmarks`) and every pretrained one (`eval --model`)
  on the benchmarks;
* ``compare``: `compare` of the sweep (baseline / best fixed cut / learned gate);
* ``misalignment``: `shift` of every trained model on held-out text, gathered per variant into
  misalignment.json (`resstream.reporting.misalignment`);
* ``report``: one self-contained report.html.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resstream.cli.pipeline import OUT, Stage, Step
from resstream.errors import RunError, UsageError, check_choice
from resstream.io import check_inside, write_json

#: The Table I sentence: every layer of each pretrained model decodes it (`resstream lens`).
LENS_TEXT = "The capital of France is Paris, and the river that runs through it is the Seine."


# --------------------------------------------------------------------------- scales
@dataclass(frozen=True)
class Scale:
    """What one scale trains, evaluates and analyses (`SCALES`)."""

    name: str
    about: str
    models: tuple[str, ...]  # pretrained models of the shift and eval stages
    preset: str  # the training preset of every sweep run
    train_flags: tuple[str, ...]  # config flags on top of the preset
    seeds: tuple[int, ...]
    train_dataset: str  # the sweep's training corpus (the preset's)
    shift_dataset: str = "wikitext-2"
    shift_seqs: int = 64
    shift_seq_len: int = 128
    top_k: int = 5
    heldout_dataset: str = "wikitext-2"  # misalignment of the trained models
    heldout_seqs: int = 64
    heldout_seq_len: int = 64  # at most the trained models' context
    benchmarks: tuple[str, ...] = ("wikitext-2", "lambada", "openwebtext", "fineweb-edu")
    max_eval_tokens: int | None = None
    shard_tokenizer: str | None = None  # a tokens stage runs first when set


SCALES: dict[str, Scale] = {
    scale.name: scale
    for scale in (
        Scale(
            name="tiny",
            about="a smoke test of the whole pipeline in about a minute: 2-layer models, 20 steps",
            models=("reference",),
            preset="tiny",
            train_flags=(),
            seeds=(0, 1),
            train_dataset="shakespeare",
            shift_seqs=8,
            shift_seq_len=32,
            heldout_seqs=8,
            heldout_seq_len=32,
            benchmarks=("wikitext-2", "lambada"),
            max_eval_tokens=500,
        ),
        Scale(
            name="laptop",
            about="4-layer, 64-wide models trained for 800 steps on the built-in Shakespeare corpus, "
            "3 seeds; about 15 minutes on 2 CPU cores",
            models=("reference",),
            preset="laptop",
            train_flags=("--max-steps", "800"),
            seeds=(0, 1, 2),
            train_dataset="shakespeare",
            benchmarks=("wikitext-2", "lambada", "openwebtext", "fineweb-edu", "shakespeare"),
            max_eval_tokens=20_000,
        ),
        Scale(
            name="paper",
            about="the paper's protocol: 12-layer GPT-2-style models on 10B tokens of FineWeb-Edu "
            "(bf16, torch.compile, fused AdamW; GPUs under torchrun)",
            models=("gpt2", "google/gemma-2-2b"),
            preset="paper",
            train_flags=(),
            seeds=(0,),
            train_dataset="fineweb-edu-10bt",
            shift_seqs=256,
            heldout_seqs=256,
            heldout_seq_len=1024,
            shard_tokenizer="gpt2",
        ),
    )
}


# --------------------------------------------------------------------------- the plan
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


def _device_flags(plan: Plan) -> list[str]:
    return ["--device", plan.device] if plan.device != "auto" else []


def _quiet_flag(plan: Plan) -> list[str]:
    return ["--quiet"] if plan.quiet else []


def _common(plan: Plan) -> list[str]:
    return [*_device_flags(plan), *_quiet_flag(plan)]


def model_dirs(plan: Plan, kind: str) -> list[Path]:
    """The folder of each pretrained model's `kind` output (shift, lens, eval)."""
    return [plan.path(kind, model_slug(model)) for model in plan.models]


def _data_flags(plan: Plan) -> list[str]:
    return ["--data-dir", plan.data_dir] if plan.data_dir else []


def _sweep_argv(plan: Plan, *extra: str) -> tuple[str, ...]:
    s = plan.scale
    train_data = ["--dataset", f"{OUT}/tokens"] if s.shard_tokenizer else []
    return (
        "sweep",
        "--preset",
        s.preset,
        *s.train_flags,
        *train_data,
        "--seeds",
        ",".join(map(str, plan.seeds)),
        *_device_flags(plan),
        *_data_flags(plan),
        *extra,
        *_quiet_flag(plan),
        "--out",
        f"{OUT}/sweep",
    )


def _eval_flags(plan: Plan) -> list[str]:
    tokens = plan.scale.max_eval_tokens
    return [
        "--benchmarks",
        ",".join(plan.scale.benchmarks),
        *(["--max-eval-tokens", str(tokens)] if tokens else []),
    ]


def tokens_steps(plan: Plan) -> list[Step]:
    """Tokenise the training corpus into the sharded store the sweep reads."""
    s = plan.scale
    argv = ("tokenize", "--dataset", s.train_dataset, "--tokenizer", str(s.shard_tokenizer))
    return [
        Step(
            "tokenize",
            (*argv, *_data_flags(plan), *_quiet_flag(plan), "--out", f"{OUT}/tokens"),
        )
    ]


def shift_steps(plan: Plan) -> list[Step]:
    """`shift` and `lens` of every pretrained model."""
    s = plan.scale
    steps = []
    for model in plan.models:
        slug = model_slug(model)
        shift = ("shift", "--model", model, "--dataset", s.shift_dataset, "--num-seqs", str(s.shift_seqs))
        shift += ("--seq-len", str(s.shift_seq_len), "--top-k", str(s.top_k), *_data_flags(plan))
        steps.append(Step(f"shift {model}", (*shift, *_common(plan), "--out", f"{OUT}/shift/{slug}")))
        lens = ("lens", "--model", model, "--text", LENS_TEXT, "--no-colour", *_common(plan))
        steps.append(Step(f"lens {model}", (*lens, "--out", f"{OUT}/lens/{slug}")))
    return steps


def sweep_steps(plan: Plan) -> list[Step]:
    """Train every run of the sweep (finished runs are kept)."""
    return [Step("sweep", _sweep_argv(plan), distributed=True)]


def eval_steps(plan: Plan) -> list[Step]:
    """Benchmarks of every trained run (cached in its eval.json) and every pretrained model."""
    tokens = plan.scale.max_eval_tokens
    steps = [Step("eval sweep", _sweep_argv(plan, *_eval_flags(plan)))]
    for model in plan.models:
        argv = ("eval", "--model", model, "--benchmarks", ",".join(plan.scale.benchmarks))
        argv += (*(["--max-tokens", str(tokens)] if tokens else []), *_data_flags(plan), *_common(plan))
        steps.append(Step(f"eval {model}", (*argv, "--out", f"{OUT}/eval/{model_slug(model)}")))
    return steps


def compare_steps(plan: Plan) -> list[Step]:
    """The baseline / best fixed cut / learned gate table."""
    argv = ("compare", f"{OUT}/sweep", *_eval_flags(plan), *_data_flags(plan), *_common(plan))
    return [Step("compare", (*argv, "--out", f"{OUT}/compare"))]


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
        where = [f"{OUT}/sweep/{Path(run.path).relative_to(sweep).as_posix()}" for run in mine]
        models = [arg for path in where for arg in ("--model", path)]
        argv = ("shift", *models, "--dataset", s.heldout_dataset, "--num-seqs", str(s.heldout_seqs))
        argv += ("--seq-len", str(s.heldout_seq_len))
        argv += ("--top-k", str(s.top_k), *_data_flags(plan), *_common(plan))
        steps.append(
            Step(f"shift of seed {seed}'s models", (*argv, "--out", f"{OUT}/misalignment/seed-{seed}"))
        )
    steps.append(Step("misalignment table", action=write_misalignment))
    return steps


def write_misalignment(plan: Plan) -> None:
    """Gather the per-seed shift.json files into misalignment.json / .csv / .md."""
    from resstream.io import write_text
    from resstream.reporting.misalignment import (
        TaggedShift,
        misalignment_csv,
        misalignment_markdown,
        misalignment_table,
    )
    from resstream.training.records import find_runs

    sweep = plan.path("sweep")
    runs = [run for run in find_runs(sweep) if run.seed in plan.seeds]
    tagged, first = [], None
    for seed in plan.seeds:
        shift = json.loads(
            plan.path("misalignment", f"seed-{seed}", "shift.json").read_text(encoding="utf-8")
        )
        first = first or shift
        entries = {_run_key(entry["model"]): entry for entry in shift["models"]}
        for run in (run for run in runs if run.seed == seed):
            key = _run_key(run.path)
            if key not in entries:
                raise RunError(
                    f"misalignment/seed-{seed}/shift.json has no entry for the run {key}; "
                    "run the misalignment stage again (`only` misalignment)"
                )
            tagged.append(TaggedShift(seed, run.name, key, entries[key]))
    s = plan.scale
    table = misalignment_table(
        tagged,
        dataset=s.heldout_dataset,
        top_k=s.top_k,
        decoder="logit-lens",
        num_sequences=first["num_seqs"],
        seq_len=first["seq_len"],
    )
    folder = plan.path("misalignment")
    write_json(folder / "misalignment.json", table)
    write_text(folder / "misalignment.csv", misalignment_csv(table))
    write_text(folder / "misalignment.md", misalignment_markdown(table))


def _run_key(path: str | Path) -> str:
    """A sweep run's place inside the sweep, 'seed-<s>/<name>' (its last two path parts)."""
    return "/".join(Path(path).parts[-2:])


def report_steps(plan: Plan) -> list[Step]:
    """One self-contained report.html of everything above."""
    return [Step("report.html", action=write_study_report)]


def write_study_report(plan: Plan) -> None:
    """report.html in the reproduction's directory, from all its stages' outputs."""
    from resstream.reporting.report import find_outputs, write_report

    s = plan.scale
    note = (
        f"{s.name} scale: {s.about}; pretrained: {', '.join(plan.models)}; "
        f"seeds {', '.join(map(str, plan.seeds))}"
    )
    folders = [*model_dirs(plan, "shift"), *model_dirs(plan, "lens"), plan.path("sweep")]
    folders += [*model_dirs(plan, "eval"), plan.path("compare"), plan.path("misalignment")]
    title = f"resstream reproduction ({s.name} scale)"
    write_report(find_outputs(folders), plan.out, title=title, scale_note=note)  # this plan's models only


def _none(plan: Plan) -> tuple[str, ...]:
    return ()


STAGE_TABLE: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage(
            "tokens",
            "tokenise the training corpus into shards",
            ("train_dataset", "shard_tokenizer"),
            (),
            _none,
            tokens_steps,
            applies=lambda plan: plan.scale.shard_tokenizer is not None,
            outputs=lambda p: [p.path("tokens", "manifest.json")],
        ),
        Stage(
            "shift",
            "shift and lens of the pretrained models",
            ("models", "shift_dataset", "shift_seqs", "shift_seq_len", "top_k"),
            (),
            lambda p: (p.scale.shift_dataset,),
            shift_steps,
            outputs=lambda p: [d / f"{kind}.json" for kind in ("shift", "lens") for d in model_dirs(p, kind)],
        ),
        Stage(
            "sweep",
            "train baseline, fixed cuts and learned gate per seed",
            ("preset", "train_flags", "seeds", "train_dataset"),
            ("tokens",),
            lambda p: () if p.scale.shard_tokenizer else (p.scale.train_dataset,),
            sweep_steps,
            outputs=lambda p: [p.path("sweep", "sweep.json")],
        ),
        Stage(
            "eval",
            "benchmarks of every trained and pretrained model",
            ("models", "benchmarks", "max_eval_tokens"),
            ("sweep",),
            lambda p: p.scale.benchmarks,
            eval_steps,
            outputs=lambda p: [d / "eval.json" for d in model_dirs(p, "eval")],
        ),
        Stage(
            "compare",
            "the comparison table",
            ("benchmarks", "max_eval_tokens"),
            ("eval",),
            _none,
            compare_steps,
            outputs=lambda p: [p.path("compare", "compare.json")],
        ),
        Stage(
            "misalignment",
            "shift of every trained model on held-out text",
            ("heldout_dataset", "heldout_seqs", "heldout_seq_len", "top_k", "seeds"),
            ("sweep",),
            lambda p: (p.scale.heldout_dataset,),
            misalignment_steps,
            outputs=lambda p: [p.path("misalignment", "misalignment.json")],
        ),
        Stage(
            "report",
            "report.html",
            ("name", "about", "models", "seeds"),
            ("shift", "sweep", "eval", "compare", "misalignment"),
            _none,
            report_steps,
            outputs=lambda p: [p.path("report.html")],
        ),
    )
}
