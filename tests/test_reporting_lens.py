"""Lens renderers: terminal lines, HTML and PNG from a hand-made result."""

from __future__ import annotations

import torch

from resstream.analysis.decoding import Decoder
from resstream.analysis.lens import trajectories
from resstream.reporting.lens import plot_lens, terminal_lines, write_html


def result():
    e = torch.eye(4)
    states = torch.stack([torch.stack([e[0], e[2], e[3]]), torch.stack([e[2], e[3], e[1]])])
    return trajectories(
        states,
        torch.tensor([0, 2, 3]),
        Decoder("embedding", torch.eye(4)).exact(),
        model="toy",
        token_text=text,
    )


def text(token_id: int) -> str:
    return [" a", " b", " the", "\n"][token_id]


def test_terminal_lines_mark_input_and_next_without_colour():
    lines = terminal_lines(result(), colour=False)
    assert lines[1].endswith("0: ␣a [input] | 1: ␣the [next]")
    assert lines[2].endswith("0: ␣the [input] | 1: ↵ [next]")
    coloured = terminal_lines(result(), colour=True)
    assert "\x1b[" in coloured[1]


def test_html_and_png(tmp_path):
    write_html(result(), tmp_path / "lens.html")
    page = (tmp_path / "lens.html").read_text()
    assert page.count("<tr>") == 4 and "#a1d99b" in page and "␣the" in page
    plot_lens(result(), tmp_path / "lens.png")
    assert (tmp_path / "lens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_control_characters_are_shown_as_escapes() -> None:
    from resstream.reporting.lens import _show

    assert _show(" the\n") == "␣the↵"
    assert _show("a\x1db\u2028") == "a\\x1db\\u2028"
    assert len(_show("x\x1dy").splitlines()) == 1
