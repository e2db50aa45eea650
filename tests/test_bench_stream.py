"""The stream benchmarks' measurements run once on a tiny model, and what they compare holds.

`benchmarks/bench_trace.py`: the forward, `trace` of one and of several names, one round; trace-1
reads Hugging Face's own hidden state; a peer that does not import is skipped with its reason (one
that does reads the same tensor); a memory child reports one JSON line.
`benchmarks/bench_steer.py`: plain, steered and end-to-end generation make every new token, the
edit changes them and `resstream.generate` makes the steered ones; `directions` against its
forwards on a few texts of the word tokenizer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.test_bench_routes import _script

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ["--layers", "2", "--d-model", "32", "--heads", "4", "--vocab", "300"]


def test_bench_trace_measures_each_variant_and_the_peers_read_the_same_state(capsys):
    bench = _script("bench_trace")
    args = bench.parse_args(
        [*TINY, "--batch", "2", "--seq", "8", "--name", "L1.resid", "--some", "L1.resid,L0.H1,L1.N*,L0.mlp"]
    )
    setup = bench.build_setup(args)
    names = ["forward", "forward-lm", "trace-1", "trace-some", "tl-filter", "nnsight-trunk"]
    record = bench.measure(setup, names, rounds=1)
    timed = set(record["seconds"])
    assert {"forward", "forward-lm", "trace-1", "trace-some"} <= timed
    assert all(len(v) == 1 and v[0] > 0 for v in record["seconds"].values())
    assert timed | set(record["skipped"]) == set(names)
    for peer, reason in record["skipped"].items():
        assert "does not import" in reason or "cannot wrap" in reason, (peer, reason)
    diffs = record["max_abs_diff"]
    assert diffs["hf"] == 0.0  # trace-1 is h_1 exactly as Hugging Face returns it
    assert all(diffs[peer] < 1e-5 for peer in timed & {"tl-filter", "nnsight-trunk"})
    bench.report(record, {})
    out = capsys.readouterr().out
    assert "| trace-1 |" in out and "trace-1 ÷ forward" in out


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's clear_refs")
def test_bench_trace_memory_child_prints_one_reading(capsys, monkeypatch):
    bench = _script("bench_trace")
    monkeypatch.setattr(sys.modules["harness"].gc, "collect", lambda: 0)  # a full collection: ~0.5 s
    flags = [*TINY, "--batch", "1", "--seq", "4", "--name", "L1.resid", "--measure-memory", "trace-1"]
    bench.memory_child(bench.parse_args(flags))
    reading = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert reading["variant"] == "trace-1" and reading["extra_bytes"] >= 0


def test_bench_steer_generates_every_token_and_the_edit_acts():
    bench = _script("bench_steer")
    args = bench.parse_args([*TINY, "--site", "L1.resid"])
    model = bench.build_model(args)
    ids = bench.random_ids(2, 3, args.vocab, seed=1)
    variants = bench.generation_variants(model, ids, 5, True, "L1.resid")
    plain, steered = variants["hf-generate"](), variants["steered"]()
    generated = variants["resstream-generate"]()
    assert plain.shape == steered.shape == (2, 8) and torch.equal(plain[:, :3], ids)
    assert not torch.equal(plain, steered)  # the Add changed the continuation
    assert torch.equal(generated, steered[:, 3:])


def test_bench_steer_directions_runs_against_its_forwards():
    bench = _script("bench_steer")
    found, reason = bench.directions_function()
    if found is None:
        pytest.skip(reason)
    directions, _ = found
    args = bench.parse_args(TINY)
    model = bench.build_model(args)
    ids = bench.random_ids(2 * 6, 5, args.vocab, seed=2)
    assert bench.word_tokenizer(args.vocab)(bench.spelled(ids[:1]))["input_ids"] == ids[:1].tolist()
    variants, warm_ups = bench.directions_variants(model, ids, directions, 4)
    assert variants["forwards"]() == 3  # h_0..h_2
    result = variants["directions"]()
    assert result.to_dict()  # a finished result
    warm_ups["directions"]()
