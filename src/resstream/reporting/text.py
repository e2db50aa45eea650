"""Token text and probabilities as every renderer shows them (terminal, HTML, PNG)."""

from __future__ import annotations


def show_token(text: str, *, spaces: bool = True) -> str:
    """Visible whitespace and control characters: ' the' is shown as '␣the' (with `spaces`;
    without, spaces stay spaces, for running text), a newline as '↵', other control
    characters as escapes ('\\x1d'), so a token never breaks a line."""
    if spaces:
        text = text.replace(" ", "␣")
    text = text.replace("\n", "↵")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def probability_text(probability: float) -> str:
    """A probability in at most 7 characters: 0.412, or 1.2e-04 below 0.001."""
    return f"{probability:.3f}" if probability >= 0.001 else f"{probability:.1e}"
