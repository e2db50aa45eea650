"""The flags a plan passes on to the study's command lines (device, quiet, local corpora,
benchmarks) and the sweep's command line, which the sweep and eval stages share."""

from __future__ import annotations

from resstream.study.pipeline import OUT
from resstream.study.plan import Plan


def device_flags(plan: Plan) -> list[str]:
    """--device, unless the plan leaves it to the command (auto)."""
    return ["--device", plan.device] if plan.device != "auto" else []


def quiet_flag(plan: Plan) -> list[str]:
    """--quiet when the plan asks for no progress bars."""
    return ["--quiet"] if plan.quiet else []


def common_flags(plan: Plan) -> list[str]:
    """The device and quiet flags every analysis and eval command takes."""
    return [*device_flags(plan), *quiet_flag(plan)]


def data_flags(plan: Plan) -> list[str]:
    """--data-dir when the plan names local corpora."""
    return ["--data-dir", plan.data_dir] if plan.data_dir else []


def eval_flags(plan: Plan) -> list[str]:
    """The scale's benchmarks (and token cap) as `sweep` and `compare` take them."""
    tokens = plan.scale.max_eval_tokens
    return [
        "--benchmarks",
        ",".join(plan.scale.benchmarks),
        *(["--max-eval-tokens", str(tokens)] if tokens else []),
    ]


def sweep_argv(plan: Plan, *extra: str) -> tuple[str, ...]:
    """`resstream sweep` of the plan's preset and seeds into OUT/sweep, with `extra` flags."""
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
        *device_flags(plan),
        *data_flags(plan),
        *extra,
        *quiet_flag(plan),
        "--out",
        f"{OUT}/sweep",
    )
