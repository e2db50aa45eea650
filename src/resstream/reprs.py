"""Short reprs for result objects: `Name(part; part)` on one line when it fits, else one part
per line.

A result of the Python API holds thousands of numbers, which a dataclass's own repr would print
all of. Each result's `__repr__` is instead `summary(self, ...)` with the few facts a reader
checks first (the model, the headline number, the exactness check); `.to_dict()` has the rest.
"""

from __future__ import annotations

import textwrap

#: The longest repr kept on one line.
WIDTH = 100


def summary(result: object, *parts: str, width: int = WIDTH) -> str:
    """`ClassName(part; part; ...)` for `result`, empty parts left out; when that is longer than
    `width` characters or a part spans lines (a nested summary), one part per indented line:

        ClassName(
          part
          part
        )
    """
    name = type(result).__name__
    kept = [part for part in parts if part]
    line = f"{name}({'; '.join(kept)})"
    if len(line) <= width and "\n" not in line:
        return line
    body = "\n".join(textwrap.indent(part, "  ") for part in kept)
    return f"{name}(\n{body}\n)"


__all__ = ["WIDTH", "summary"]
