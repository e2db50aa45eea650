"""The misalignment table: final-layer metrics of trained variants, mean ± std over seeds."""

from __future__ import annotations

import math

import pytest

from resstream.reporting.misalignment import (
    FORMAT,
    METRICS,
    TaggedShift,
    misalignment_csv,
    misalignment_markdown,
    misalignment_table,
    variant_order,
)


def entry(in_match: float, out_match: float, shift_layer: float | None) -> dict:
    """A shift.json model entry of a 2-layer model (layers 0..2); only layer 2 should be read."""
    return {
        "in_match": [0.9, 0.5, in_match],
        "out_match": [0.0, 0.2, out_match],
        "cos_in": [1.0, 0.5, in_match / 2],
        "cos_out": [0.0, 0.1, out_match / 2],
        "projection": [0.0, 0.3, out_match - in_match],
        "shift_layer": shift_layer,
    }


RUNS = [
    TaggedShift(0, "learned", "seed-0/learned", entry(0.10, 0.40, 1.5)),
    TaggedShift(0, "baseline", "seed-0/baseline", entry(0.30, 0.20, None)),
    TaggedShift(1, "baseline", "seed-1/baseline", entry(0.50, 0.30, 1.0)),
    TaggedShift(1, "learned", "seed-1/learned", entry(0.20, 0.50, 0.5)),
    TaggedShift(0, "fixed-k1", "seed-0/fixed-k1", entry(0.25, 0.25, 2.0)),
]


def test_final_layer_values_and_seed_statistics_by_hand():
    table = misalignment_table(RUNS, dataset="wikitext-2", top_k=5)
    assert table["format"] == FORMAT and table["dataset"] == "wikitext-2" and table["top_k"] == 5
    assert [v["variant"] for v in table["variants"]] == ["baseline", "fixed-k1", "learned"]
    baseline = table["variants"][0]
    assert baseline["n"] == 2 and baseline["seeds"] == [0, 1]
    assert baseline["final_in_match"]["values"] == [0.30, 0.50]
    assert baseline["final_in_match"]["mean"] == pytest.approx(0.40)
    assert baseline["final_in_match"]["std"] == pytest.approx(math.sqrt(0.02))  # ddof = 1
    assert baseline["final_projection"]["mean"] == pytest.approx(((0.20 - 0.30) + (0.30 - 0.50)) / 2)
    # a seed that never shifted has no shift layer: one value, no spread
    assert baseline["shift_layer"] == {"mean": 1.0, "std": None, "n": 1, "values": [1.0]}
    learned = table["variants"][2]
    assert learned["final_out_match"]["mean"] == pytest.approx(0.45)
    assert learned["final_cos_in"]["values"] == [0.05, 0.10]
    fixed = table["variants"][1]
    assert fixed["n"] == 1 and fixed["final_in_match"]["std"] is None
    assert len(table["runs"]) == 5 and table["runs"][1]["shift_layer"] is None


def test_a_variant_that_never_shifted_has_an_empty_shift_layer():
    runs = [TaggedShift(s, "baseline", f"seed-{s}/baseline", entry(0.3, 0.1, None)) for s in (0, 1)]
    table = misalignment_table(runs)
    assert table["variants"][0]["shift_layer"] == {"mean": None, "std": None, "n": 0, "values": []}
    assert "| baseline | 2 |" in misalignment_markdown(table) and "never" in misalignment_markdown(table)


def test_csv_has_one_row_per_variant_with_mean_and_std():
    lines = misalignment_csv(misalignment_table(RUNS)).splitlines()
    assert lines[0] == ",".join(["variant", "n", *METRICS])
    assert lines[1].startswith("baseline,2,0.400 ± 0.141,")
    assert lines[2].startswith("fixed-k1,1,0.250,")


def test_variants_are_ordered_baseline_cuts_by_layer_learned():
    names = ["learned", "fixed-k10", "router", "fixed-k2", "baseline", "fixed-k2"]
    assert variant_order(names) == ["baseline", "fixed-k2", "fixed-k10", "learned", "router"]
