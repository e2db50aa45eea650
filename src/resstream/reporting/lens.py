"""Render decoding trajectories: a terminal table, an HTML table and PNG grids.

Cells that decode to the input token t_i are blue, cells that decode to the next token
t_{i+1} are green; everything else is plain. Without colour (a pipe, NO_COLOR, --no-colour)
the terminal marks such cells `[input]` / `[next]` instead, and its header says so. The HTML
and PNG cells show the top-1 token with its probability (the HTML lists the top-k with their
probabilities on hover); a long text is split over several PNGs of at most
`POSITIONS_PER_IMAGE` positions each. Nothing here computes model outputs.

In a notebook a `LensResult` shows the table of lens.html (`lens_table_html`) and the figures of
lens.png (`lens_figure`); `lens_frame` is its `to_pandas()`.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from resstream.analysis.shift.lens import LENS_COLUMNS, LensResult, PositionTrajectory
from resstream.io import write_text
from resstream.reporting.figures import INPUT_TOKEN, NEXT_TOKEN, figure_token, new_figure, save_figure
from resstream.reporting.notebook import NotebookView, Picture, Table, long_frame, register_result
from resstream.reporting.text import probability_text, show_token

if TYPE_CHECKING:
    import pandas

INPUT_COLOUR = "#9ecae1"  # blue: decodes to the input token
NEXT_COLOUR = "#a1d99b"  # green: decodes to the next token
LAYER_HEADER = "layer (0 = embedding)"
POSITIONS_PER_IMAGE = 32  # rows of one PNG: lens.png, then lens_2.png, lens_3.png, ...
HOVER_TOKENS = 10  # at most this many of the top-k in an HTML cell's hover text


def token_kind(trajectory: PositionTrajectory, token_id: int) -> str | None:
    """The kind of a decoded token at a position: "next" when it is the next token, "input"
    when it is the input token (next first: a token followed by itself is the next one),
    else None."""
    if token_id == trajectory.next_id:
        return "next"
    if token_id == trajectory.input_id:
        return "input"
    return None


def terminal_lines(result: LensResult, *, colour: bool = True) -> list[str]:
    """A header, then one line per position: input → next, then the merged layer ranges.
    Input and next cells are bold blue / green with `colour`, else suffixed [input] / [next];
    the header names the marks in use."""
    how = f" ({result.decoding})" if result.decoding else ""
    marks = (
        "blue = input token t_i, green = next token t_{i+1}"
        if colour
        else "[input] = input token t_i, [next] = next token t_{i+1}"
    )
    lines = [f"decoder {result.decoder}{how}; layers 0–{result.num_layers} (0 = embedding); {marks}"]
    for t in result.trajectories:
        head = f"{t.position:>4} {show_token(result.token_text(t.input_id))!r:>14} → "
        head += f"{show_token(result.token_text(t.next_id))!r:<14}" if t.next_id is not None else f"{'':<14}"
        cells = []
        for r in t.ranges():
            cell = f"{r.label}: {show_token(result.token_text(r.token_id))}"
            kind = token_kind(t, r.token_id)
            if colour and kind is not None:
                cell = typer.style(cell, fg="green" if kind == "next" else "blue", bold=True)
            elif kind is not None:
                cell += f" [{kind}]"
            cells.append(cell)
        lines.append(head + " | ".join(cells))
    return lines


def _hover_text(result: LensResult, t: PositionTrajectory, layer: int) -> str:
    """An HTML cell's title: the layer's top-k (at most HOVER_TOKENS) with probabilities, then
    the rank and probability of the input and the next token."""
    ids, probs = t.top_ids[layer], t.top_probs[layer]
    lines = [f"layer {layer}: top-{len(ids)}"]
    for token, probability in list(zip(ids, probs, strict=True))[:HOVER_TOKENS]:
        lines.append(f"{show_token(result.token_text(token))} {probability_text(probability)}")
    if len(ids) > HOVER_TOKENS:
        lines.append(f"… {len(ids) - HOVER_TOKENS} more in lens.json")
    targets = [("input", t.input_id, t.input_ranks, t.input_probs)]
    if t.next_id is not None and t.next_ranks is not None and t.next_probs is not None:
        targets.append(("next", t.next_id, t.next_ranks, t.next_probs))
    for name, token, ranks, probabilities in targets:
        text = show_token(result.token_text(token))
        lines.append(f"{name} {text}: rank {ranks[layer]}, p {probability_text(probabilities[layer])}")
    return "\n".join(lines)


def _html_cell(result: LensResult, t: PositionTrajectory, layer: int) -> str:
    """One table cell: the top-1 token, its probability below, the top-k on hover."""
    token = t.top_ids[layer][0]
    colour = {"input": INPUT_COLOUR, "next": NEXT_COLOUR}.get(token_kind(t, token) or "")
    style = f' style="background:{colour}"' if colour else ""
    title = html.escape(_hover_text(result, t, layer), quote=True).replace("\n", "&#10;")
    return (
        f'<td title="{title}"{style}>{html.escape(show_token(result.token_text(token)))}'
        f"<small>{probability_text(t.top_probs[layer][0])}</small></td>"
    )


#: The table's style, scoped to its `LENS_CLASS` box (a notebook page holds other tables). Each
#: cell has its own border (`separate`): with collapsed borders, or with borders on some sides
#: only, Chromium paints the scrolled rows over the sticky header.
LENS_CLASS = "resstream-lens"
TABLE_STYLE = "".join(
    f".{LENS_CLASS} {rule}"
    for rule in (
        f"td,.{LENS_CLASS} th{{border:1px solid #ddd;padding:2px 6px;font-family:monospace;white-space:pre}}",
        "table{border-collapse:separate;border-spacing:0}",
        "thead{position:sticky;top:0;z-index:1}",
        "thead th{background:#f4f4f4}",
        "td small{display:block;color:#555;font-size:75%}",
        "td{cursor:help}",
        ".scroll{max-height:85vh;overflow:auto;display:inline-block}",
    )
)
#: The page's style: the table's, in a sans-serif page.
PAGE_STYLE = "body{font-family:sans-serif}" + TABLE_STYLE


def _html_key(result: LensResult) -> str:
    """The paragraph above the table: model, decoder, colours, what a cell and its hover show."""
    how = f" ({result.decoding})" if result.decoding else ""
    return (
        f"<p>{html.escape(result.model)} — decoder {html.escape(result.decoder + how)}; "
        f"<span style='background:{INPUT_COLOUR}'>input token</span> "
        f"<span style='background:{NEXT_COLOUR}'>next token</span>; each cell: the top-1 token and "
        f"its probability (hover a cell for the top-{result.top_k} and the input and next token's "
        "rank and probability; rank = how many tokens score higher, 0 = top-1)</p>"
    )


def _html_header(depth: int) -> str:
    """Two header rows: "layer" over the layer columns, then pos, input, next, 0..L."""
    layers = "".join(f"<th>{layer}</th>" for layer in range(depth))
    return (
        f"<thead><tr><th colspan='3'></th><th colspan='{depth}'>{LAYER_HEADER}</th></tr>"
        f"<tr><th>pos</th><th>input</th><th>next</th>{layers}</tr></thead>"
    )


def write_html(result: LensResult, path: str | Path) -> None:
    """lens.html: the page of `lens_table_html`."""
    page = (
        f"<!doctype html><meta charset='utf-8'><title>resstream lens</title><style>{PAGE_STYLE}</style>"
        f"{lens_table_html(result)}"
    )
    write_text(path, page)


def lens_table_html(result: LensResult) -> str:
    """The key and the table of lens.html, in a box of class `LENS_CLASS` (the page's style
    applies to it): rows = positions, columns = layers 0..L under a "layer" header, cells =
    top-1 decoding with its probability, coloured; hovering a cell lists its top-k. The table
    scrolls in a box of at most the window's height, its header staying in view."""
    depth = result.num_layers + 1
    rows = []
    for t in result.trajectories:
        nxt = html.escape(show_token(result.token_text(t.next_id))) if t.next_id is not None else ""
        cells = "".join(_html_cell(result, t, layer) for layer in range(depth))
        rows.append(
            f"<tr><th>{t.position}</th><th>{html.escape(show_token(result.token_text(t.input_id)))}</th>"
            f"<th>{nxt}</th>{cells}</tr>"
        )
    return (
        f"<div class='{LENS_CLASS}'>{_html_key(result)}<div class='scroll'><table>{_html_header(depth)}"
        f"<tbody>{''.join(rows)}</tbody></table></div></div>"
    )


def image_count(result: LensResult) -> int:
    """How many PNGs the grid takes: one per POSITIONS_PER_IMAGE positions."""
    return max(1, -(-len(result.trajectories) // POSITIONS_PER_IMAGE))


def image_path(path: str | Path, part: int) -> Path:
    """The file of part `part` (0-based): `path` itself, then lens_2.png, lens_3.png, ..."""
    path = Path(path)
    return path if part == 0 else path.with_name(f"{path.stem}_{part + 1}{path.suffix}")


def lens_figure(result: LensResult, part: int = 0) -> Figure:
    """Part `part` (0-based) of the grid: rows = its positions, columns = layers 0..L (labelled
    above and below), cells = the top-1 token with its probability in small print below it."""
    rows = result.trajectories[part * POSITIONS_PER_IMAGE : (part + 1) * POSITIONS_PER_IMAGE]
    n_pos, n_depth = len(rows), result.num_layers + 1
    fig = new_figure(1.4 + 0.9 * n_depth, 1.3 + 0.42 * n_pos)
    ax = fig.add_subplot()
    ax.set_xlim(-0.5, n_depth - 0.5)
    ax.set_ylim(n_pos - 0.5, -0.5)
    for row, t in enumerate(rows):
        for layer, (token, probability) in enumerate(zip(t.top1, (p[0] for p in t.top_probs), strict=True)):
            kind = token_kind(t, token)
            if kind is not None:
                colour = INPUT_COLOUR if kind == "input" else NEXT_COLOUR
                ax.add_patch(Rectangle((layer - 0.5, row - 0.5), 1, 1, facecolor=colour, edgecolor="none"))
            text = figure_token(result.token_text(token), limit=10, monospace=True)
            ax.text(layer, row - 0.1, text, ha="center", va="center", fontsize=7, family="monospace")
            ax.text(layer, row + 0.25, probability_text(probability), ha="center", va="center", fontsize=5.5)
    ax.set_xticks(range(n_depth))
    ax.tick_params(axis="x", top=True, labeltop=True)
    ax.xaxis.set_label_position("top")
    ax.set_xlabel(LAYER_HEADER)
    ax.set_yticks(range(n_pos))
    ax.set_yticklabels(
        [
            f"{t.position} {figure_token(result.token_text(t.input_id), limit=10, monospace=True)}"
            for t in rows
        ],
        fontsize=7,
        family="monospace",
    )
    ax.set_ylabel("position and input token")
    span = f"positions {rows[0].position}–{rows[-1].position}" if rows else "no positions"
    ax.set_title(
        f"{result.model}: top-1 {result.decoder} decoding and its probability, "
        f"{span} (part {part + 1} of {image_count(result)})\n"
        f"blue = input token {INPUT_TOKEN}, green = next token {NEXT_TOKEN}",
        fontsize=9,
    )
    return fig


def plot_lens(result: LensResult, path: str | Path) -> list[Path]:
    """The grid as PNGs of at most POSITIONS_PER_IMAGE positions each: `path` (e.g. lens.png)
    holds the first, lens_2.png the next, and so on; returns the paths written."""
    return [
        save_figure(lens_figure(result, part), image_path(path, part)) for part in range(image_count(result))
    ]


def lens_frame(result: LensResult) -> pandas.DataFrame:
    """`result` as a long-format frame (`LENS_COLUMNS`, documented by `LensResult`): one row per
    position, layer and top-k decoding."""
    integers = ("input_rank", "next_rank")
    floats = ("probability", "input_probability", "next_probability")
    return long_frame(LENS_COLUMNS, list(_frame_rows(result)), integers=integers, floats=floats)


def _frame_rows(result: LensResult) -> Iterator[tuple[Any, ...]]:
    """The frame's rows, position by position, layer by layer, best decoding first."""
    for t in result.trajectories:
        following = None if t.next_id is None else result.token_text(t.next_id)
        for layer, ids in enumerate(t.top_ids):
            targets = (
                _at(t.input_ranks, layer),
                _at(t.input_probs, layer),
                _at(t.next_ranks, layer),
                _at(t.next_probs, layer),
            )
            probabilities = t.top_probs[layer] if layer < len(t.top_probs) else ()
            for rank, token in enumerate(ids):
                probability = _at(probabilities, rank)
                yield (
                    t.position,
                    result.token_text(t.input_id),
                    following,
                    layer,
                    rank,
                    token,
                    result.token_text(token),
                    probability,
                    *targets,
                )


def _at(values: Sequence[Any] | None, index: int) -> Any:
    """values[index], or None where `values` is missing or too short."""
    return values[index] if values is not None and index < len(values) else None


def lens_view(result: LensResult) -> NotebookView:
    """What a `LensResult` shows in a notebook: the table of lens.html (with its style) and the
    grid of lens.png (every part of a long text)."""
    table = Table(
        "top-1 decoding of each position and layer (lens.html)",
        f"<style>{TABLE_STYLE}</style>{lens_table_html(result)}",
    )
    pictures = [
        Picture(lens_figure(result, part), f"{result.model}: top-1 decodings, part {part + 1} (lens.png)")
        for part in range(image_count(result))
    ]
    return NotebookView(tables=[table], pictures=pictures)


register_result(LensResult, lens_frame, lens_view)
