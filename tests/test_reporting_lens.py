"""Lens renderers: terminal lines, HTML and PNG from a hand-made result."""

from __future__ import annotations

import html
from html.parser import HTMLParser

import torch
from matplotlib.image import imread

from resstream.analysis.decoding.decoder import Decoder
from resstream.analysis.shift.lens import trajectories
from resstream.reporting.lens import (
    POSITIONS_PER_IMAGE,
    lens_figure,
    plot_lens,
    terminal_lines,
    write_html,
)
from resstream.reporting.text import probability_text, show_token


def result(top_k: int = 1):
    e = torch.eye(4)
    states = torch.stack([torch.stack([e[0], e[2], e[3]]), torch.stack([e[2], e[3], e[1]])])
    return trajectories(
        states,
        torch.tensor([0, 2, 3]),
        Decoder("embedding", torch.eye(4)).exact(),
        top_k=top_k,
        model="toy",
        token_text=text,
    )


def long_result(positions: int):
    """A text of `positions` tokens over a 4-token vocabulary, 2 layers."""
    torch.manual_seed(0)
    return trajectories(
        torch.randn(3, positions, 4),
        torch.randint(0, 4, (positions,)),
        Decoder("embedding", torch.eye(4)).exact(),
        top_k=2,
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


def test_the_terminal_header_names_the_layers_and_the_marks_in_use():
    plain = terminal_lines(result(), colour=False)[0]
    assert "layers 0–1 (0 = embedding)" in plain
    assert "[input] = input token t_i" in plain and "[next] = next token t_{i+1}" in plain
    assert "blue" not in plain and "green" not in plain
    coloured = terminal_lines(result(), colour=True)[0]
    assert "blue = input token t_i" in coloured and "green = next token t_{i+1}" in coloured
    assert "[input]" not in coloured


def test_probability_text():
    assert probability_text(0.41234) == "0.412"
    assert probability_text(1.0) == "1.000"
    assert probability_text(0.001) == "0.001"
    assert probability_text(0.000123) == "1.2e-04"


class Cells(HTMLParser):
    """The header cells and each body cell's text and title of a lens page."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[tuple[str, dict]] = []
        self.cells: list[dict] = []
        self._open: dict | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("th", "td"):
            self._open = {"tag": tag, "attrs": dict(attrs), "text": ""}

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] += data

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self._open is not None:
            cell, self._open = self._open, None
            if tag == "th":
                self.headers.append((cell["text"], cell["attrs"]))
            else:
                self.cells.append(cell)


def test_html_has_a_layer_header_probabilities_and_top_k_on_hover(tmp_path):
    lens = result(top_k=2)
    write_html(lens, tmp_path / "lens.html")
    page = (tmp_path / "lens.html").read_text()
    parsed = Cells()
    parsed.feed(page)
    header = parsed.headers[:7]  # two header rows: "layer" over the layer columns, then their numbers
    assert [label for label, _ in header] == ["", "layer (0 = embedding)", "pos", "input", "next", "0", "1"]
    assert header[1][1] == {"colspan": "2"}  # over the columns of layers 0 and 1
    assert len(parsed.cells) == 3 * 2  # 3 positions × 2 depths
    first = lens.trajectories[0]
    cell = parsed.cells[1]  # position 0, layer 1: scores (0, 0, 1, 0), top-2 = ' the', ' a'
    p_the, p_a = first.top_probs[1]
    assert cell["text"] == "␣the" + probability_text(p_the)
    title = cell["attrs"]["title"]
    assert title.splitlines() == [
        "layer 1: top-2",
        f"␣the {probability_text(p_the)}",
        f"␣a {probability_text(p_a)}",
        f"input ␣a: rank {first.input_ranks[1]}, p {probability_text(first.input_probs[1])}",
        f"next ␣the: rank {first.next_ranks[1]}, p {probability_text(first.next_probs[1])}",
    ]
    assert "#a1d99b" in page and "position:sticky" in page  # the header stays while the page scrolls
    assert html.escape("hover") in page


def test_html_hover_lists_at_most_ten_tokens(tmp_path):
    e = torch.eye(20)
    lens = trajectories(
        e[:2].reshape(1, 2, 20), torch.tensor([0, 1]), Decoder("embedding", e).exact(), top_k=15
    )
    write_html(lens, tmp_path / "lens.html")
    parsed = Cells()
    parsed.feed((tmp_path / "lens.html").read_text())
    lines = parsed.cells[0]["attrs"]["title"].splitlines()
    assert lines[0] == "layer 0: top-15" and len(lines) == 1 + 10 + 1 + 2
    assert lines[11] == "… 5 more in lens.json"


def test_png_cells_show_the_probability_and_the_layer_axis_is_labelled(tmp_path):
    lens = result()
    figure = lens_figure(lens, 0)
    figure.canvas.draw()
    ax = figure.axes[0]
    assert [label.get_text() for label in ax.get_xticklabels()] == ["0", "1"] * 2  # below and above
    assert ax.get_xlabel() == "layer (0 = embedding)" and ax.xaxis.get_label_position() == "top"
    texts = [t.get_text() for t in ax.texts]
    for t in lens.trajectories:
        for layer in range(2):
            assert probability_text(t.top_probs[layer][0]) in texts
    paths = plot_lens(lens, tmp_path / "lens.png")
    assert paths == [tmp_path / "lens.png"]
    assert (tmp_path / "lens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_long_text_is_split_over_several_images(tmp_path):
    count = 2 * POSITIONS_PER_IMAGE + 1  # two full images and one of a single position
    lens = long_result(count)
    paths = plot_lens(lens, tmp_path / "lens.png")
    assert [p.name for p in paths] == ["lens.png", "lens_2.png", "lens_3.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
    heights = [imread(p).shape[0] for p in paths]
    assert max(heights) < 2000, heights
    last = lens_figure(lens, 2)
    assert list(last.axes[0].get_yticks()) == [0]
    assert f"positions {count - 1}–{count - 1} (part 3 of 3)" in last.axes[0].get_title()
    middle = lens_figure(lens, 1).axes[0]
    assert len(middle.get_yticks()) == POSITIONS_PER_IMAGE
    assert (
        f"positions {POSITIONS_PER_IMAGE}–{2 * POSITIONS_PER_IMAGE - 1} (part 2 of 3)" in middle.get_title()
    )


def test_control_characters_are_shown_as_escapes() -> None:
    assert show_token(" the\n") == "␣the↵"
    assert show_token("a\x1db\u2028") == "a\\x1db\\u2028"
    assert len(show_token("x\x1dy").splitlines()) == 1
