"""What a result's notebook display and DataFrame cost, beside the analysis that made it.

Runs each analysis of the Python API once on the built-in reference model (small samples), then
times `_repr_html_()` (the command's tables and figures drawn again and embedded) and
`to_pandas()` on its result, and prints each as a ratio to the analysis's own time, measured in
the same run (absolute times on a shared machine are noise; the ratios say whether displaying a
result is cheap next to computing it).

    OMP_NUM_THREADS=2 python benchmarks/bench_display.py
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import resstream
from harness import timed

TEXT = "The king said that the queen"

#: name → the analysis, each on the reference model with a small sample.
ANALYSES: dict[str, Callable[[], Any]] = {
    "shift (16 windows)": lambda: resstream.shift("reference", num_seqs=16),
    "lens": lambda: resstream.lens(TEXT),
    "attribute": lambda: resstream.attribute(TEXT),
    "decompose": lambda: resstream.decompose(TEXT),
    "neurons (layer 4)": lambda: resstream.neurons(layer=4, top=4, num_seqs=16),
    "composition": lambda: resstream.composition(samples=64),
    "recency (16 windows)": lambda: resstream.recency("reference", num_seqs=16),
    "simulate (grid, 20k)": lambda: resstream.simulate(grid=True, simulations=20_000),
}


def main() -> None:
    """Print one Markdown row per analysis: its time, then display and frame as ratios to it."""
    resstream.shift("reference", num_seqs=1)  # load the model and corpus once, outside the timings
    print("| result | analysis | `_repr_html_` / analysis | `to_pandas` / analysis | HTML size |")
    print("| --- | --- | --- | --- | --- |")
    for name, analysis in ANALYSES.items():
        analysed, result = timed(analysis)
        shown, html = timed(result._repr_html_)
        framed, _ = timed(result.to_pandas)
        print(
            f"| {name} | {analysed:.2f} s | {shown / analysed:.2f} | {framed / analysed:.3f} "
            f"| {len(html) / 1e3:,.0f} kB |"
        )


if __name__ == "__main__":
    main()
