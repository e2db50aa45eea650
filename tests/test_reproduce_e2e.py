"""`resstream reproduce --scale tiny` end to end: every stage's outputs, reuse of a finished
reproduction, and the sweep stage under torchrun (2 CPU processes, gloo) matching one process.

Needs the real corpora (WikiText-2 and LAMBADA): skipped when `RESSTREAM_DATA` is not set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from resstream.cli.main import main
from resstream.study import STATE_FILE
from resstream.training import checkpoint as ckpt
from tests.training_support import assert_same_training

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get("RESSTREAM_DATA"), reason="needs the real corpora (set RESSTREAM_DATA)"
    ),
    pytest.mark.slow,  # 80 s on two cores: the reproduction's logic is tested fast in test_reproduce.py
]
VARIANTS = ["baseline", "fixed-k0", "fixed-k1", "learned"]
TINY = ["reproduce", "--scale", "tiny", "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def reproduction(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reproduce") / "tiny"
    assert main([*TINY, "--out", str(out)]) == 0
    return out


def read(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_stage_finished_and_wrote_its_outputs(reproduction):
    state = read(reproduction / STATE_FILE)
    assert list(state["stages"]) == ["shift", "sweep", "eval", "compare", "misalignment", "report"]
    assert all(stage["status"] == "done" for stage in state["stages"].values())
    shift = read(reproduction / "shift" / "reference" / "shift.json")
    assert shift["dataset"] == "wikitext-2" and shift["num_seqs"] == 8 and shift["models"][0]["top_k"] == 5
    assert (reproduction / "lens" / "reference" / "lens.json").is_file()
    sweep = read(reproduction / "sweep" / "sweep.json")
    assert sorted(sweep["runs"]) == ["0"]  # one seed: a smoke test, not a result
    reference_eval = read(reproduction / "eval" / "reference" / "eval.json")
    assert [b["name"] for b in reference_eval["benchmarks"]] == ["wikitext-2", "lambada"]
    assert (reproduction / "compare" / "compare.json").is_file()
    table = read(reproduction / "misalignment" / "misalignment.json")
    assert [v["variant"] for v in table["variants"]] == VARIANTS
    assert all(v["n"] == 1 and v["seeds"] == [0] for v in table["variants"])
    html = (reproduction / "report.html").read_text(encoding="utf-8")
    assert "tiny scale" in html
    # what the commands printed went to the stage's log, with the command line before it
    log = (reproduction / "logs" / "shift.log").read_text(encoding="utf-8")
    assert "$ resstream shift --model reference" in log and "shift layer" in log


def test_the_misalignment_table_holds_each_runs_final_layer(reproduction):
    table = read(reproduction / "misalignment" / "misalignment.json")
    seed0 = read(reproduction / "misalignment" / "seed-0" / "shift.json")["models"]
    learned = next(r for r in table["runs"] if r["seed"] == 0 and r["variant"] == "learned")
    assert learned["path"] == "seed-0/learned"
    assert learned["final_in_match"] == seed0[VARIANTS.index("learned")]["in_match"][-1]
    assert learned["final_projection"] == seed0[VARIANTS.index("learned")]["projection"][-1]


def test_a_finished_reproduction_is_reused(reproduction, capsys):
    before = (reproduction / "report.html").stat().st_mtime_ns
    assert main([*TINY, "--out", str(reproduction)]) == 0
    printed = capsys.readouterr()
    assert printed.out.count("reused") == 6, printed.out
    assert (reproduction / "report.html").stat().st_mtime_ns == before


def test_the_sweep_stage_under_torchrun_matches_one_process(reproduction, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "ddp"
    args = ["reproduce", "--scale", "tiny", "--seeds", "0", "--only", "sweep", "--nproc-per-node", "2"]
    assert main([*args, "--device", "cpu", "--quiet", "--out", str(out)]) == 0
    # 20 steps (test_ddp.py checks 3): all but a few noise-driven elements agree to ~1e-7
    for variant in VARIANTS:
        a = ckpt.load_run(out / "sweep" / "seed-0" / variant)
        b = ckpt.load_run(reproduction / "sweep" / "seed-0" / variant)
        assert_same_training(a, b, rtol=1e-5, atol=1e-5, noise_share=0.01)
    assert '"world_size": 2' in (out / "sweep" / "seed-0" / "baseline" / "run.json").read_text()


def test_the_paper_path_tokenises_into_shards_then_trains_on_them(tmp_path):
    """The paper scale's first two stages, on a small stand-in: `tokenize` of the training corpus
    with the GPT-2 tokenizer into a shard store, then the sweep trains on that store."""
    import dataclasses

    from resstream import study
    from resstream.study import engine as pipeline

    corpus = Path(os.environ["RESSTREAM_DATA"]) / "fineweb-edu" / "fineweb-edu_sample-10BT_first1Mchars.txt"
    if not corpus.is_file() or not (corpus.parent.parent / "gpt2-tokenizer").is_dir():
        pytest.skip("needs the FineWeb-Edu sample and the GPT-2 tokenizer files")
    scale = dataclasses.replace(
        study.SCALES["tiny"],
        train_dataset=str(corpus),
        shard_tokenizer="gpt2",
        train_flags=("--tokenizer", "gpt2", "--max-steps", "3", "--layers", "0"),
    )
    plan = study.Plan(scale=scale, out=tmp_path / "paper", models=(), seeds=(0,), device="cpu", quiet=True)
    assert [s.name for s in pipeline.stages_of(plan, study.STAGE_TABLE)][:2] == ["tokens", "shift"]
    pipeline.reproduce(plan, study.STAGE_TABLE, only="tokens", log=lambda line: None)
    manifest = read(tmp_path / "paper" / "tokens" / "manifest.json")
    assert manifest["complete"] and manifest["total_tokens"] > 100_000
    pipeline.reproduce(plan, study.STAGE_TABLE, only="sweep", log=lambda line: None)
    run = read(tmp_path / "paper" / "sweep" / "seed-0" / "baseline" / "run.json")
    assert run["token_store"]["fingerprint"] == run["dataset_fingerprint"]
    assert sorted(read(tmp_path / "paper" / "sweep" / "sweep.json")["runs"]["0"]) == [
        "baseline",
        "fixed-k0",
        "learned",
    ]


def test_the_report_shows_this_plans_models_only(reproduction, tmp_path):
    """A shift folder left by an earlier plan's model is not in the report."""
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(reproduction, out)
    stray = out / "shift" / "stray"
    shutil.copytree(out / "shift" / "reference", stray)
    data = read(stray / "shift.json")
    data["models"][0]["model"] = "stray-model"
    (stray / "shift.json").write_text(json.dumps(data), encoding="utf-8")
    assert main([*TINY, "--only", "report", "--out", str(out)]) == 0
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "stray-model" not in html and "Figure 2 (reference)" in html


def test_misalignment_of_a_seed_without_runs_is_refused(reproduction):
    from resstream import study
    from resstream.errors import UsageError

    plan = study.make_plan("tiny", reproduction, seeds=(0, 5), device="cpu")
    with pytest.raises(UsageError, match="seed 5 has no finished runs in"):
        study.misalignment_steps(plan)
