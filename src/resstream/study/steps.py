"""The steps of the study's stages: the resstream command lines each stage runs, built from the
plan when the stage runs (the misalignment stage's are `resstream.study.misalignment`)."""

from __future__ import annotations

from resstream.study.argv import common_flags, data_flags, eval_flags, quiet_flag, sweep_argv
from resstream.study.pipeline import OUT, Step
from resstream.study.plan import Plan, model_dirs, model_slug

#: The Table I sentence: every layer of each pretrained model decodes it (`resstream lens`).
LENS_TEXT = "The capital of France is Paris, and the river that runs through it is the Seine."


def tokens_steps(plan: Plan) -> list[Step]:
    """Tokenise the training corpus into the sharded store the sweep reads."""
    s = plan.scale
    argv = ("tokenize", "--dataset", s.train_dataset, "--tokenizer", str(s.shard_tokenizer))
    return [
        Step(
            "tokenize",
            (*argv, *data_flags(plan), *quiet_flag(plan), "--out", f"{OUT}/tokens"),
        )
    ]


def shift_steps(plan: Plan) -> list[Step]:
    """`shift` and `lens` of every pretrained model."""
    s = plan.scale
    steps = []
    for model in plan.models:
        slug = model_slug(model)
        shift: tuple[str, ...] = ("shift", "--model", model, "--dataset", s.shift_dataset)
        shift += ("--num-seqs", str(s.shift_seqs), "--seq-len", str(s.shift_seq_len))
        shift += ("--top-k", str(s.top_k), *data_flags(plan))
        steps.append(Step(f"shift {model}", (*shift, *common_flags(plan), "--out", f"{OUT}/shift/{slug}")))
        lens = ("lens", "--model", model, "--text", LENS_TEXT, "--no-colour", *common_flags(plan))
        steps.append(Step(f"lens {model}", (*lens, "--out", f"{OUT}/lens/{slug}")))
    return steps


def sweep_steps(plan: Plan) -> list[Step]:
    """Train every run of the sweep (finished runs are kept)."""
    return [Step("sweep", sweep_argv(plan), distributed=True)]


def eval_steps(plan: Plan) -> list[Step]:
    """Benchmarks of every trained run (cached in its eval.json) and every pretrained model."""
    tokens = plan.scale.max_eval_tokens
    steps = [Step("eval sweep", sweep_argv(plan, *eval_flags(plan)))]
    for model in plan.models:
        argv: tuple[str, ...] = ("eval", "--model", model, "--benchmarks", ",".join(plan.scale.benchmarks))
        argv += (*(["--max-tokens", str(tokens)] if tokens else []), *data_flags(plan), *common_flags(plan))
        steps.append(Step(f"eval {model}", (*argv, "--out", f"{OUT}/eval/{model_slug(model)}")))
    return steps


def compare_steps(plan: Plan) -> list[Step]:
    """The baseline / best fixed cut / learned gate table."""
    argv = ("compare", f"{OUT}/sweep", *eval_flags(plan), *data_flags(plan), *common_flags(plan))
    return [Step("compare", (*argv, "--out", f"{OUT}/compare"))]


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
