"""What attribution patching (`patch --atp`) adds to the report of an `InterventionResult`, and
how its whole screen (`AtpScreen`) shows itself; they arrange its numbers and compute nothing new.

* `screen_frame` (`AtpScreen.to_pandas()`, screen.csv written by `write_screen`): every head's
  and every neuron's first-order estimate, `SCREEN_COLUMNS`; `screen_view` its notebook table.
* `estimate_matrix`: the heads' estimates as heads.png draws them; `ATP_CAPTIONS` how to read
  the figures; `largest_estimates` the terminal's lines when nothing was confirmed (`confirm` 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from resstream.analysis.interventions.results import SCREEN_COLUMNS, AtpScreen, InterventionResult
from resstream.analysis.names import head_name, neuron_name
from resstream.io import write_text
from resstream.reporting.attribute.common import Directory, output_path
from resstream.reporting.notebook import NotebookView, Table, frame_csv, frame_html, register_result

if TYPE_CHECKING:
    import pandas

#: Attribution patching's whole screen (`screen_frame`): every head's and neuron's estimate.
SCREEN_FILE = "screen.csv"
#: Rows of a screen's notebook table (the largest |estimate| first).
SCREEN_SHOWN = 20
#: How a name drawn for a component estimated but not confirmed looks, and what it means.
UNCONFIRMED_COLOUR = "#888888"
UNCONFIRMED = "grey: not confirmed (estimated only)"
#: The captions of attribution patching's figures (`patch --atp`), where they differ.
ATP_CAPTIONS = {
    "heads.png": "Attribution patching: the first-order estimate of every head's patching effect from one "
    "forward and one backward (left), beside exact activation patching of the heads whose |estimate| was "
    "among the largest (right; grey: not confirmed, estimated only). Colour: {colours}; each panel has its "
    "own symmetric scale.",
    "neurons.png": "The neurons with the largest |estimate|, largest first: attribution patching's "
    "first-order estimate (light) beside the exact activation-patching effect (dark) of those confirmed; "
    "grey names: not confirmed (estimated only). The change of the headline metric: {colours}.",
}


def estimate_matrix(result: InterventionResult) -> np.ndarray:
    """Layers × heads of attribution patching's estimates; nan where a head has none."""
    matrix = np.full((result.n_layers, result.n_heads), np.nan)
    for screened in result.screened:
        if screened.kind == "head":
            matrix[screened.layer, screened.index] = screened.estimate
    return matrix


def largest_estimates(result: InterventionResult, count: int) -> list[str]:
    """The terminal's lines of the `count` largest |estimate| of attribution patching, for a
    screen nothing was confirmed of (`confirm` 0)."""
    shown = result.screened[:count]  # largest |estimate| first
    width = max([len("component"), *(len(s.component) for s in shown)])
    lines = [f"the largest first-order estimates of d_{result.metric}, of {len(result.screened)} kept:"]
    lines.append(f"  {'component':<{width}}  {'estimate':>10}")
    lines += [f"  {s.component:<{width}}  {s.estimate:>+10.4f}" for s in shown]
    return lines


def screen_frame(screen: AtpScreen) -> pandas.DataFrame:
    """`screen.to_pandas()` and screen.csv: one row per head, then per neuron, layer by layer,
    `SCREEN_COLUMNS` (documented by `AtpScreen`)."""
    import pandas

    n_layers, n_heads = screen.heads.shape
    d_ff = screen.neurons.shape[1]
    heads, neurons = n_layers * n_heads, n_layers * d_ff
    layers = np.concatenate([np.repeat(np.arange(n_layers), n_heads), np.repeat(np.arange(n_layers), d_ff)])
    index = np.concatenate([np.tile(np.arange(n_heads), n_layers), np.tile(np.arange(d_ff), n_layers)])
    names = [head_name(int(layers[row]), int(index[row])) for row in range(heads)]
    names += [neuron_name(int(layers[row]), int(index[row])) for row in range(heads, heads + neurons)]
    confirmed = set(screen.confirmed)
    frame = pandas.DataFrame(
        {
            "component": names,
            "kind": ["head"] * heads + ["neuron"] * neurons,
            "layer": layers,
            "index": index,
            "estimate": np.concatenate([screen.heads.flatten().numpy(), screen.neurons.flatten().numpy()]),
            "confirmed": [name in confirmed for name in names],
        },
        columns=list(SCREEN_COLUMNS),
    )
    return frame.astype({"layer": "Int64", "index": "Int64", "estimate": "float64", "confirmed": bool})


def screen_view(screen: AtpScreen) -> NotebookView:
    """What a whole screen shows in a notebook: its rows with the largest |estimate|."""
    frame = screen_frame(screen)
    order = frame["estimate"].abs().sort_values(ascending=False, kind="stable").index
    top = frame.loc[order[:SCREEN_SHOWN]].reset_index(drop=True)
    title = f"the {SCREEN_SHOWN} largest first-order estimates of d_{screen.metric}, of {len(frame):,}"
    return NotebookView(tables=[Table(title, frame_html(top, SCREEN_SHOWN))])


def write_screen(result: InterventionResult, directory: Directory) -> list[Path]:
    """screen.csv (`screen_frame` of `result.screen`) in `directory`, for attribution patching;
    the paths written (none without a screen)."""
    if result.screen is None:
        return []
    path = output_path(directory, SCREEN_FILE)
    write_text(path, frame_csv(screen_frame(result.screen)))
    return [path]


register_result(AtpScreen, screen_frame, screen_view)

__all__ = [
    "ATP_CAPTIONS",
    "SCREEN_FILE",
    "SCREEN_SHOWN",
    "UNCONFIRMED",
    "UNCONFIRMED_COLOUR",
    "estimate_matrix",
    "largest_estimates",
    "screen_frame",
    "screen_view",
    "write_screen",
]
