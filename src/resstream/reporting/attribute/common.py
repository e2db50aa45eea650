"""What every part of `attribute`'s output shares: the two result types it renders, where its
files go and what they are called, and how a score (a number, or a corpus mean with its
`Estimate` interval) and a check residual read as text."""

from __future__ import annotations

import os
from pathlib import Path

from resstream.analysis.attribution.results import AttributeResult, CorpusAttribution
from resstream.rundir import OutputSet
from resstream.simulation.intervals import Estimate

__all__ = [
    "CORPUS_FILES",
    "HTML_FILE",
    "SINGLE_FILES",
    "TUNED_FILES",
    "Directory",
    "Result",
    "output_path",
    "residual_text",
    "score_value",
]

Result = AttributeResult | CorpusAttribution
#: Where files go: a folder, or the `rundir.OutputSet` a command stages its outputs in.
Directory = str | os.PathLike[str] | OutputSet

HTML_FILE = "attribute.html"
#: Every file `write_attribute_report` writes for one text (linearity.* only with a check;
#: with a tuned lens also `TUNED_FILES`).
SINGLE_FILES = (
    "layers.csv",
    "heads.csv",
    "sources.csv",
    "neurons.csv",
    "trajectory.csv",
    "query_contributions.csv",
    "linearity.csv",
    "layers.png",
    "heads.png",
    "trajectory.png",
    "linearity.png",
    "neurons.png",
    HTML_FILE,
)
#: What a tuned lens (`attribute --decoder tuned:DIR`) adds to `SINGLE_FILES`.
TUNED_FILES = ("tuned_trajectory.csv",)
#: Every file `write_attribute_report` writes in corpus mode.
CORPUS_FILES = ("layers.csv", "heads.csv", "neurons.csv", "layers.png", "heads.png", "neurons.png", HTML_FILE)


def output_path(directory: Directory, name: str) -> Path:
    """Where file `name` goes: in the folder, or staged in the output set."""
    return directory / name if isinstance(directory, OutputSet) else Path(directory) / name


def score_value(score: float | Estimate) -> float:
    """The number of a score: itself, or an Estimate's mean."""
    return score.value if isinstance(score, Estimate) else score


def residual_text(value: float) -> str:
    """A check residual (a small number) as the page and the terminal show it."""
    return f"{value:.2g}"
