"""Small helpers shared by the command modules."""

from __future__ import annotations

from resstream.checks import check_max_tokens
from resstream.errors import UsageError


def check_max_eval_tokens(value: str | None) -> int | None:
    """--max-eval-tokens (sweep, compare: the evaluator's `max_tokens`) as an integer that allows
    one context and one scored token (`checks.check_max_tokens`)."""
    if value is None:
        return None
    try:
        tokens = int(value)
    except ValueError:
        raise UsageError(f"--max-eval-tokens: {value!r} is not an integer") from None
    check_max_tokens(tokens)
    return tokens


def split_names(text: str | None) -> list[str]:
    """'a,b' (or repeated spaces) into ['a', 'b']; None into []."""
    if text is None:
        return []
    return [item.strip() for item in text.replace(" ", ",").split(",") if item.strip()]
