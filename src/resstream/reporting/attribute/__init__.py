"""Render `attribute`'s results: CSV tables, PNG figures, one self-contained HTML page and a
short terminal summary. Nothing here computes model outputs.

One text (`AttributeResult`): layers.csv, heads.csv, sources.csv, neurons.csv (each the rows
of one level of `to_pandas()`), trajectory.csv, query_contributions.csv (one row per share),
linearity.csv (with a linearity check); layers.png (attention and MLP per block: C and
DLA), heads.png (layer × head heatmaps of C and DLA), trajectory.png (the target's
probability and rank at every residual point), linearity.png, neurons.png (top neurons with
their promoted tokens).
A corpus (`CorpusAttribution`): layers.csv, heads.csv, neurons.csv, one row per metric (C,
DLA) with its mean and 95% interval; layers.png with error bars, heads.png of the means,
neurons.png. Both get `attribute.html`, which embeds every figure (data: URIs) and every
table, so it opens without network access.

One module per output:

- `common`: the result types, where files go and their names, a score as a number.
- `frames`: the long-format frames (`to_pandas()`, and every CSV cut from them).
- `tables`: every CSV's frame as a `Table` for the page, and the CSVs (`write_attribute_csvs`).
- `drawing`: what the figures share (title, token labels, error bars, zero line).
- `layers`, `heads`, `trajectory`, `linearity`, `neurons`: one figure each.
- `plots`: which figures a result gets, saved as PNGs (`plot_attribute`).
- `captions`, `page`: attribute.html (`write_attribute_html`).
- `write`: every file at once (`write_attribute_report`).
- `terminal`: the lines printed after a run (`terminal_summary`).
- `notebook`: `to_pandas()` and what a result shows in a notebook (`attribute_view`): the
  page's tables and figures, by the page's renderers.

Every table is a frame of `frames` (`attribute_tables`), so the CSVs, the HTML tables and
`to_pandas()` cannot drift apart. CSVs hold raw token text and floats at
full precision; figures and the page show tokens with visible whitespace (`show_token`).
"""

from resstream.reporting.attribute.common import CORPUS_FILES, SINGLE_FILES, TUNED_FILES
from resstream.reporting.attribute.frames import (
    CORPUS_LEVELS,
    SINGLE_LEVELS,
    attribute_frame,
    attribute_frames,
    corpus_attribution_frame,
)
from resstream.reporting.attribute.heads import heads_figure
from resstream.reporting.attribute.layers import layers_figure
from resstream.reporting.attribute.linearity import linearity_figure
from resstream.reporting.attribute.neurons import neurons_figure
from resstream.reporting.attribute.notebook import attribute_view
from resstream.reporting.attribute.page import write_attribute_html
from resstream.reporting.attribute.plots import attribute_figures, plot_attribute
from resstream.reporting.attribute.tables import Table, attribute_tables, write_attribute_csvs
from resstream.reporting.attribute.terminal import terminal_summary
from resstream.reporting.attribute.trajectory import trajectory_figure
from resstream.reporting.attribute.write import write_attribute_report

__all__ = [
    "CORPUS_FILES",
    "CORPUS_LEVELS",
    "SINGLE_FILES",
    "SINGLE_LEVELS",
    "TUNED_FILES",
    "Table",
    "attribute_figures",
    "attribute_frame",
    "attribute_frames",
    "attribute_tables",
    "attribute_view",
    "corpus_attribution_frame",
    "heads_figure",
    "layers_figure",
    "linearity_figure",
    "neurons_figure",
    "plot_attribute",
    "terminal_summary",
    "trajectory_figure",
    "write_attribute_csvs",
    "write_attribute_html",
    "write_attribute_report",
]
