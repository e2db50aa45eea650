"""Steering rendered: directions read from data (`resstream directions`). Renders only.

directions_auc.png (`directions_figure`): the held-out ROC-AUC of concept detection per layer
(x: h_l, `L{l}.resid`, l = 0..L), one line per method (solid, with markers), its training-split
AUC beside it (dotted, same colour: the gap shows what the held-out split costs each method),
and chance (0.5) dashed grey; the title names the model, the texts, the position rule and the
split. The CSV (`directions_csv`) is `DirectionsResult.to_pandas()`: one row per layer and
method (`DIRECTIONS_COLUMNS`, then ``cos_unembed:<token>`` per chosen token). The terminal
gets `summary_lines`; a notebook the AUC table (layers × methods) and the figure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure

from resstream.analysis.steering.directions import DirectionsResult, site_name
from resstream.reporting.figures import drawable, integer_ticks, new_figure, save_figure
from resstream.reporting.notebook import (
    NotebookView,
    Picture,
    frame_csv,
    frame_table,
    long_frame,
    register_result,
)

if TYPE_CHECKING:
    import pandas

#: The columns of directions.csv before the token cosines (one ``cos_unembed:<token>`` each).
DIRECTIONS_COLUMNS = (
    "layer",
    "site",
    "method",
    "auc",
    "train_auc",
    "norm",
    "cos_diffmean",
    "cos_pca",
    "cos_probe",
)
#: Each method's colour and marker in the figure.
METHOD_STYLES = {"diffmean": ("C0", "o"), "pca": ("C1", "s"), "probe": ("C2", "^")}
#: The names the figure and the table give the methods.
METHOD_LABELS = {"diffmean": "DiffMean", "pca": "PCA of paired differences", "probe": "logistic probe"}


def token_column(token: str) -> str:
    """The CSV column of one chosen token's cosines."""
    return f"cos_unembed:{token}"


def directions_frame(result: DirectionsResult) -> pandas.DataFrame:
    """`DirectionsResult.to_pandas()`: one row per layer and method (layers ascending, methods
    in `result.methods` order): held-out and training AUC, the norm, the cosine to each method's
    direction at that layer (1 to its own) and to each chosen token's unembedding row."""
    columns = [*DIRECTIONS_COLUMNS, *(token_column(token) for token in result.tokens)]
    rows = []
    for j, layer in enumerate(result.layers):
        for m, method in enumerate(result.methods):
            cosines = [float(result.method_cosines[j, m, o]) for o in range(len(result.methods))]
            tokens = [float(result.token_cosines[m, j, t]) for t in range(len(result.tokens))]
            rows.append(
                [
                    layer,
                    site_name(layer),
                    method,
                    float(result.auc[m, j]),
                    float(result.train_auc[m, j]),
                    float(result.norm[m, j]),
                    *cosines,
                    *tokens,
                ]
            )
    floats = [name for name in columns if name not in ("layer", "site", "method")]
    return long_frame(columns, rows, integers=("layer",), floats=floats)


def directions_csv(result: DirectionsResult) -> str:
    """directions.csv: `directions_frame` as CSV."""
    return frame_csv(directions_frame(result))


def auc_frame(result: DirectionsResult) -> pandas.DataFrame:
    """The held-out AUC as a table: one row per layer, one column per method."""
    rows = [
        [layer, site_name(layer), *(float(result.auc[m, j]) for m in range(len(result.methods)))]
        for j, layer in enumerate(result.layers)
    ]
    return long_frame(("layer", "site", *result.methods), rows, integers=("layer",), floats=result.methods)


def directions_figure(result: DirectionsResult) -> Figure:
    """directions_auc.png unsaved (module docstring)."""
    fig = new_figure(8.6, 4.4)
    ax = fig.add_subplot()
    layers = list(result.layers)
    for m, method in enumerate(result.methods):
        colour, marker = METHOD_STYLES.get(method, (f"C{m}", "o"))
        ax.plot(
            layers,
            result.auc[m].tolist(),
            color=colour,
            marker=marker,
            linewidth=1.8,
            label=f"{METHOD_LABELS.get(method, method)} (held out)",
        )
        ax.plot(layers, result.train_auc[m].tolist(), color=colour, linestyle=":", linewidth=1.2, alpha=0.8)
    ax.plot([], [], color="0.3", linestyle=":", linewidth=1.2, label="training split (dotted)")
    ax.axhline(0.5, color="0.6", linestyle="--", linewidth=1.0, label="chance (0.5)")
    low = min(0.45, float(result.auc.min()) - 0.03, float(result.train_auc.min()) - 0.03)
    ax.set_ylim(max(0.0, low), 1.02)
    ax.set_xlim(layers[0] - 0.3, layers[-1] + 0.3)
    integer_ticks(ax.xaxis)
    ax.set_xlabel("layer l (residual state h_l = L{l}.resid; 0: the embedding)")
    ax.set_ylabel("ROC-AUC of concept detection")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    counts = result.split.counts()
    method, layer, auc = result.best()
    ax.set_title(
        f"{_title_text(result.model, 60)}: {_title_text(result.source, 100)}\n"
        f"position {result.position}; {result.n_positive} positive, {result.n_negative} negative texts, "
        f"{counts['test_positive']} + {counts['test_negative']} held out (seed {result.seed}); "
        f"best {METHOD_LABELS.get(method, method)} at {site_name(layer)}: {auc:.3f}",
        fontsize=8.5,
    )
    return fig


def _title_text(text: str, limit: int) -> str:
    """`text` as a title shows it: cut to `limit` characters with "…", characters the font
    lacks escaped, "$" literal (matplotlib would read "$...$" as mathtext)."""
    shown = text if len(text) <= limit else text[: limit - 1] + "…"
    return drawable(shown).replace("$", r"\$")


def plot_directions(result: DirectionsResult, path: str | os.PathLike[str]) -> Path:
    """directions_auc.png: `directions_figure` saved to `path`."""
    return save_figure(directions_figure(result), path)


def summary_lines(result: DirectionsResult) -> list[str]:
    """What `resstream directions` prints: the texts and split, a table of the held-out AUC and
    norm per layer and method, and the best direction."""
    counts = result.split.counts()
    lines = [
        f"{result.model}: h_0..h_{result.layers[-1]}, position {result.position}; "
        f"{result.n_positive} positive, {result.n_negative} negative texts "
        f"({counts['test_positive']} + {counts['test_negative']} held out, seed {result.seed}, "
        f"pairs {result.split.pairing})",
        f"  {result.source}",
        "  held-out ROC-AUC (norm: class-mean separation along the direction)",
        "  site        " + "".join(f"{method:>19}" for method in result.methods),
    ]
    for j, layer in enumerate(result.layers):
        cells = "".join(
            f"{float(result.auc[m, j]):>9.3f} ({float(result.norm[m, j]):>7.3g})"
            for m in range(len(result.methods))
        )
        lines.append(f"  {site_name(layer):<12}{cells}")
    method, layer, auc = result.best()
    lines.append(f"best: {method} at {site_name(layer)}, held-out AUC {auc:.3f}")
    for t, token in enumerate(result.tokens):
        m = result.method_index(method)
        cos = float(result.token_cosines[m, result.layer_index(layer), t])
        lines.append(f"  cosine of that direction to the unembedding of {token!r}: {cos:+.3f}")
    return lines


def _directions_view(result: DirectionsResult) -> NotebookView:
    """The held-out AUC per layer and method, and the figure."""
    return NotebookView(
        tables=[
            frame_table("held-out ROC-AUC of concept detection, per layer and method", auc_frame(result))
        ],
        pictures=[
            Picture(directions_figure(result), "directions_auc.png: held-out ROC-AUC per layer, per method")
        ],
    )


register_result(DirectionsResult, directions_frame, _directions_view)

__all__ = [
    "DIRECTIONS_COLUMNS",
    "METHOD_LABELS",
    "auc_frame",
    "directions_csv",
    "directions_figure",
    "directions_frame",
    "plot_directions",
    "summary_lines",
    "token_column",
]
