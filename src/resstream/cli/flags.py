"""The one table from library parameter names to command-line flags.

Library messages mark parameter names with backticks (see `resstream.errors`); `cli_message`
turns each into the flag that sets it. A parameter `some_name` is the flag `--some-name`
unless `FLAGS` says otherwise; ```name=True``` becomes the flag itself and ```name=False```
its ``--no-`` form.
"""

from __future__ import annotations

import re

#: Parameters whose flag is not `--` + the name with dashes.
FLAGS: dict[str, str] = {
    "models": "--model",
    "out_dir": "--out",
}

#: Per command, parameters whose flag there differs from `FLAGS` (sweep and compare hand
#: their `--max-eval-tokens` to the evaluator's `max_tokens`; sweep sets each run's `seed`
#: from `--seeds`; `neurons` takes its `neurons` one `--neuron` at a time, `ablate` and `patch`
#: their `components` one `--component` and `receivers` one `--receiver` at a time; `directions`
#: its `tokens` one `--token` at a time; `generate` and `steer` their `prompts` one `--prompt`,
#: `edits` one `--edit`, `coefs`, `alphas`, `layers` and `runs` one `--coef`, `--alpha`,
#: `--layer` and `--run` at a time).
COMMAND_FLAGS: dict[str, dict[str, str]] = {
    "sweep": {"max_tokens": "--max-eval-tokens", "seed": "--seeds"},
    "compare": {"max_tokens": "--max-eval-tokens"},
    "neurons": {"neurons": "--neuron"},
    "ablate": {"components": "--component"},
    "patch": {"components": "--component", "receivers": "--receiver"},
    "directions": {"tokens": "--token"},
    "generate": {"prompts": "--prompt", "edits": "--edit", "use_cache": "--no-cache"},
    "steer": {
        "prompts": "--prompt",
        "directions": "--direction",
        "coefs": "--coef",
        "concept_tokens": "--concept-token",
        "alphas": "--alpha",
        "layers": "--layer",
        "runs": "--run",
    },
}

#: Parameters whose False is a flag of its own.
NEGATIVE_FLAGS: dict[str, str] = {
    "contributions": "--no-contributions",
    "learned": "--no-learned",
    "layernorm": "--no-layernorm",
    "residual": "--no-residual",
}

_MARKED = re.compile(r"`([a-z_][a-z0-9_]*)(?:=(True|False))?`")


def flag(name: str, command: str | None = None) -> str:
    """The flag that sets library parameter `name` (in `command`, where it differs)."""
    specific = COMMAND_FLAGS.get(command or "", {})
    return specific.get(name) or FLAGS.get(name, "--" + name.replace("_", "-"))


def cli_message(message: str, command: str | None = None) -> str:
    """A library message with every backticked parameter name replaced by its flag in
    `command` (the command the user ran, when known)."""

    def replace(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        if value == "False":
            return NEGATIVE_FLAGS.get(name, f"{flag(name, command)}=False")
        return flag(name, command)

    return _MARKED.sub(replace, message)
