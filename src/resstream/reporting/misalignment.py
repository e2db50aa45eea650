"""The misalignment table: how far the trained variants' last layer is still "about" the input.

Input: the `shift` results (shift.json "models" entries) of every trained model of a sweep,
each tagged with its seed and variant (baseline, fixed-k<k>, learned). Per run the table keeps
the final layer's (layer L) metrics and the shift layer; per variant it gives the mean ± sample
standard deviation over seeds (`resstream.reporting.tables.Stat`, the compare table's
convention). It only gathers numbers `shift` computed; it runs no model.

Reading: less misalignment means a final layer that holds the next token rather than the
input one: lower `final_in_match` and `final_cos_in`, higher `final_out_match`,
`final_cos_out` and `final_projection`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resstream.reporting.notebook import frame_csv, long_frame
from resstream.reporting.tables import DIGITS, Stat

FORMAT = "resstream-misalignment/1"
#: (name in the table, key of a shift.json model entry); per-layer keys are read at layer L.
FINAL_LAYER_METRICS: tuple[tuple[str, str], ...] = (
    ("final_in_match", "in_match"),
    ("final_out_match", "out_match"),
    ("final_cos_in", "cos_in"),
    ("final_cos_out", "cos_out"),
    ("final_projection", "projection"),
)
METRICS: tuple[str, ...] = (*(name for name, _ in FINAL_LAYER_METRICS), "shift_layer")
READING = (
    "less misalignment = lower final_in_match and final_cos_in, higher final_out_match, "
    "final_cos_out and final_projection; shift_layer: first depth where the next token "
    "out-ranks the input one (n counts the seeds where it happened)"
)


@dataclass(frozen=True)
class TaggedShift:
    """One trained model's shift.json entry, with the sweep run it belongs to."""

    seed: int
    variant: str
    path: str  # the run directory, relative to the sweep
    entry: Mapping[str, Any]  # a shift.json "models" item


def run_row(run: TaggedShift) -> dict[str, Any]:
    """The final-layer metrics and shift layer of one run."""
    row: dict[str, Any] = {"seed": run.seed, "variant": run.variant, "path": run.path}
    for name, key in FINAL_LAYER_METRICS:
        row[name] = run.entry[key][-1]
    row["shift_layer"] = run.entry["shift_layer"]
    return row


def variant_order(names: Sequence[str]) -> list[str]:
    """baseline, fixed-k<k> by k, learned, then any other name, each once."""

    def key(name: str) -> tuple[int, int, str]:
        if name == "baseline":
            return (0, 0, name)
        if name.startswith("fixed-k") and name[7:].isdigit():
            return (1, int(name[7:]), name)
        if name == "learned":
            return (2, 0, name)
        return (3, 0, name)

    return sorted(dict.fromkeys(names), key=key)


def variant_row(variant: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean ± std over seeds of each metric of one variant (None values are left out: a seed
    whose model never shifted has no shift layer)."""
    mine = [row for row in rows if row["variant"] == variant]
    out: dict[str, Any] = {"variant": variant, "n": len(mine), "seeds": [row["seed"] for row in mine]}
    for name in METRICS:
        values = tuple(row[name] for row in mine if row[name] is not None)
        out[name] = Stat(values).to_dict() if values else {"mean": None, "std": None, "n": 0, "values": []}
    return out


def misalignment_table(runs: Sequence[TaggedShift], **about: Any) -> dict[str, Any]:
    """The content of misalignment.json: `about` (dataset, top_k, decoder, num_sequences,
    seq_len) first, then one row per variant and one per run."""
    rows = [run_row(run) for run in runs]
    variants = variant_order([row["variant"] for row in rows])
    return {
        "format": FORMAT,
        **about,
        "metrics": list(METRICS),
        "reading": READING,
        "variants": [variant_row(v, rows) for v in variants],
        "runs": rows,
    }


def _cell(stat: Mapping[str, Any]) -> str:
    if stat["mean"] is None:
        return ""
    return Stat(tuple(stat["values"])).format(DIGITS)


def misalignment_csv(table: Mapping[str, Any]) -> str:
    """misalignment.csv: one row per variant, each metric as 'mean ± std', and n."""
    header = ["variant", "n", *METRICS]
    rows = [[v["variant"], v["n"], *(_cell(v[name]) for name in METRICS)] for v in table["variants"]]
    return frame_csv(long_frame(header, rows))


def misalignment_markdown(table: Mapping[str, Any]) -> str:
    """The table for a terminal or a Markdown page."""
    header = ["variant", "n", *METRICS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in table["variants"]:
        cells = [v["variant"], str(v["n"]), *(_cell(v[name]) or "never" for name in METRICS)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
