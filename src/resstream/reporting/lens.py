"""Render decoding trajectories: a coloured terminal table, an HTML table and a PNG grid.

Cells that decode to the input token t_i are blue, cells that decode to the next token
t_{i+1} are green; everything else is plain. Nothing here computes model outputs.
"""

from __future__ import annotations

import html
from pathlib import Path

import typer

from resstream.analysis.lens import LensResult, PositionTrajectory
from resstream.io import write_text
from resstream.reporting.figures import new_figure, save_figure

INPUT_COLOUR = "#9ecae1"  # blue: decodes to the input token
NEXT_COLOUR = "#a1d99b"  # green: decodes to the next token


def _kind(trajectory: PositionTrajectory, token_id: int) -> str | None:
    if token_id == trajectory.next_id:
        return "next"
    if token_id == trajectory.input_id:
        return "input"
    return None


def _show(text: str) -> str:
    """Visible whitespace and control characters: ' the' is shown as '␣the', a newline as
    '↵', other control characters as escapes ('\\x1d'), so a token never breaks a line."""
    text = text.replace(" ", "␣").replace("\n", "↵")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def terminal_lines(result: LensResult, *, colour: bool = True) -> list[str]:
    """One line per position: input → next, then the merged layer ranges."""
    how = f" ({result.decoding})" if result.decoding else ""
    lines = [
        f"decoder {result.decoder}{how}, {result.num_layers} layers; "
        f"{'blue' if colour else '[input]'} = input token, {'green' if colour else '[next]'} = next token"
    ]
    for t in result.trajectories:
        head = f"{t.position:>4} {_show(result.token_text(t.input_id))!r:>14} → "
        head += f"{_show(result.token_text(t.next_id))!r:<14}" if t.next_id is not None else f"{'':<14}"
        cells = []
        for r in t.ranges():
            cell = f"{r.label}: {_show(result.token_text(r.token_id))}"
            kind = _kind(t, r.token_id)
            if colour and kind is not None:
                cell = typer.style(cell, fg="green" if kind == "next" else "blue", bold=True)
            elif kind is not None:
                cell += f" [{kind}]"
            cells.append(cell)
        lines.append(head + " | ".join(cells))
    return lines


def write_html(result: LensResult, path: str | Path) -> None:
    """A table: rows = positions, columns = layers, cells = top-1 decoding, coloured."""
    head = "".join(f"<th>{layer}</th>" for layer in range(result.num_layers + 1))
    rows = []
    for t in result.trajectories:
        cells = []
        for tok in t.top1:
            kind = _kind(t, tok)
            style = {"input": INPUT_COLOUR, "next": NEXT_COLOUR}.get(kind or "", "")
            attr = f' style="background:{style}"' if style else ""
            cells.append(f"<td{attr}>{html.escape(_show(result.token_text(tok)))}</td>")
        nxt = html.escape(_show(result.token_text(t.next_id))) if t.next_id is not None else ""
        rows.append(
            f"<tr><th>{t.position}</th><th>{html.escape(_show(result.token_text(t.input_id)))}</th>"
            f"<th>{nxt}</th>{''.join(cells)}</tr>"
        )
    page = (
        "<!doctype html><meta charset='utf-8'><title>resstream lens</title>"
        "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:2px 6px;"
        "font-family:monospace;white-space:pre}table{border-collapse:collapse}</style>"
        f"<p>{html.escape(result.model)} — decoder {html.escape(result.decoder)}"
        f"{html.escape(f' ({result.decoding})' if result.decoding else '')}; "
        f"<span style='background:{INPUT_COLOUR}'>input token</span> "
        f"<span style='background:{NEXT_COLOUR}'>next token</span></p>"
        f"<table><tr><th>pos</th><th>input</th><th>next</th>{head}</tr>{''.join(rows)}</table>"
    )
    write_text(path, page)


def plot_lens(result: LensResult, path: str | Path) -> None:
    """The same grid as a PNG (readable for up to a few dozen positions)."""
    n_pos, n_depth = len(result.trajectories), result.num_layers + 1
    fig = new_figure(1.0 + 0.9 * n_depth, 0.8 + 0.32 * n_pos)
    ax = fig.add_subplot()
    ax.set_xlim(-0.5, n_depth - 0.5)
    ax.set_ylim(n_pos - 0.5, -0.5)
    for row, t in enumerate(result.trajectories):
        for layer, tok in enumerate(t.top1):
            kind = _kind(t, tok)
            if kind is not None:
                ax.add_patch(_cell(layer, row, INPUT_COLOUR if kind == "input" else NEXT_COLOUR))
            ax.text(
                layer,
                row,
                _show(result.token_text(tok))[:10],
                ha="center",
                va="center",
                fontsize=7,
                family="monospace",
            )
    ax.set_xticks(range(n_depth))
    ax.set_xlabel("layer (0 = embedding)")
    ax.set_yticks(range(n_pos))
    ax.set_yticklabels(
        [f"{t.position} {_show(result.token_text(t.input_id))[:10]}" for t in result.trajectories],
        fontsize=7,
        family="monospace",
    )
    ax.set_title(f"{result.model}: top-1 {result.decoder} decoding (blue = input, green = next)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def _cell(x: int, y: int, colour: str):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colour, edgecolor="none")
