"""`benchmarks/bench_peers.py` runs once on a tiny model: every operation times resstream, a peer
that does not import is skipped with its reason (one that does agrees with resstream), random
texts re-encode to their ids, and the logit lens's agreement counts a changed cell as a real
disagreement, not an fp32 near-tie."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_bench_routes import _script

pytestmark = pytest.mark.usefixtures("one_torch_thread", "hf_offline")

TINY = ["--layers", "2", "--d-model", "32", "--heads", "4", "--vocab", "600"]
TINY += ["--seq", "6", "--patch-seq", "3"]


@pytest.fixture(scope="module")
def bench():
    return _script("bench_peers")


@pytest.fixture
def setup(bench, shared_data: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RESSTREAM_DATA", str(shared_data))
    return bench.build_setup(bench.parse_args(TINY))


def test_random_texts_re_encode_to_their_ids(bench, setup):
    for sample in (setup.clean, setup.corrupt, setup.short, setup.short_corrupt):
        assert setup.tokenizer(sample.text)["input_ids"] == sample.ids[0].tolist()
    assert setup.clean.ids.shape == (1, 6) and setup.short.ids.shape == (1, 3)
    assert int(setup.clean.ids.max()) < 600


def test_every_operation_times_resstream_and_the_peers_agree_or_are_skipped(bench, setup, capsys):
    record = bench.measure(setup, list(bench.OPS), list(bench.TOOLS), rounds=1)
    for op in bench.OPS:
        seconds = record["seconds"][op]
        assert len(seconds["resstream"]) == 1 and seconds["resstream"][0] > 0
        assert set(seconds) | set(record["skipped"][op]) == set(bench.TOOLS)
        for reason in record["skipped"][op].values():
            assert "does not import" in reason or "cannot wrap" in reason, reason
        for said in record["agreement"][op].values():
            if op == "lens":
                assert said["differ"] == said["near_ties"], said
            else:
                assert said["max_abs_diff"] < 1e-5, (op, said)
    bench.report(record, {}, list(bench.TOOLS))
    out = capsys.readouterr().out
    assert "| operation | resstream s |" in out and "| lens |" in out


def test_a_changed_lens_cell_is_a_real_disagreement(bench, setup):
    reference = bench.resstream_variant(setup, "lens")()
    assert reference.shape == (3, 6)
    changed = reference.clone()
    changed[1, 2] = (int(reference[1, 2]) + 1) % 600
    said = bench.lens_agreement(setup, reference, changed)
    assert said["cells"] == 18 and said["differ"] == 1 and said["near_ties"] == 0
    assert said["disagree"][0]["cell"] == [1, 2]
    assert bench.lens_agreement(setup, reference, reference)["differ"] == 0
