"""Table I of report.html (from lens.json): the decoded top-1 token of every layer at each
position of a text, adjacent layers merged into one column where every position's decoding
agrees; the input token blue, the next token green."""

from __future__ import annotations

from collections.abc import Sequence

from resstream.analysis.shift.lens import LensResult, PositionTrajectory, merge_ranges
from resstream.reporting.lens import INPUT_COLOUR, NEXT_COLOUR, token_kind
from resstream.reporting.report.inputs import Output
from resstream.reporting.report.markup import T_IN, T_NEXT, caption_html, escape
from resstream.reporting.text import show_token

__all__ = ["layer_groups", "lens_section", "lens_table_html"]


def layer_groups(result: LensResult) -> list[tuple[int, int]]:
    """Consecutive layers (first, last) over which every position's top-1 decoding agrees."""
    signatures = [tuple(t.top1[layer] for t in result.trajectories) for layer in range(result.num_layers + 1)]
    ids = {signature: index for index, signature in enumerate(dict.fromkeys(signatures))}
    return [(r.first, r.last) for r in merge_ranges([ids[s] for s in signatures])]


def _group_label(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}–{last}"


def _token_cell(result: LensResult, trajectory: PositionTrajectory, layer: int) -> str:
    token = trajectory.top1[layer]
    colour = {"input": INPUT_COLOUR, "next": NEXT_COLOUR}.get(token_kind(trajectory, token) or "")
    style = f" style='background:{colour}'" if colour else ""
    return f"<td class='token'{style}>{escape(show_token(result.token_text(token)))}</td>"


def lens_table_html(result: LensResult) -> str:
    """Table I: one row per position (input token, next token), one column per group of
    layers whose decodings agree at every position; cells = the top-1 decoding, blue when it
    is the input token, green when it is the next token."""
    groups = layer_groups(result)
    head = "".join(f"<th>{_group_label(first, last)}</th>" for first, last in groups)
    rows = []
    for t in result.trajectories:
        nxt = escape(show_token(result.token_text(t.next_id))) if t.next_id is not None else ""
        cells = "".join(_token_cell(result, t, first) for first, _ in groups)
        current = escape(show_token(result.token_text(t.input_id)))
        rows.append(
            f"<tr><th>{t.position}</th><td class='token'>{current}</td>"
            f"<td class='token'>{nxt}</td>{cells}</tr>"
        )
    return (
        "<div class='scroll'><table><thead>"
        f"<tr><th colspan='3'></th><th colspan='{len(groups)}'>layer (0 = embedding)</th></tr>"
        f"<tr><th>pos</th><th>input</th><th>next</th>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def lens_section(outputs: Sequence[Output]) -> str:
    """Table I of each lens.json: its table and caption, one after another."""
    parts = []
    for output in outputs:
        result = LensResult.from_dict(output.data)
        text = "".join(show_token(result.token_text(t.input_id), spaces=False) for t in result.trajectories)
        how = f" ({result.decoding})" if result.decoding else ""
        caption = caption_html(
            f"Table I ({result.model}).",
            f"What each layer of {escape(result.model)} decodes to at each position of one text, through "
            f"the {escape(result.decoder + how)} decoder: the top-1 token; blue = the input token {T_IN}, "
            f"green = the next token {T_NEXT}; adjacent layers share a column where every position "
            "decodes the same.",
            [
                f"{len(result.trajectories)} positions of the text “{text}”;",
                f"layers 0–{result.num_layers} (0 = embedding).",
            ],
            "probabilities and ranks (lens.json has them), the tokens below the top-1; one text "
            "is an example, not a corpus statistic (Figure 2 is).",
        )
        parts.append(
            f"<h3>{escape(result.model)}</h3>{lens_table_html(result)}<p class='caption'>{caption}</p>"
        )
    return "".join(parts)
