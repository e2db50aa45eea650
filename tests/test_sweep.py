"""Sweeps: the runs they train, same-seed data order, restart, sweep.json, gate history, evals,
and reading a finished sweep back."""

from __future__ import annotations

import json
import shutil

import pytest

from resstream.errors import UsageError
from resstream.training import sweep as sw
from resstream.training.config import build_config
from resstream.training.metrics import iter_metrics
from resstream.training.records import find_runs, load_runs

BENCHMARKS = ("openwebtext", "lambada")


def corpus_text() -> str:
    """A small, repetitive English text: enough tokens for 16-token windows."""
    words = [
        "a",
        "small",
        "river",
        "runs",
        "past",
        "the",
        "old",
        "mill",
        "where",
        "two",
        "millers",
        "grind",
        "corn",
        "every",
        "morning",
        "and",
        "sing",
        "about",
        "the",
        "weather",
        "the",
        "harvest",
        "and",
        "the",
        "price",
        "of",
        "bread",
    ]
    lines = [" ".join(words[(i * 5 + j) % len(words)] for j in range(14)) for i in range(300)]
    return "\n".join(lines) + "\n"


def write_corpus(root):
    path = root / "corpus.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


def write_data_dir(root):
    """A local data directory with tiny openwebtext and lambada files."""
    data = root / "data"
    (data / "openwebtext").mkdir(parents=True)
    (data / "openwebtext" / "openwebtext_first100docs.txt").write_text(corpus_text()[:3000], encoding="utf-8")
    (data / "lambada").mkdir()
    passages = [
        "the miller sings about the weather every morning",
        "two millers grind corn and sing about the price of bread",
        "a small river runs past the old mill",
    ]
    (data / "lambada" / "lambada_test.jsonl").write_text(
        "".join(json.dumps({"text": p}) + "\n" for p in passages), encoding="utf-8"
    )
    return data


def tiny_values(root, **overrides):
    """Flat config values of a seconds-long run on the corpus in `root`."""
    values = dict(
        dataset=str(root / "corpus.txt"),
        n_layer=2,
        n_head=2,
        d_model=16,
        block_size=16,
        bpe_vocab_size=300,
        max_steps=3,
        batch_size=4,
        eval_interval=3,
        eval_batches=1,
        checkpoint_interval=3,
        warmup_steps=1,
        cache_dir=str(root / "cache"),
        threads=1,
        device="cpu",
    )
    values.update(overrides)
    return values


def tiny_config(root, **overrides):
    return build_config(tiny_values(root, **overrides), preset="tiny")


def step_losses(run_dir) -> list[float]:
    return [rec["loss"] for rec in iter_metrics(run_dir) if "loss" in rec]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep, shared by the tests below: 2 seeds, both cut layers, learned gate, evals."""
    root = tmp_path_factory.mktemp("sweep")
    write_corpus(root)
    data = write_data_dir(root)
    plan = sw.plan_sweep(tiny_config(root, max_steps=4, eval_interval=2, data_dir=str(data)), seeds=(0, 1))
    lines: list[str] = []
    result = sw.run_sweep(
        plan, root / "out", benchmarks=BENCHMARKS, max_eval_tokens=200, progress=False, log=lines.append
    )
    return plan, result, root / "out", lines


def test_plan_names_and_configs(tmp_path):
    plan = sw.plan_sweep(tiny_config(tmp_path, n_layer=3, alpha=0.25), seeds=(3, 5), layers=(2, 0))
    assert [(r.seed, r.name) for r in plan.runs] == [
        (3, "baseline"),
        (3, "fixed-k0"),
        (3, "fixed-k2"),
        (3, "learned"),
        (5, "baseline"),
        (5, "fixed-k0"),
        (5, "fixed-k2"),
        (5, "learned"),
    ]
    fixed = plan.runs[2].config.model
    assert (fixed.gate, fixed.cut_layer, fixed.alpha) == ("fixed", 2, 0.25)
    assert plan.runs[0].config.model.gate == "none" and plan.runs[3].config.model.gate == "learned"
    assert {r.config.run.seed for r in plan.runs[:4]} == {3}
    assert plan.runs[1].path(tmp_path) == tmp_path / "seed-3" / "fixed-k0"
    no_learned = sw.plan_sweep(tiny_config(tmp_path), learned=False)
    assert [r.name for r in no_learned.runs] == ["baseline", "fixed-k0", "fixed-k1"]
    assert no_learned.seeds == (0,)


def test_check_layers():
    assert sw.check_layers((2, 0), 3) == (0, 2)
    with pytest.raises(UsageError, match=r"`layers`: 3 is outside \[0, 3\) for 3 layers"):
        sw.check_layers((0, 3), 3)
    with pytest.raises(UsageError, match=r"`layers`: -1 is outside"):
        sw.check_layers((-1,), 3)


def test_run_directories(swept):
    _, result, out, lines = swept
    found = {str(p.parent.relative_to(out)) for p in out.glob("seed-*/*/model.json")}
    assert found == {f"seed-{s}/{n}" for s in (0, 1) for n in ("baseline", "fixed-k0", "fixed-k1", "learned")}
    assert [line.split(":")[0] for line in lines[:2]] == [
        "sweep [1/8] seed 0 baseline",
        "sweep [2/8] seed 0 fixed-k0",
    ]
    # The evaluations' estimate first, then one line per run and benchmark, k of n.
    first = next(i for i, line in enumerate(lines) if line.startswith("evaluat"))
    assert (
        lines[first].startswith("evaluating ")
        and "(8 runs x 2 benchmarks; cached scores not counted)" in (lines[first])
    ), lines[first]
    assert " on cpu (an estimate from timing a few batches of one model, " in lines[first]
    assert lines[first + 1].startswith("evaluate [1/16] seed 0 baseline: openwebtext (")
    assert lines[first + 16].startswith("evaluate [16/16] seed 1 learned: lambada (")
    assert [(r.seed, r.name) for r in result.runs][:4] == [
        (0, "baseline"),
        (0, "fixed-k0"),
        (0, "fixed-k1"),
        (0, "learned"),
    ]


def test_alpha_one_reproduces_the_baseline(tmp_path):
    """Same seed => same initial weights and the same batches; α = 1 changes nothing at all."""
    write_corpus(tmp_path)
    plan = sw.plan_sweep(tiny_config(tmp_path, alpha=1.0), seeds=(0, 1), layers=(1,), learned=False)
    sw.run_sweep(plan, tmp_path / "out", progress=False)
    for seed in (0, 1):
        base = step_losses(tmp_path / "out" / f"seed-{seed}" / "baseline")
        fixed = step_losses(tmp_path / "out" / f"seed-{seed}" / "fixed-k1")
        assert len(base) == 3 and base == fixed  # exact, step by step
    assert (
        step_losses(tmp_path / "out" / "seed-0" / "baseline")[0]
        != step_losses(tmp_path / "out" / "seed-1" / "baseline")[0]
    )


def test_same_seed_same_first_batch_with_cut(swept):
    """With α < 1 the losses differ, but only through the model: step 1 starts from equal
    weights on equal batches, so the first losses are close; a different seed is not."""
    _, _, out, _ = swept
    first = {(s, n): step_losses(out / f"seed-{s}" / n)[0] for s in (0, 1) for n in ("baseline", "fixed-k1")}
    assert first[(0, "baseline")] != first[(1, "baseline")]
    assert abs(first[(0, "baseline")] - first[(0, "fixed-k1")]) < 0.05


def test_sweep_json(swept):
    _, _, out, _ = swept
    data = json.loads((out / "sweep.json").read_text())
    assert data["format"] == "resstream-sweep" and data["n_layer"] == 2 and data["alpha"] == 0.5
    assert data["seeds"] == [0, 1] and data["layers"] == [0, 1] and data["learned"] is True
    assert data["benchmarks"] == list(BENCHMARKS)
    assert "gate" not in data["config"]["model"] and "seed" not in data["config"]["run"]
    assert set(data["runs"]) == {"0", "1"}
    for seed in ("0", "1"):
        runs = data["runs"][seed]
        assert list(runs) == ["baseline", "fixed-k0", "fixed-k1", "learned"]
        assert (runs["baseline"]["gate"], runs["baseline"]["cut_layer"], runs["baseline"]["alpha"]) == (
            "none",
            None,
            None,
        )
        assert (runs["fixed-k1"]["gate"], runs["fixed-k1"]["cut_layer"], runs["fixed-k1"]["alpha"]) == (
            "fixed",
            1,
            0.5,
        )
        assert runs["learned"]["gate"] == "learned"
        for name, run in runs.items():
            meta = json.loads((out / f"seed-{seed}" / name / "model.json").read_text())
            assert run["val_loss"] == meta["val_loss"]
            assert run["dir"] == f"seed-{seed}/{name}"
            saved = json.loads((out / f"seed-{seed}" / name / "eval.json").read_text())
            assert {b["max_tokens"] for b in saved["benchmarks"]} == {200}  # each entry says its own
            by_name = {b["name"]: b for b in saved["benchmarks"]}
            assert set(run["eval"]) == set(BENCHMARKS)
            for bench in BENCHMARKS:
                assert run["eval"][bench]["perplexity"] == by_name[bench]["perplexity"]
            assert run["eval"]["lambada"]["num_examples"] == 3
        gates = [rec["gate"] for rec in iter_metrics(out / f"seed-{seed}" / "learned") if "gate" in rec]
        assert runs["learned"]["gate_p"] == gates[-1]
    assert json.loads((out / "run.json").read_text())["config"]["seeds"] == [0, 1]


def test_gate_history_equals_metrics(swept):
    _, result, out, _ = swept
    for seed in (0, 1):
        run = out / f"seed-{seed}" / "learned"
        records = [rec for rec in iter_metrics(run) if isinstance(rec.get("gate"), list)]
        saved = json.loads((run / "gate_history.json").read_text())
        assert saved == {"steps": [r["step"] for r in records], "p": [r["gate"] for r in records]}
        assert saved["steps"] == [1, 2, 3, 4] and len(saved["p"][0]) == 2
        assert result.gate_histories[seed].to_dict() == saved
        assert saved["p"][-1] != saved["p"][0]  # the gate did learn something


def test_restart_skips_finished_runs(tmp_path, monkeypatch):
    from resstream.training import loop

    write_corpus(tmp_path)
    out = tmp_path / "out"
    plan = sw.plan_sweep(tiny_config(tmp_path, max_steps=4, checkpoint_interval=2), layers=(0,))
    first = sw.run_sweep(plan, out, progress=False)
    weights = {r.name: (out / "seed-0" / r.name / "model.safetensors").stat().st_mtime_ns for r in plan.runs}
    # Interrupt `learned` after its step-2 checkpoint, and lose `fixed-k0` entirely.
    learned = out / "seed-0" / "learned"
    (learned / "model.json").unlink()
    (learned / "model.safetensors").unlink()
    (learned / "checkpoints" / "latest.json").write_text(json.dumps({"step": 2, "dir": "step-0000002"}))
    shutil.rmtree(out / "seed-0" / "fixed-k0")
    calls = []

    class RecordingTrainer(loop.Trainer):
        def __init__(self, config, out_dir, *, resume=False, **kwargs):
            calls.append((out_dir.name, resume))
            super().__init__(config, out_dir, resume=resume, **kwargs)

    monkeypatch.setattr(loop, "Trainer", RecordingTrainer)
    lines: list[str] = []
    second = sw.run_sweep(plan, out, progress=False, log=lines.append)
    assert calls == [("fixed-k0", False), ("learned", True)]
    assert lines[0] == "sweep [1/3] seed 0 baseline: finished earlier, skipped"
    assert (out / "seed-0" / "baseline" / "model.safetensors").stat().st_mtime_ns == weights["baseline"]
    # A resumed run and a retrained run end exactly where the uninterrupted sweep ended.
    assert [r.val_loss for r in second.runs] == [r.val_loss for r in first.runs]
    # A third call has nothing left to do.
    calls.clear()
    sw.run_sweep(plan, out, progress=False)
    assert calls == []


def test_restart_with_another_config_is_refused(tmp_path):
    write_corpus(tmp_path)
    plan = sw.plan_sweep(tiny_config(tmp_path), layers=(0,), learned=False)
    sw.run_sweep(plan, tmp_path / "out", progress=False)
    other = sw.plan_sweep(tiny_config(tmp_path, max_steps=5), layers=(0,), learned=False)
    with pytest.raises(
        UsageError, match=r"seed-0/baseline trained with a different config \(run.max_steps: 3 -> 5\)"
    ):
        sw.check_existing(other, tmp_path / "out")


def test_find_runs_from_sweep_and_seed_dirs(swept):
    _, result, out, _ = swept
    everything = find_runs(out)
    assert len(everything) == 8
    seed1 = find_runs(out / "seed-1")
    assert {(r.seed, r.name) for r in seed1} == {
        (1, n) for n in ("baseline", "fixed-k0", "fixed-k1", "learned")
    }
    assert len(load_runs([out, out / "seed-1"])) == 8  # listed twice, counted once
    lossless = {(r.seed, r.name): r.val_loss for r in result.runs}
    assert {(r.seed, r.name): r.val_loss for r in everything} == lossless
    assert all(set(r.evals) == set(BENCHMARKS) for r in everything)


def test_find_runs_without_sweep_json(swept, tmp_path):
    """An interrupted sweep (no sweep.json yet) is read from its finished run folders."""
    _, result, out, _ = swept
    copy = tmp_path / "copy"
    shutil.copytree(out / "seed-0", copy / "seed-0")
    records = find_runs(copy)
    assert {r.name: (r.gate, r.cut_layer, r.alpha) for r in records} == {
        "baseline": ("none", None, None),
        "fixed-k0": ("fixed", 0, 0.5),
        "fixed-k1": ("fixed", 1, 0.5),
        "learned": ("learned", None, None),
    }
    expected = {r.name: r.val_loss for r in result.runs if r.seed == 0}
    assert {r.name: r.val_loss for r in records} == expected


def test_a_sweep_whose_interrupted_run_is_past_max_steps_is_refused(tmp_path):
    """A run checkpointed at step 46 and a sweep planned to 30 steps: refused before any
    training, naming both steps (a resume would record 30 steps of step 46's weights)."""
    plan = sw.plan_sweep(tiny_config(tmp_path, max_steps=30), seeds=[0], layers=[0], learned=False)
    pointer = plan.runs[1].path(tmp_path / "out") / "checkpoints" / "latest.json"
    pointer.parent.mkdir(parents=True)
    pointer.write_text(json.dumps({"step": 46, "dir": "step-0000046"}))
    with pytest.raises(
        UsageError, match=r"`max_steps` 30 is below step 46 of the checkpoint in `out_dir` '.*fixed-k0'"
    ):
        sw.check_existing(plan, tmp_path / "out")


def test_run_sweep_refuses_bad_evaluation_settings_before_training(tmp_path):
    plan = sw.plan_sweep(tiny_config(tmp_path), seeds=[0], layers=[0], learned=False)
    out = tmp_path / "out"
    with pytest.raises(UsageError, match=r"`max_eval_tokens` must be >= 2, got 1"):
        sw.run_sweep(plan, out, benchmarks=("shakespeare",), max_eval_tokens=1, progress=False)
    with pytest.raises(UsageError, match="unknown benchmark 'nope'"):
        sw.run_sweep(plan, out, benchmarks=("nope",), progress=False)
    assert not out.exists()  # nothing was trained


@pytest.mark.parametrize(
    ("entry", "corpus", "reason"),
    [
        (None, None, "not evaluated before"),
        ({"name": "lambada", "loss": 2.0}, None, "cached without its settings"),  # an older eval.json
        (
            {"max_tokens": 19999, "model_fingerprint": "w1", "fingerprint": "c1"},
            "c1",
            "cached with max_tokens 19999",
        ),
        (
            {"max_tokens": 4000, "model_fingerprint": "w0", "fingerprint": "c1"},
            "c1",
            "cached for other weights",
        ),
        (
            {"max_tokens": 4000, "model_fingerprint": "w1", "fingerprint": "c0"},
            "c1",
            "cached on other benchmark data",
        ),
        ({"max_tokens": 4000, "model_fingerprint": "w1", "fingerprint": "c0"}, None, None),  # data unreadable
        ({"max_tokens": 4000, "model_fingerprint": "w1", "fingerprint": "c1"}, "c1", None),
    ],
)
def test_a_cached_score_is_reused_only_when_it_answers_the_request(entry, corpus, reason):
    assert (
        sw.stale_reason(entry, max_tokens=4000, model_fingerprint="w1", corpus_fingerprint=corpus) == reason
    )


def test_a_cached_score_without_a_cap_does_not_answer_a_capped_request():
    entry = {"max_tokens": None, "model_fingerprint": "w1", "fingerprint": "c1"}
    assert sw.stale_reason(entry, max_tokens=4000, model_fingerprint="w1", corpus_fingerprint="c1") == (
        "cached with max_tokens unset"
    )


# ------------------------------------------------------------------ compare's token cap
def sweep_record(root, **config):
    """A sweep folder whose run.json records `config` (benchmarks, max_eval_tokens)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "run.json").write_text(json.dumps({"config": config}))
    return root


@pytest.mark.parametrize(
    ("given", "recorded", "expected"),
    [
        (None, {"benchmarks": [], "max_eval_tokens": None}, (2000, "default")),  # evaluated nothing
        (None, {}, (2000, "default")),  # no run.json settings at all
        (None, {"benchmarks": ["lambada"], "max_eval_tokens": 300}, (300, "sweep")),
        (None, {"benchmarks": ["lambada"], "max_eval_tokens": None}, (None, "sweep")),  # evaluated in full
        (None, {"benchmarks": [], "max_eval_tokens": 500}, (500, "sweep")),  # set a cap, evaluated nothing
        ("all", {"benchmarks": ["lambada"], "max_eval_tokens": 300}, (None, "given")),
        (40, {"benchmarks": ["lambada"], "max_eval_tokens": 300}, (40, "given")),
    ],
)
def test_compare_takes_the_given_cap_else_the_sweeps_else_its_default(tmp_path, given, recorded, expected):
    from resstream.api.compare import token_cap

    cap = token_cap(given, [sweep_record(tmp_path / "sweep", **recorded)])
    assert (cap.tokens, cap.source) == expected
    assert (cap.line() is None) == (cap.source == "given")


@pytest.mark.parametrize("bad", [1, "many", 2.5, True])
def test_compare_refuses_a_bad_cap_naming_it(tmp_path, bad):
    from resstream.api.compare import token_cap

    with pytest.raises(UsageError, match="`max_eval_tokens` must be "):
        token_cap(bad, [tmp_path])


def test_compare_of_a_sweep_that_evaluated_nothing_is_capped_and_estimated_first(swept, tmp_path, capsys):
    """The default cap (stated in the lines, compare.json and run.json), the estimate before the
    first evaluation, one line per run and benchmark; 'all' scores every token."""
    from resstream.api.compare import compare
    from resstream.cli.main import main

    _, _, out, _ = swept
    sweep = shutil.copytree(out, tmp_path / "sweep", ignore=shutil.ignore_patterns("seed-0"))
    record = json.loads((sweep / "run.json").read_text())
    record["config"].update(benchmarks=[], max_eval_tokens=None)  # as the README's quick sweep
    (sweep / "run.json").write_text(json.dumps(record))
    data = out.parent / "data"
    args = ["compare", str(sweep / "seed-1"), "--benchmarks", "openwebtext", "--data-dir", str(data)]
    assert main([*args, "--out", str(tmp_path / "cmp")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("compare:")]
    assert err[0] == (
        "compare: at most 2,000 tokens per benchmark, the default (the sweeps evaluated no benchmark); "
        "--max-eval-tokens 'all' scores every token"
    ), err
    assert err[1].startswith("compare: evaluating ") and " on cpu (an estimate from timing " in err[1], err
    assert "(4 runs x 1 benchmark; cached scores not counted): about " in err[1], err
    assert err[2].startswith("compare: evaluate [1/4] seed 1 baseline: openwebtext (") and err[5].startswith(
        "compare: evaluate [4/4] seed 1 learned: openwebtext ("
    ), err
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    settings = json.loads((tmp_path / "cmp" / "run.json").read_text())["config"]
    for where in (saved, settings):
        assert (where["max_eval_tokens"], where["max_eval_tokens_from"]) == (2000, "default")
    entries = json.loads((sweep / "seed-1" / "baseline" / "eval.json").read_text())["benchmarks"]
    assert {e["name"]: e["max_tokens"] for e in entries}["openwebtext"] == 2000

    full = compare(sweep / "seed-1", "openwebtext", max_eval_tokens="all", data_dir=data)
    assert (full.max_eval_tokens, full.max_eval_tokens_from) == (None, "given")
    assert full.evaluations.evaluated == {"openwebtext": {"cached with max_tokens 2000": 4}}
