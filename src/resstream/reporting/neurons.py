"""Render neurons as key -> value memories: a PNG of value tokens, an HTML page, a CSV, lines.

The PNG has one panel per neuron: the tokens its value vector promotes most (green, positive
scores) and suppresses most (red, negative), as horizontal bars labelled with the token text
(a leading space shown as '␣'). The HTML page sets each neuron's top activating contexts (the
activating token highlighted, its coefficient beside it) next to its value tokens, and needs
no network. Nothing here computes model outputs.

In a notebook a `NeuronsResult` shows the same: the page's tables, one per neuron, and the PNG's
panels; `to_pandas()` is the frame neurons.csv is written from (`NEURONS_COLUMNS`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure

from resstream.analysis.memories.neurons import NEURONS_COLUMNS, Context, NeuronReport, NeuronsResult
from resstream.analysis.names import neuron_name
from resstream.io import write_text
from resstream.reporting.figures import figure_token, new_figure, save_figure
from resstream.reporting.notebook import (
    NotebookView,
    Picture,
    Table,
    frame_csv,
    long_frame,
    register_result,
)
from resstream.reporting.text import show_token

if TYPE_CHECKING:
    import pandas

PROMOTED_COLOUR = "#31a354"
SUPPRESSED_COLOUR = "#de2d26"
HIGHLIGHT = "#fdd49e"
PANEL_COLUMNS = 3  # panels per row of neurons.png
LABEL_CHARS = 16  # a token label longer than this is cut with "…"
TITLE_LINE_INCHES = 0.16  # one line of neurons.png's 9-point title

#: What m is, as the figures say it (docs/attribution.md, "Neurons as key → value memories").
COEFFICIENT_NOTE = (
    "the neuron's coefficient m_k, its activation act(x·W_in[:, k] + b_in[k]) (gated MLPs: "
    "act(gate)·up),\nwhich scales its value vector w_k in MLP(x) = Σ_k m_k·w_k + b_out"
)

#: The columns of neurons.csv: those of `NeuronsResult.to_pandas()`.
CSV_COLUMNS = NEURONS_COLUMNS


def _label(text: str) -> str:
    """A token as a plot label in the monospace font (`figure_token`): whitespace visible, cut
    to LABEL_CHARS, characters the font lacks escaped, '$' literal."""
    return figure_token(text, limit=LABEL_CHARS, monospace=True)


def context_text(result: NeuronsResult, context: Context, mark: tuple[str, str] = ("⟦", "⟧")) -> str:
    """The window as running text, the activating token between the `mark` pair."""
    before = "".join(result.token_text(t) for t in context.window[:-1])
    token = result.token_text(context.token_id)
    return show_token(before, spaces=False) + mark[0] + show_token(token, spaces=False) + mark[1]


def neurons_csv(result: NeuronsResult) -> str:
    """neurons.csv: `neurons_frame` as CSV. Token texts keep their spaces; a newline is '↵'
    and other control characters are escapes, so each row is one line (neurons.json has the
    exact texts)."""
    return frame_csv(neurons_frame(result))


def neurons_frame(result: NeuronsResult) -> pandas.DataFrame:
    """`NeuronsResult.to_pandas()`: one row per listed item (`NEURONS_COLUMNS`, documented by
    the class): per neuron its promoted and suppressed tokens (`value` = the value score) and
    its top contexts (`value` = the coefficient m_k, with sequence, position and the window,
    the activating token in ⟦ ⟧); `sequence` and `position` are empty (NA) for tokens."""
    return long_frame(NEURONS_COLUMNS, list(_neuron_rows(result)), integers=("sequence", "position"))


def _neuron_rows(result: NeuronsResult) -> Iterator[list[object]]:
    """The rows of `neurons_frame`: each neuron's promoted, suppressed and context lines."""
    for n in result.neurons:
        for kind, pairs in (("promoted", n.promoted), ("suppressed", n.suppressed)):
            for rank, (token, score) in enumerate(pairs):
                yield [
                    result.layer,
                    n.neuron,
                    kind,
                    rank,
                    token,
                    _cell(result, token),
                    score,
                    None,
                    None,
                    None,
                ]
        for rank, c in enumerate(n.contexts):
            yield [
                result.layer,
                n.neuron,
                "context",
                rank,
                c.token_id,
                _cell(result, c.token_id),
                c.activation,
                c.sequence,
                c.position,
                context_text(result, c),
            ]


def _cell(result: NeuronsResult, token: int) -> str:
    return show_token(result.token_text(token), spaces=False)


def _token_list(result: NeuronsResult, pairs: tuple[tuple[int, float], ...]) -> str:
    """Tokens separated by spaces, each with its whitespace visible ('␣say ↵')."""
    return " ".join(show_token(result.token_text(t)) for t, _ in pairs)


def summary_lines(result: NeuronsResult, tokens: int = 5) -> list[str]:
    """A header and one line per neuron: its largest coefficient, the first `tokens` tokens it
    promotes and suppresses (whitespace visible, as `show_token` shows it), and its top
    context."""
    lines = [
        f"{result.model}: layer {result.layer} of {result.num_layers}, {len(result.neurons)} of "
        f"{result.d_ff} neurons ({result.selection}); {result.num_positions:,} positions"
    ]
    for n in result.neurons:
        promoted = _token_list(result, n.promoted[:tokens])
        suppressed = _token_list(result, n.suppressed[:tokens])
        lines.append(
            f"  {neuron_name(result.layer, n.neuron)}: max m {n.max_activation:.3g}; "
            f"promotes {promoted}; suppresses {suppressed}"
        )
        if n.contexts:
            lines.append(
                f"    top context ({n.contexts[0].activation:.3g}): {context_text(result, n.contexts[0])}"
            )
    return lines


# --------------------------------------------------------------------------- PNG


def _panel(ax, result: NeuronsResult, n: NeuronReport) -> None:
    """Bars of one neuron: promoted tokens on top (largest first), then suppressed ones."""
    rows = list(n.promoted) + list(reversed(n.suppressed))  # the most suppressed at the bottom
    scores = [score for _, score in rows]
    colours = [PROMOTED_COLOUR] * len(n.promoted) + [SUPPRESSED_COLOUR] * len(n.suppressed)
    positions = list(range(len(rows)))
    ax.barh(positions, scores, color=colours, height=0.75)
    ax.set_yticks(positions)
    ax.set_yticklabels([_label(result.token_text(t)) for t, _ in rows], fontsize=7, family="monospace")
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.6)
    ax.axhline(len(n.promoted) - 0.5, color="#999999", linewidth=0.6, linestyle=":")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(f"{neuron_name(result.layer, n.neuron)} (max m = {n.max_activation:.3g})", fontsize=8.5)


def neurons_figure(result: NeuronsResult) -> Figure:
    """neurons.png unsaved: one panel per neuron (module docstring), PANEL_COLUMNS to a row."""
    count = max(1, len(result.neurons))
    columns = min(PANEL_COLUMNS, count)
    rows = math.ceil(count / columns)
    bars = max((len(n.promoted) + len(n.suppressed) for n in result.neurons), default=1)
    title = (
        f"{result.model}, layer {result.layer}: tokens each neuron's value vector promotes (green) "
        f"and suppresses (red)\ndirect effect through the final norm's gain; "
        f"max m = largest coefficient over {result.num_positions:,} positions of {result.dataset}\n"
        f"m = {COEFFICIENT_NOTE}"
    )
    title_inches = TITLE_LINE_INCHES * (title.count("\n") + 1) + 0.45  # and the panels' own titles
    height = (0.17 * bars + 0.9) * rows + 0.5 + title_inches
    fig = new_figure(3.4 * columns + 0.6, height)
    for index, n in enumerate(result.neurons):
        ax = fig.add_subplot(rows, columns, index + 1)
        _panel(ax, result, n)
        if index // columns == rows - 1 or index + columns >= count:
            ax.set_xlabel("value score W_U·(g⊙w_k)", fontsize=7.5)
    # room for the next panel's token labels, and above the panels for the title
    fig.subplots_adjust(wspace=0.6, top=1 - title_inches / height)
    fig.suptitle(title, fontsize=9, y=1 - 0.08 / height)
    return fig


def plot_neurons(result: NeuronsResult, path: str | Path) -> Path:
    """Write neurons.png (`neurons_figure`)."""
    return save_figure(neurons_figure(result), path)


# --------------------------------------------------------------------------- HTML

#: The styles of a neuron's tables, on the page and in a notebook: (selector, declarations).
TABLE_RULES = (
    ("section", "border-top:1px solid #ccc;padding:.4em 0;display:flex;gap:2em;align-items:flex-start"),
    ("table", "border-collapse:collapse"),
    ("td,th", "padding:1px 6px;text-align:left;vertical-align:top"),
    ("td.num", "text-align:right;font-family:monospace"),
    ("td.ctx", "font-family:monospace;white-space:pre-wrap;max-width:60em"),
    ("mark", f"background:{HIGHLIGHT};font-weight:bold"),
    (".tok", "font-family:monospace;white-space:pre"),
    (".up", f"color:{PROMOTED_COLOUR}"),
    (".down", f"color:{SUPPRESSED_COLOUR}"),
    (".note", "color:#555;font-size:90%"),
)

#: The class of the element that holds a neuron's tables in a notebook (its styles apply there only).
NOTEBOOK_SCOPE = "resstream-neurons"


def style_rules(rules: tuple[tuple[str, str], ...], scope: str = "") -> str:
    """CSS text of `rules`, every selector prefixed with `scope` (a notebook's outputs share
    one page, so their styles must not reach beyond their own element)."""
    prefix = f"{scope} " if scope else ""
    return "".join(
        f"{','.join(prefix + part for part in selector.split(','))}{{{declarations}}}"
        for selector, declarations in rules
    )


PAGE_STYLE = "body{font-family:sans-serif;margin:1em 2em}h2{font-size:110%;margin:.2em 0}" + style_rules(
    TABLE_RULES
)


def _contexts_table(result: NeuronsResult, n: NeuronReport) -> str:
    rows = "".join(
        f"<tr><td class='num'>{c.activation:.4g}</td><td class='num'>{c.sequence}:{c.position}</td>"
        f"<td class='ctx'>{_html_context(result, c)}</td></tr>"
        for c in n.contexts
    )
    return (
        "<div><table><thead><tr><th>m</th><th>seq:pos</th><th>context (activating token marked)</th></tr>"
        f"</thead><tbody>{rows}</tbody></table></div>"
    )


def _html_context(result: NeuronsResult, context: Context) -> str:
    before = "".join(result.token_text(t) for t in context.window[:-1])
    token = result.token_text(context.token_id)
    return (
        html.escape(show_token(before, spaces=False))
        + f"<mark>{html.escape(show_token(token, spaces=False))}</mark>"
    )


def _tokens_table(result: NeuronsResult, n: NeuronReport) -> str:
    def cells(pairs, css):
        return [
            f"<td class='tok {css}'>{html.escape(show_token(result.token_text(t)))}</td>"
            f"<td class='num'>{score:+.3f}</td>"
            for t, score in pairs
        ]

    up, down = cells(n.promoted, "up"), cells(n.suppressed, "down")
    rows = "".join(
        f"<tr>{up[i] if i < len(up) else '<td></td><td></td>'}{down[i] if i < len(down) else ''}</tr>"
        for i in range(max(len(up), len(down)))
    )
    return (
        "<div><table><thead><tr><th colspan='2'>promotes</th><th colspan='2'>suppresses</th></tr>"
        f"</thead><tbody>{rows}</tbody></table></div>"
    )


def neuron_section(result: NeuronsResult, n: NeuronReport) -> str:
    """One neuron's tables side by side: its top contexts, then its value tokens."""
    return f"<section>{_contexts_table(result, n)}{_tokens_table(result, n)}</section>"


def neuron_heading(result: NeuronsResult, n: NeuronReport) -> str:
    """The heading of one neuron's tables (plain text): its name, L4.N41, and its largest m."""
    return f"{neuron_name(result.layer, n.neuron)} (max m = {n.max_activation:.4g})"


def page_title(result: NeuronsResult) -> str:
    """The title of neurons.html (plain text)."""
    return f"{result.model}: layer {result.layer} neurons as key → value memories"


def page_note(result: NeuronsResult) -> str:
    """What the tables show: how the neurons were chosen, the contexts and the value rule."""
    return (
        f"<p class='note'>Neurons: {html.escape(result.selection)}. Contexts: the largest coefficients m_k "
        f"over {result.num_positions:,} positions ({html.escape(result.sample)}); each window ends with "
        f"the activating token (the model sees only the tokens up to it). Value tokens: "
        f"{html.escape(result.value_rule)}. ␣ = a space, ↵ = a newline.</p>"
    )


def write_html(result: NeuronsResult, path: str | Path) -> None:
    """neurons.html: per neuron its top contexts (activating token highlighted, coefficient
    m_k beside it) and the tokens its value vector promotes and suppresses; self-contained."""
    sections = "".join(
        f"<h2>{neuron_name(result.layer, n.neuron)} "
        f"<span class='note'>max m = {n.max_activation:.4g}</span></h2>"
        f"{neuron_section(result, n)}"
        for n in result.neurons
    )
    key = f"<h1>{html.escape(page_title(result))}</h1>{page_note(result)}"
    page = (
        "<!doctype html><meta charset='utf-8'><title>resstream neurons</title>"
        f"<style>{PAGE_STYLE}</style>{key}{sections}"
    )
    write_text(path, page)


# --------------------------------------------------------------------------- notebook


def _neurons_view(result: NeuronsResult) -> NotebookView:
    """neurons.html's note and per-neuron tables (styled inside their own element), then
    neurons.png."""
    style = f"<style>{style_rules(TABLE_RULES, '.' + NOTEBOOK_SCOPE)}</style>"

    def scoped(body: str) -> str:
        return f"<div class='{NOTEBOOK_SCOPE}'>{style}{body}</div>"

    tables = [Table(page_title(result), scoped(page_note(result)))]
    tables += [Table(neuron_heading(result, n), scoped(neuron_section(result, n))) for n in result.neurons]
    caption = (
        "neurons.png: the tokens each neuron's value vector promotes (green) and suppresses (red), "
        "by their value score"
    )
    return NotebookView(tables=tables, pictures=[Picture(neurons_figure(result), caption)])


register_result(NeuronsResult, neurons_frame, _neurons_view)

__all__ = [
    "COEFFICIENT_NOTE",
    "CSV_COLUMNS",
    "NOTEBOOK_SCOPE",
    "PAGE_STYLE",
    "TABLE_RULES",
    "context_text",
    "neuron_heading",
    "neuron_section",
    "neurons_csv",
    "neurons_figure",
    "neurons_frame",
    "page_note",
    "page_title",
    "plot_neurons",
    "style_rules",
    "summary_lines",
    "write_html",
]
