"""The README's shell commands, in order, and what a test on this machine can do with each.

A command line in a ```bash block is run as written, run with the small flags its comment
documents (`# ... (quick: --seeds 0 --max-steps 40)`: appended, so they override the same
options given before; for the long ones), or skipped for a stated reason: it needs GPUs, the
Hugging Face hub, a user's own model, or the real corpora when `RESSTREAM_DATA` is unset.
`tests/test_readme.py` runs them; `benchmarks/bench_commands.py` times them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

#: Corpora read from a data directory (or the hub): not built in.
DATA_CORPORA = {"wikitext-2", "lambada", "openwebtext", "fineweb-edu", "ptb", "tinyshakespeare"}
#: Model specs that need nothing but the package.
BUILT_IN_MODELS = {"reference"}
#: What the set-up commands of the quick start are, when they are not resstream commands.
SET_UP = ("pip ", "python -m pytest", "python3 -m")

_QUICK = re.compile(r"\(quick: ([^)]*)\)")


@dataclass(frozen=True)
class ReadmeCommand:
    """One resstream command line of the README: its arguments (without `resstream`), the
    comment beside it, the small flags it documents, and why it cannot run here (or None)."""

    line: str
    args: tuple[str, ...]
    comment: str
    quick: tuple[str, ...]
    needs_data: bool
    skip: str | None

    @property
    def command(self) -> str:
        return self.args[0]

    @property
    def out(self) -> str | None:
        """The `--out` folder it writes."""
        return _option(self.args, "--out")

    def quick_args(self) -> list[str]:
        """The arguments with the documented small flags appended."""
        return [*self.args, *self.quick]


def bash_lines(text: str) -> list[str]:
    """The non-empty lines of every ```bash block, in order."""
    lines, inside = [], False
    for raw in text.splitlines():
        if raw.startswith("```"):
            inside = raw.strip() == "```bash"
            continue
        if inside and raw.strip():
            lines.append(raw.strip())
    return lines


def readme_commands(text: str | None = None) -> list[ReadmeCommand]:
    """Every `resstream` command of the README (a `... && resstream ...` chain: its resstream
    part), in order, classified."""
    text = README.read_text(encoding="utf-8") if text is None else text
    found = []
    for line in bash_lines(text):
        code, comment = _split_comment(line)
        for part in code.split("&&"):
            words = shlex.split(part)
            if words[:1] == ["torchrun"]:
                found.append(_classified(part.strip(), words[words.index("resstream") + 1 :], comment))
            elif words[:1] == ["resstream"]:
                found.append(_classified(part.strip(), words[1:], comment))
            elif not part.strip().startswith(SET_UP):
                raise ValueError(f"README command neither resstream nor set-up: {part.strip()!r}")
    return found


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: the comment starts at a `#` outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line, ""


def _classified(line: str, args: list[str], comment: str) -> ReadmeCommand:
    match = _QUICK.search(comment)
    quick = tuple(shlex.split(match.group(1))) if match else ()
    needs_data = _needs_data(args)
    return ReadmeCommand(line, tuple(args), comment, quick, needs_data, _skip_reason(line, args))


def _skip_reason(line: str, args: list[str]) -> str | None:
    if line.startswith("torchrun") or "--nproc-per-node" in args:
        return "needs several GPUs"
    if _option(args, "--device", "").startswith("cuda") or "--device-map" in args:
        return "needs a GPU"
    for model in _options(args, "--model"):
        if model.startswith("./"):
            return "a user's own model folder"
        if model not in BUILT_IN_MODELS and not model.startswith("runs/"):
            return "needs the Hugging Face hub"
    return None


def _needs_data(args: list[str]) -> bool:
    if args[0] == "reproduce":  # reads WikiText-2, LAMBADA, OpenWebText and FineWeb-Edu
        return True
    named = [*_options(args, "--dataset"), *",".join(_options(args, "--benchmarks")).split(",")]
    return any(name in DATA_CORPORA for name in named)


def _options(args: list[str] | tuple[str, ...], name: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == name]


def _option(args: list[str] | tuple[str, ...], name: str, default: str | None = None) -> str | None:
    values = _options(args, name)
    return values[-1] if values else default
