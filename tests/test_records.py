"""Reading runs back from disk: what is refused as not being a sweep or holding no finished run.

Reading a real sweep back is tested with the sweep that writes it (tests/test_sweep.py).
"""

from __future__ import annotations

import pytest

from resstream.errors import UsageError
from resstream.training.records import find_runs, load_runs


@pytest.mark.parametrize("make", ["missing", "empty", "file", "bad_json"])
def test_find_runs_rejects_non_sweeps(tmp_path, make):
    target = tmp_path / "thing"
    if make == "empty":
        target.mkdir()
    elif make == "file":
        target.write_text("x")
    elif make == "bad_json":
        target.mkdir()
        (target / "sweep.json").write_text('{"format": "something-else"}')
    with pytest.raises(UsageError, match="thing"):
        find_runs(target)


def test_load_runs_with_no_finished_runs(tmp_path):
    (tmp_path / "sweep" / "seed-0" / "baseline").mkdir(parents=True)
    with pytest.raises(UsageError, match="no finished runs found"):
        load_runs([tmp_path / "sweep"])


def test_eval_entries_read_both_layouts_the_same_way() -> None:
    from resstream.training.records import eval_entries, normalise_eval

    listed = {"benchmarks": [{"name": "lambada", "loss": 2.0}, {"loss": 9.0}]}  # no name: skipped
    mapped = {"results": {"lambada": {"loss": 2.0, "name": "ignored"}, "junk": 3}}
    assert eval_entries(listed) == [{"name": "lambada", "loss": 2.0}]
    assert eval_entries(mapped) == [{"name": "lambada", "loss": 2.0}]  # the mapping's key names it
    assert normalise_eval(listed) == normalise_eval(mapped)
    assert normalise_eval(listed)["lambada"]["loss"] == 2.0
    assert eval_entries([1, 2]) == [] and eval_entries({"benchmarks": "x"}) == []
