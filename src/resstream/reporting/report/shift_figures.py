"""Figures 2 and 3 of report.html (from shift.json): top-k match with the input and the next
token by layer with 95% bands, one panel per model and, with several models, their shift on a
relative-depth axis (Figure 2); the cosines and the projection of every model against
relative depth (Figure 3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from resstream.analysis.shift.alignment import AlignmentResult
from resstream.reporting.figures import figure_png
from resstream.reporting.html import figure_html
from resstream.reporting.report.inputs import Output
from resstream.reporting.report.markup import T_IN, T_NEXT, W_E, W_U, caption_html, count_text
from resstream.reporting.shift import (
    comparison_figure,
    match_rates_figure,
    result_label,
    similarity_comparison_figure,
)

__all__ = ["ShiftRun", "match_section", "shift_runs", "similarity_section"]


@dataclass(frozen=True)
class ShiftRun:
    """One model's result in one shift.json, with that file's sample."""

    result: AlignmentResult
    dataset: str
    sample: str


def shift_runs(outputs: Sequence[Output]) -> list[ShiftRun]:
    """Every model's result in the shift.json files, in the order given."""
    runs = []
    for output in outputs:
        for entry in output.data["models"]:
            result = AlignmentResult.from_dict(entry)
            sample = result.sample or output.data.get("sample") or ""
            runs.append(ShiftRun(result, str(output.data.get("dataset", "")), sample))
    return runs


def _shift_scale(run: ShiftRun) -> str:
    r = run.result
    return (
        f"{r.model} (L = {r.num_layers}): {count_text(r.num_tokens)} positions in {r.num_sequences} "
        f"sequences ({run.sample or run.dataset}); top-{r.top_k}, {r.decoder} decoder."
    )


def match_section(runs: Sequence[ShiftRun]) -> str:
    """Figure 2: each model's match rates and, with several models, their shift side by side."""
    parts = []
    with_decoder = len({run.result.decoder for run in runs}) > 1
    for run in runs:
        r = run.result
        name = result_label(r, with_decoder)
        caption = caption_html(
            f"Figure 2 ({name}).",
            f"The fraction of positions whose input token {T_IN} (blue) and next token {T_NEXT} (green) "
            f"are among the top-{r.top_k} decodings of each layer's residual state, with 95% "
            f"confidence bands (cluster intervals over sequences); the dotted line marks the shift "
            f"layer, where the next token first out-ranks the input one (here: {r.shift_text}).",
            [_shift_scale(run)],
            "individual tokens (Table I), how far below the top-k a token ranks, and whether two "
            "models differ significantly (each has its own sample and, possibly, tokenizer).",
        )
        parts.append(figure_html(figure_png(match_rates_figure(r)), f"match rates of {name}", caption))
    if len(runs) > 1:
        parts = [f"<div class='grid'>{''.join(parts)}</div>"]  # side by side where the page is wide
        results = [run.result for run in runs]
        caption = caption_html(
            "Figure 2 (all models).",
            "out_match − in_match against relative depth (layer / L): above 0 the next token is "
            "found more often than the input one; bands add the two rates' 95% half-widths "
            "(conservative).",
            [" ".join(_shift_scale(run) for run in runs)],
            "the rates themselves (the panels above); relative depth aligns models of different "
            "depth but not of different width or training.",
        )
        parts.append(figure_html(figure_png(comparison_figure(results)), "shift of every model", caption))
    return "".join(parts)


def similarity_section(runs: Sequence[ShiftRun]) -> str:
    """Figure 3: every model's cosines and projection against relative depth."""
    results = [run.result for run in runs]
    caption = caption_html(
        "Figure 3.",
        "For every model, against relative depth (layer / L): the cosine of the residual state "
        f"with the input token's embedding {W_E}[{T_IN}] (left) and with the next token's unembedding "
        f"{W_U}[{T_NEXT}] (middle), and its projection on the line from the input embedding (0) to "
        "the output embedding (1) after rescaling it to the input embedding's norm (right); "
        "means over positions.",
        [" ".join(_shift_scale(run) for run in runs)],
        "the spread over positions or any confidence interval (means only); cosines are taken "
        "on the raw state before the final norm, so they are not the decoder's scores.",
    )
    return figure_html(
        figure_png(similarity_comparison_figure(results)), "similarity by relative depth", caption
    )
