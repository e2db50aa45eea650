"""Render causal-shift results (`AlignmentResult`s): plots and the per-layer CSV.

Plots: top-k match with the input and the next token against depth (95% CI bands, shift layer
marked); cosine similarities and the input→output projection against depth; the distribution of
per-token shift depths; with several models, one comparison on a relative-depth axis
(layer / L) so models of different depth share an axis; with several decoders (logit lens and
tuned lens), one figure per model with both decoders' match rates and shift layers. Nothing here
computes model outputs.

The same numbers as one long-format frame (`shift_frame`, the `to_pandas()` of a result and
of a `ShiftReport`; shift.csv is its CSV) and, in a notebook, a result's view (`shift_view`):
its values per layer and the figures the command writes (`shift_pictures`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from resstream.analysis.shift.alignment import SHIFT_COLUMNS, SHIFT_METRICS, AlignmentResult
from resstream.reporting.figures import INPUT_TOKEN, NEXT_TOKEN, integer_ticks, new_figure, save_figure
from resstream.reporting.notebook import (
    NotebookView,
    Picture,
    frame_csv,
    frame_table,
    long_frame,
    notebook_view,
    tidy_frame,
)

if TYPE_CHECKING:
    import pandas


def _band(ax: Axes, layers: Sequence[int], ci: Sequence[tuple[float, float]], colour: str) -> None:
    """A shaded 95% band from each layer's (low, high)."""
    low = [lo for lo, _ in ci]
    high = [hi for _, hi in ci]
    ax.fill_between(layers, low, high, color=colour, alpha=0.2, linewidth=0)


def _rate_with_band(
    ax: Axes,
    layers: Sequence[int],
    rates: Sequence[float],
    ci: Sequence[tuple[float, float]],
    style: str,
    colour: str,
    label: str,
) -> None:
    """One match rate against depth (`style`: matplotlib's marker and line) and its 95% band."""
    ax.plot(layers, rates, style, color=colour, label=label)
    _band(ax, layers, ci, colour)


def _layer_axes(ax: Axes, ylabel: str, title: str) -> None:
    """The axes of a per-layer figure: layers on x (whole numbers), `ylabel`, `title`, a grid."""
    ax.set_xlabel("layer (0 = embedding)")
    integer_ticks(ax.xaxis)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def plot_match_rates(result: AlignmentResult, path: str | Path) -> None:
    """in_match and out_match (top-k) against depth, with 95% CI bands and the shift layer."""
    save_figure(match_rates_figure(result), path)


def match_rates_figure(result: AlignmentResult) -> Figure:
    """The figure of `plot_match_rates`, unsaved."""
    fig = new_figure(6.4, 4.0)
    ax = fig.add_subplot()
    layers = list(result.layers)
    _rate_with_band(
        ax,
        layers,
        result.in_match,
        result.in_match_ci,
        "o-",
        "tab:blue",
        f"input token {INPUT_TOKEN} in top-{result.top_k}",
    )
    _rate_with_band(
        ax,
        layers,
        result.out_match,
        result.out_match_ci,
        "s-",
        "tab:green",
        f"next token {NEXT_TOKEN} in top-{result.top_k}",
    )
    ax.plot([], [], color="tab:grey", alpha=0.3, linewidth=6, label="95% CI (over sequences)")
    if result.shift_layer is not None:
        ax.axvline(
            result.shift_layer, color="grey", linestyle=":", label=f"shift layer {result.shift_layer:.2f}"
        )
    ax.set_ylim(-0.02, 1.02)
    _layer_axes(ax, "match rate", f"{result.model}: {result.decoder} decoding, {result.num_tokens:,} tokens")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_similarity(result: AlignmentResult, path: str | Path) -> None:
    """Cosine with the input embedding and the output unembedding, and the projection."""
    save_figure(similarity_figure(result), path)


def similarity_figure(result: AlignmentResult) -> Figure:
    """The figure of `plot_similarity`, unsaved."""
    fig = new_figure(6.4, 4.0)
    ax = fig.add_subplot()
    layers = list(result.layers)
    ax.plot(layers, result.cos_in, "o-", color="tab:blue", label=r"cos($h$, $W_E[t_i]$)")
    ax.plot(layers, result.cos_out, "s-", color="tab:green", label=r"cos($h$, $W_U[t_{i+1}]$)")
    ax.plot(
        layers,
        result.projection,
        "^-",
        color="tab:red",
        label="projection on input→output (0 = input, 1 = output)",
    )
    ax.axhline(0, color="black", linewidth=0.6)
    _layer_axes(ax, "mean over positions", f"{result.model}: similarity to input and output tokens")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_shift_depths(result: AlignmentResult, path: str | Path) -> None:
    """Histogram of the first layer at which each position ranks t_{i+1} above t_i."""
    save_figure(shift_depths_figure(result), path)


def shift_depths_figure(result: AlignmentResult) -> Figure:
    """The figure of `plot_shift_depths`, unsaved."""
    fig = new_figure(6.4, 3.6)
    ax = fig.add_subplot()
    counts = [*result.shift_depths, result.never_shifted]
    labels = [str(layer) for layer in result.layers] + ["never"]
    total = max(1, sum(counts))
    ax.bar(
        range(len(counts)),
        [c / total for c in counts],
        color=["tab:purple"] * (len(counts) - 1) + ["tab:grey"],
    )
    ax.set_xticks(range(len(counts)))
    ax.set_xticklabels(labels)
    ax.set_xlabel(f"per-token shift depth (first layer ranking {NEXT_TOKEN} above {INPUT_TOKEN})")
    ax.set_ylabel("fraction of positions")
    ax.set_title(f"{result.model}: tokens shift at different depths", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


#: Line style of each decoder kind in the decoder comparison.
DECODER_STYLES = {"logit-lens": "-", "tuned": "--", "embedding": ":"}


def result_label(result: AlignmentResult, with_decoder: bool) -> str:
    """How figures and printed lines name a result: the model, and its decoder when a run
    used several."""
    return f"{result.model} ({result.decoder})" if with_decoder else result.model


#: (input token, next token) colours of the first, second, ... decoder in the decoder comparison.
DECODER_COLOURS = (("tab:blue", "tab:green"), ("tab:purple", "tab:olive"), ("tab:cyan", "tab:brown"))


def plot_decoders(results: Sequence[AlignmentResult], path: str | Path) -> None:
    """One model's match rates with the input and the next token against depth under each
    decoder (solid: logit lens, dashed: tuned lens, each decoder its own pair of colours), with
    95% CI bands and each decoder's shift layer marked."""
    save_figure(decoders_figure(results), path)


def decoders_figure(results: Sequence[AlignmentResult]) -> Figure:
    """The figure of `plot_decoders`, unsaved."""
    fig = new_figure(6.8, 5.0)
    ax = fig.add_subplot()
    for index, result in enumerate(results):
        style = DECODER_STYLES.get(result.decoder, "-.")
        colours = DECODER_COLOURS[index % len(DECODER_COLOURS)]
        layers = list(result.layers)
        series = (
            (result.in_match, result.in_match_ci, INPUT_TOKEN, "o"),
            (result.out_match, result.out_match_ci, NEXT_TOKEN, "s"),
        )
        for (rates, ci, token, marker), colour in zip(series, colours, strict=True):
            label = f"{token} in top-{result.top_k}, {result.decoder}"
            ax.plot(layers, rates, style, marker=marker, markersize=3, color=colour, label=label)
            _band(ax, layers, ci, colour)
        if result.shift_layer is not None:
            label = f"shift layer {result.shift_layer:.2f} ({result.decoder})"
            ax.axvline(result.shift_layer, color="grey", linestyle=style, label=label)
    ax.set_ylim(-0.02, 1.02)
    first = results[0]
    title = f"{first.model}: the shift through each decoder, {first.num_tokens:,} tokens"
    _layer_axes(ax, "match rate (95% CI bands over sequences)", title)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=len(results))
    fig.tight_layout()
    return fig


def plot_comparison(results: Sequence[AlignmentResult], path: str | Path) -> None:
    """out_match − in_match of several models against relative depth (layer / L), each with
    a band from its two rates' 95% CIs (conservative: the CI of a difference of two rates
    measured on the same positions is at most the sum of their half-widths)."""
    save_figure(comparison_figure(results), path)


def comparison_figure(results: Sequence[AlignmentResult]) -> Figure:
    """The figure of `plot_comparison`, unsaved."""
    fig = new_figure(6.4, 4.0)
    ax = fig.add_subplot()
    with_decoder = len({r.decoder for r in results}) > 1
    for result in results:
        depth = [layer / result.num_layers for layer in result.layers]
        diff = [o - i for o, i in zip(result.out_match, result.in_match, strict=True)]
        label = f"{result_label(result, with_decoder)} (L={result.num_layers})"
        (line,) = ax.plot(depth, diff, "o-", markersize=3, label=label)
        half = [
            (o_hi - o_lo + i_hi - i_lo) / 2
            for (o_lo, o_hi), (i_lo, i_hi) in zip(result.out_match_ci, result.in_match_ci, strict=True)
        ]
        ax.fill_between(
            depth,
            [d - h for d, h in zip(diff, half, strict=True)],
            [d + h for d, h in zip(diff, half, strict=True)],
            color=line.get_color(),
            alpha=0.15,
            linewidth=0,
        )
    ax.plot(
        [],
        [],
        color="tab:grey",
        alpha=0.3,
        linewidth=6,
        label="≥ 95% CI (conservative: the two rates' half-widths added)",
    )
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xlabel("relative depth (layer / L)")
    ax.set_ylabel(f"out_match − in_match (top-{results[0].top_k})")
    ax.set_title(f"where the causal shift happens: {NEXT_TOKEN} overtakes {INPUT_TOKEN} above 0", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


#: The panels of the similarity comparison: (AlignmentResult field, y label).
SIMILARITY_PANELS = (
    ("cos_in", rf"cos($h$, $W_E$[{INPUT_TOKEN}])"),
    ("cos_out", rf"cos($h$, $W_U$[{NEXT_TOKEN}])"),
    ("projection", "projection (0 = input, 1 = output)"),
)


def similarity_comparison_figure(results: Sequence[AlignmentResult]) -> Figure:
    """Cosine with the input embedding, cosine with the output unembedding and the projection
    of every model against relative depth (layer / L): one panel each, one colour per model,
    so models of different depth share the axis."""
    fig = new_figure(10.5, 3.6)
    axes = fig.subplots(1, len(SIMILARITY_PANELS), sharex=True)
    with_decoder = len({r.decoder for r in results}) > 1
    for ax, (field, label) in zip(axes, SIMILARITY_PANELS, strict=True):
        for index, result in enumerate(results):
            depth = [layer / result.num_layers for layer in result.layers]
            name = f"{result_label(result, with_decoder)} (L={result.num_layers})"
            ax.plot(depth, getattr(result, field), "o-", markersize=3, color=f"C{index % 10}", label=name)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xlabel("relative depth (layer / L)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8)
    fig.suptitle(
        "similarity of the residual state to the input and the next token (mean over positions)", fontsize=10
    )
    fig.tight_layout(rect=(0, 0.06 + 0.05 * ((len(labels) - 1) // 4), 1, 1))
    return fig


def decoder_groups(results: Sequence[AlignmentResult]) -> list[list[AlignmentResult]]:
    """The results of a run with several decoders, one list per model (a report holds one
    result per model and decoder, models first); [] when the run used one decoder."""
    decoders = len(dict.fromkeys(r.decoder for r in results))
    if decoders < 2:
        return []
    return [list(results[i : i + decoders]) for i in range(0, len(results), decoders)]


def shift_frame(results: Sequence[AlignmentResult]) -> pandas.DataFrame:
    """`results` as one long-format frame (`SHIFT_COLUMNS`, documented by `AlignmentResult`):
    per model and decoder, per layer, one row per metric of `SHIFT_METRICS`."""
    rows = [row for result in results for row in _frame_rows(result)]
    return long_frame(SHIFT_COLUMNS, rows, integers=("n",))


def _frame_rows(r: AlignmentResult) -> Iterator[tuple[object, ...]]:
    """The frame's rows of one result, layer by layer."""
    nan = math.nan
    for index, layer in enumerate(r.layers):
        depth = layer / r.num_layers if r.num_layers else 0.0
        share = r.shift_depths[index] / r.num_tokens if r.num_tokens else nan
        values = (
            (r.in_match[index], *r.in_match_ci[index]),
            (r.out_match[index], *r.out_match_ci[index]),
            (r.cos_in[index], nan, nan),
            (r.cos_out[index], nan, nan),
            (r.projection[index], nan, nan),
            (share, nan, nan),
        )
        for metric, (value, low, high) in zip(SHIFT_METRICS, values, strict=True):
            yield (r.model, r.decoder, layer, depth, metric, value, low, high, _count(r, metric))


def _count(r: AlignmentResult, metric: str) -> int | None:
    """The positions `metric`'s value is over (None: a projection count a saved result lacks)."""
    if metric != "projection":
        return r.num_tokens
    return r.num_projection_tokens or None


def shift_csv(results: Sequence[AlignmentResult]) -> str:
    """shift.csv: the CSV of `shift_frame(results)`."""
    return frame_csv(shift_frame(results))


def layer_values(results: Sequence[AlignmentResult]) -> pandas.DataFrame:
    """The values of `shift_frame(results)` with one row per result and layer and one column
    per metric (the intervals stay in the long frame); model and decoder only when they vary."""
    import pandas

    wide = pandas.concat([_one_row_per_layer(result) for result in results], ignore_index=True)
    constant = [column for column in ("model", "decoder") if wide[column].nunique() < 2]
    return wide.drop(columns=constant)


def _one_row_per_layer(result: AlignmentResult) -> pandas.DataFrame:
    """One result's frame pivoted: model, decoder, layer, depth, then the metrics' values."""
    wide = shift_frame([result]).pivot(index=["layer", "depth"], columns="metric", values="value")
    wide = wide.reindex(columns=list(SHIFT_METRICS)).reset_index()
    wide.columns.name = None
    wide.insert(0, "decoder", result.decoder)
    wide.insert(0, "model", result.model)
    return wide


def shift_pictures(results: Sequence[AlignmentResult]) -> list[Picture]:
    """The figures `resstream shift` writes for `results`, in a notebook's order: with several
    results their comparison, with several decoders each model's decoders, then each result's
    match rates, similarity and shift depths."""
    with_decoder = len({r.decoder for r in results}) > 1
    pictures = []
    if len(results) > 1:
        caption = "out_match − in_match of every result against relative depth (comparison.png)"
        pictures.append(Picture(comparison_figure(results), caption))
    for group in decoder_groups(results):
        pictures.append(Picture(decoders_figure(group), f"{group[0].model}: each decoder's match rates"))
    for result in results:
        name = result_label(result, with_decoder)
        pictures += [
            Picture(match_rates_figure(result), f"{name}: top-{result.top_k} match rates by layer"),
            Picture(similarity_figure(result), f"{name}: cosines and projection by layer"),
            Picture(shift_depths_figure(result), f"{name}: where each token shifts"),
        ]
    return pictures


def shift_view(results: Sequence[AlignmentResult]) -> NotebookView:
    """What `results` show in a notebook: their values per layer (`layer_values`) and the
    figures of `shift_pictures`."""
    title = "per layer: top-k match rates, cosines, projection, share of tokens shifting there"
    table = frame_table(title, layer_values(results), shown=60)
    return NotebookView(tables=[table], pictures=shift_pictures(results))


@tidy_frame.register(AlignmentResult)
def _alignment_frame(result: AlignmentResult) -> pandas.DataFrame:
    return shift_frame([result])


@notebook_view.register(AlignmentResult)
def _alignment_view(result: AlignmentResult) -> NotebookView:
    return shift_view([result])
