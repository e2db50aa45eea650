"""`resstream train`: train a GPT-2-style model, optionally with residual attenuation."""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from resstream.cli import options
from resstream.cli.flags import cli_message, flag
from resstream.errors import UsageError, closest
from resstream.notices import say
from resstream.training.config import (
    FIELDS,
    PRESETS,
    TrainConfig,
    build_config,
    description,
    flatten,
    load_yaml,
    preset_values,
)

#: --preset's help (train and sweep): the presets by name.
PRESET_HELP = f"Preset: {', '.join(PRESETS)}."


@dataclass(frozen=True)
class ConfigSource:
    """Where a training config starts (train and sweep): a preset, a YAML file, both or neither."""

    preset: str | None
    config: Path | None


#: --preset and --config, as train and sweep declare them: ``source: ConfigArg``.
ConfigArg = Annotated[
    ConfigSource,
    options.OptionGroup(
        ConfigSource,
        {
            "preset": (Annotated[str | None, typer.Option(help=PRESET_HELP)], None),
            "config": (options.ConfigOption, None),
        },
    ),
]

if TYPE_CHECKING:
    from resstream.training.records import TrainResult

#: Fields that have typed options of their own; every other field is an extra `--flag`.
_TYPED = ("gate", "alpha", "cut_layer", "max_steps", "seed")


def default_text(name: str) -> str:
    """A field's default, honestly: the base value, then each preset's own where it differs."""
    _, fld = FIELDS[name]
    presets = [f"{preset} {value!r}" for preset, value in preset_values(name).items() if value != fld.default]
    text = f"default {fld.default!r}"
    return f"{text}; {', '.join(presets)}" if presets else text


def option_help(name: str) -> str:
    """The help of a typed option that sets config field `name`: description and defaults."""
    return f"{description(name).rstrip('.')} ({default_text(name)})."


#: Width the field list of `train --help` is wrapped to, so that a long description continues
#: under its own column on an 80-column terminal instead of at the left edge.
HELP_WIDTH = 76


def field_help() -> str:
    """The epilog of `train --help`: every other config field, one line each, by section."""
    paragraphs = [
        "Every config field is also a flag: --name VALUE (booleans also --no-name). A default is "
        "the base config's (no --preset); a preset's own value follows where it differs. Precedence: "
        "preset < --config YAML < flags."
    ]
    by_section: dict[str, list[str]] = {}
    for name, (section, _) in FIELDS.items():
        if name not in _TYPED:
            line = f"  {flag(name):<22} {description(name).rstrip('.')} ({default_text(name)})"
            wrapped = textwrap.fill(
                line, width=HELP_WIDTH, subsequent_indent=" " * 25, break_on_hyphens=False
            )
            by_section.setdefault(section, []).append(escape(wrapped))
    for section, lines in by_section.items():
        paragraphs.append("\n".join([f"{section}:", *lines]))
    return "\n\n".join(paragraphs)


def parse_field_flags(args: list[str]) -> dict[str, str | bool]:
    """Turn `--name value`, `--name=value` and `--no-name` into {field: raw value}."""
    values: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise UsageError(f"unexpected argument {arg!r}; config fields are given as --name value")
        key, eq, inline = arg[2:].partition("=")
        name = key.replace("-", "_")
        if name.startswith("no_") and name[3:] in FIELDS and not eq:
            values[name[3:]] = False
            i += 1
            continue
        if eq:
            values[name] = inline
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            values[name] = args[i + 1]
            i += 2
        else:
            values[name] = True
            i += 1
    check_field_flags(values)
    return values


def check_field_flags(values: dict[str, str | bool]) -> None:
    """Refuse a flag that names no config field, suggesting the closest field flag."""
    field_flags = [flag(name) for name in FIELDS]
    for name in values:
        if name not in FIELDS:
            given = "--" + name.replace("_", "-")
            raise UsageError(f"unknown config key {given!r} in flags{closest(given, field_flags)}")


def resolve_train_config(
    source: ConfigSource, typed: dict[str, Any], extra: list[str], saved: dict[str, Any] | None = None
) -> TrainConfig:
    """Layer saved config (on resume), preset, YAML file, extra flags and typed options."""
    layers = []
    if saved is not None:
        layers.append(flatten(saved, "saved config"))
    if source.config is not None:
        layers.append(load_yaml(source.config))
    layers.append(parse_field_flags(extra))
    layers.append({k: v for k, v in typed.items() if v is not None})
    return build_config(*layers, preset=source.preset)


@options.command
def train(
    *,
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Run directory (created if missing).")],
    source: ConfigArg,
    gate: Annotated[str | None, typer.Option(help=option_help("gate"))] = None,
    alpha: Annotated[float | None, typer.Option(help=option_help("alpha"))] = None,
    cut_layer: Annotated[int | None, typer.Option(help=option_help("cut_layer"))] = None,
    max_steps: Annotated[int | None, typer.Option(help=option_help("max_steps"))] = None,
    seed: Annotated[int | None, typer.Option(help=option_help("seed"))] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in --out from its latest checkpoint.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Train a model; writes weights, tokenizer, metrics.jsonl, run.json and loss_curve.png
    (gated runs also gate.png) into --out. Ctrl-C finishes the current step, saves a checkpoint
    and exits with 130 (--resume continues from it); a second Ctrl-C stops at once."""
    from resstream.api.train import check_fixed_gate_options, train_into

    if resume and source.preset is not None:
        raise UsageError(
            f"--preset {source.preset!r} cannot be combined with --resume: the run continues "
            f"with its saved config (change fields with flags)"
        )
    typed = {"gate": gate, "alpha": alpha, "cut_layer": cut_layer, "max_steps": max_steps, "seed": seed}

    def configure(saved: dict[str, Any] | None) -> TrainConfig:
        cfg = resolve_train_config(source, typed, list(ctx.args), saved)
        check_fixed_gate_options(cfg.model.gate, [name for name, value in typed.items() if value is not None])
        return cfg

    result = train_into(
        out,
        configure,
        resume=resume,
        progress=not quiet,
        log=lambda line: say(cli_message(line, "train")),
        resume_hint=f"continue with: resstream train --resume --out {shlex.quote(str(out))}",
    )
    typer.echo(outcome_line(result, out))


def outcome_line(result: TrainResult, out: Path) -> str:
    """What a `train` call did, in one line: trained, resumed, or found the run complete."""
    val = f"validation loss {result.final_val_loss:.4f}"
    if result.already_complete:
        return (
            f"{out} was already complete ({result.steps} steps; {val}); nothing trained "
            f"(resume with --max-steps above {result.steps} to train further)"
        )
    if result.steps_run == 0:
        return f"nothing left to train at step {result.steps}; wrote the final model; {val}; run in {out}"
    if result.steps_run < result.steps:
        first = result.steps - result.steps_run + 1
        return f"trained {result.steps_run} more steps ({first} to {result.steps}); {val}; run in {out}"
    return f"trained {result.steps} steps; {val}; run in {out}"


def register_taking_field_flags(app: typer.Typer, name: str, command: Callable[..., None]) -> None:
    """Add a command that takes any config field as `--field value` (train and sweep), with
    the field list as its help's epilog."""
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command(name, context_settings=settings, epilog=field_help())(command)


def register(app: typer.Typer) -> None:
    """Add `train` to the app."""
    register_taking_field_flags(app, "train", train)
