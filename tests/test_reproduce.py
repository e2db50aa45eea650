"""`resstream reproduce`'s pipeline engine: stage reuse by fingerprint, resume, `only`, refusals.

The engine is exercised with a small injected stage table (a -> b -> c) whose steps are real
actions writing files, so each rule is checked in milliseconds; tests/test_reproduce_e2e.py
runs the real stages end to end.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from resstream import study
from resstream import study as pl
from resstream.cli.main import main
from resstream.errors import RunError, UsageError
from tests.cli_support import expect_usage_error


class Recorder:
    """Actions that write a file and remember that they ran; one can be made to fail once."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail_once: set[str] = set()

    def action(self, name: str):
        def run(plan: study.Plan) -> None:
            if name in self.fail_once:
                self.fail_once.discard(name)
                raise KeyboardInterrupt
            self.calls.append(name)
            plan.path(f"{name}.txt").write_text(name, encoding="utf-8")

        return run


def table(rec: Recorder, corpus: Path | None = None) -> dict[str, pl.Stage]:
    def steps(*names: str):
        return lambda plan: [pl.Step(n, action=rec.action(n)) for n in names]

    datasets = (lambda plan: (str(corpus),)) if corpus else (lambda plan: ())
    return {
        "a": pl.Stage("a", "first", ("models",), (), datasets, steps("a1")),
        "b": pl.Stage("b", "second", ("seeds",), ("a",), lambda plan: (), steps("b1", "b2")),
        "c": pl.Stage("c", "third", (), ("b",), lambda plan: (), steps("c1")),
    }


def plan_of(scale: str, out, models=()) -> study.Plan:
    """A plan as `make_plan` builds it, without checking that the models exist (these tests
    name models they never load)."""
    chosen = study.SCALES[scale]
    return study.Plan(scale=chosen, out=Path(out), models=tuple(models) or chosen.models, seeds=chosen.seeds)


def run(rec: Recorder, out: Path, *, only=None, models=(), corpus=None, lines=None):
    plan = plan_of("tiny", out, models=models)
    log = lines.append if lines is not None else (lambda line: None)
    return pl.reproduce(plan, table(rec, corpus), only=only, log=log)


def ran(outcomes) -> list[str]:
    return [o.name for o in outcomes if o.ran]


def test_a_finished_reproduction_is_reused_whole(tmp_path):
    rec = Recorder()
    assert ran(run(rec, tmp_path)) == ["a", "b", "c"]
    assert rec.calls == ["a1", "b1", "b2", "c1"]
    lines: list[str] = []
    assert ran(run(rec, tmp_path, lines=lines)) == []
    assert rec.calls == ["a1", "b1", "b2", "c1"]
    assert all("reused" in line for line in lines) and len(lines) == 3
    state = json.loads((tmp_path / pl.STATE_FILE).read_text())
    assert state["format"] == pl.FORMAT and state["scale"] == "tiny"
    assert {name: s["status"] for name, s in state["stages"].items()} == dict.fromkeys("abc", "done")
    assert state["stages"]["b"]["commands"] == ["b1", "b2"]


def test_an_interrupted_reproduction_continues_with_the_step_that_did_not_finish(tmp_path):
    rec = Recorder()
    rec.fail_once.add("b2")
    with pytest.raises(KeyboardInterrupt):
        run(rec, tmp_path)
    state = json.loads((tmp_path / pl.STATE_FILE).read_text())
    assert state["stages"]["b"]["status"] == "running" and state["stages"]["b"]["steps_done"] == ["action:b1"]
    lines: list[str] = []
    assert ran(run(rec, tmp_path, lines=lines)) == ["b", "c"]
    assert rec.calls == ["a1", "b1", "b2", "c1"]  # b1 not again
    assert any("b [1/2] b1: done earlier" in line for line in lines)


def test_only_reruns_one_stage_and_later_stages_see_its_new_result(tmp_path):
    rec = Recorder()
    run(rec, tmp_path)
    assert ran(run(rec, tmp_path, only="b")) == ["b"]
    assert rec.calls[-2:] == ["b1", "b2"]
    # c read b's earlier result: it runs again; a and b are reused
    assert ran(run(rec, tmp_path)) == ["c"]


def test_a_changed_setting_reruns_its_stage_and_everything_after_it(tmp_path):
    rec = Recorder()
    run(rec, tmp_path)
    assert ran(run(rec, tmp_path, models=("other",))) == ["a", "b", "c"]
    assert ran(run(rec, tmp_path, models=("other",))) == []


def test_changed_corpus_content_reruns_the_stage_that_reads_it(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one text\n", encoding="utf-8")
    rec, out = Recorder(), tmp_path / "out"
    run(rec, out, corpus=corpus)
    assert ran(run(rec, out, corpus=corpus)) == []
    corpus.write_text("another text\n", encoding="utf-8")
    assert ran(run(rec, out, corpus=corpus)) == ["a", "b", "c"]


def test_only_refuses_a_stage_whose_inputs_have_not_finished(tmp_path):
    with pytest.raises(UsageError, match=r"stage 'c' needs 'b' finished for these settings in `out`"):
        run(Recorder(), tmp_path / "out", only="c")
    assert not (tmp_path / "out").exists()


def test_a_record_of_another_scale_or_a_corrupt_one_is_refused(tmp_path):
    (tmp_path / pl.STATE_FILE).write_text(json.dumps({"format": pl.FORMAT, "scale": "laptop", "stages": {}}))
    with pytest.raises(UsageError, match="holds a laptop-scale reproduction, not tiny"):
        run(Recorder(), tmp_path)
    (tmp_path / pl.STATE_FILE).write_text("{not json")
    with pytest.raises(UsageError, match="is not a readable reproduction record"):
        run(Recorder(), tmp_path)


def test_fingerprints_ignore_where_the_reproduction_lives(tmp_path):
    state = pl.State("tiny")
    stage = table(Recorder())["a"]
    one = pl.stage_fingerprint(stage, study.make_plan("tiny", tmp_path / "x"), state, {})
    two = pl.stage_fingerprint(stage, study.make_plan("tiny", tmp_path / "y", device="cpu"), state, {})
    assert one == two


def test_the_scales_stages():
    names = lambda scale: [s.name for s in pl.stages_of(plan_of(scale, "x"), study.STAGE_TABLE)]  # noqa: E731
    assert names("laptop") == ["shift", "sweep", "eval", "compare", "misalignment", "report"]
    assert names("paper") == ["tokens", *names("laptop")]


def test_commands_recorded_with_the_directory_as_a_placeholder(tmp_path):
    plan = plan_of("laptop", tmp_path, models=("reference", "org/model"))
    steps = study.shift_steps(plan)
    labels = ["shift reference", "lens reference", "shift org/model", "lens org/model"]
    assert [s.label for s in steps] == labels
    assert steps[2].argv[-2:] == ("--out", "{out}/shift/org--model")
    assert pl.expand(steps[2].argv, tmp_path)[-1] == f"{tmp_path}/shift/org--model"
    sweep = study.sweep_steps(plan)[0]
    assert sweep.distributed and sweep.argv[:5] == ("sweep", "--preset", "laptop", "--max-steps", "800")
    assert "--seeds" in sweep.argv and sweep.argv[sweep.argv.index("--seeds") + 1] == "0,1,2"


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (["--scale", "huge"], ("unknown scale 'huge'", "allowed: tiny, laptop, paper")),
        (["--only", "shfit"], ("unknown stage 'shfit'", "shift")),
        (["--only", "tokens"], ("stage 'tokens' is not part of the laptop scale",)),
        (["--only", "report"], ("stage 'report' needs",)),
        (["--nproc-per-node", "0"], ("--nproc-per-node must be >= 1, got 0",)),
        (["--seeds", "1,x"], ("--seeds: 'x' is not an integer",)),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, patterns):
    expect_usage_error(["reproduce", *args], tmp_path / "out", capsys, *patterns)


def test_the_command_names_a_missing_corpus_before_running_anything(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    empty = tmp_path / "empty"
    empty.mkdir()
    code = main(["reproduce", "--scale", "tiny", "--data-dir", str(empty), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "wikitext-2" in err[-1], err
    assert not (tmp_path / "out").exists()


def test_a_finished_stage_whose_outputs_went_missing_runs_again(tmp_path):
    rec = Recorder()
    stages = table(rec)
    stages["a"] = dataclasses.replace(stages["a"], outputs=lambda plan: [plan.path("a1.txt")])
    plan = plan_of("tiny", tmp_path)
    pl.reproduce(plan, stages, log=lambda line: None)
    (tmp_path / "a1.txt").unlink()
    assert ran(pl.reproduce(plan, stages, log=lambda line: None)) == ["a", "b", "c"]
    assert rec.calls == ["a1", "b1", "b2", "c1", "a1", "b1", "b2", "c1"]


def test_only_refuses_inputs_finished_for_other_settings(tmp_path):
    run(Recorder(), tmp_path)
    with pytest.raises(UsageError, match=r"stage 'b' needs 'a' finished for these settings"):
        run(Recorder(), tmp_path, only="b", models=("other",))


def one_command_stage(argv: tuple[str, ...]) -> dict[str, pl.Stage]:
    step = pl.Step("a real command", argv)
    return {"a": pl.Stage("a", "one command", (), (), lambda plan: (), lambda plan: [step])}


def test_an_interrupted_command_stops_the_reproduction_unfinished(tmp_path, monkeypatch):
    """Typer turns Ctrl-C inside a command into exit code 130: the step must not count as done."""
    import resstream

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(resstream, "shift", interrupted)
    plan = plan_of("tiny", tmp_path)
    stages = one_command_stage(("shift", "--num-seqs", "2", "--out", "{out}/shift"))
    with pytest.raises(KeyboardInterrupt):
        pl.reproduce(plan, stages, log=lambda line: None)
    state = json.loads((tmp_path / pl.STATE_FILE).read_text())
    assert state["stages"]["a"]["status"] == "running" and state["stages"]["a"]["steps_done"] == []


def test_a_command_that_exits_with_an_error_code_stops_the_reproduction(tmp_path, monkeypatch):
    import typer

    import resstream

    def exits(*args, **kwargs):
        raise typer.Exit(3)

    monkeypatch.setattr(resstream, "shift", exits)
    stages = one_command_stage(("shift", "--num-seqs", "2", "--out", "{out}/shift"))
    with pytest.raises(RunError, match=r"`resstream shift` exited with 3; what it printed is in"):
        pl.reproduce(plan_of("tiny", tmp_path), stages, log=lambda line: None)


def test_recorded_commands_can_be_pasted_into_a_shell(tmp_path):
    plan = dataclasses.replace(plan_of("paper", tmp_path), nproc_per_node=8)
    lens = study.shift_steps(plan)[1]
    line = pl.command_line(lens, plan)
    assert line.startswith("resstream lens --model gpt2 --text 'The capital of France is Paris,")
    assert shlex.split(line)[5] == study.LENS_TEXT
    sweep = pl.command_line(study.sweep_steps(plan)[0], plan)
    assert sweep.startswith(
        "torchrun --standalone --nproc_per_node 8 -m resstream.cli.main sweep --preset paper"
    )
    assert "--dataset '{out}/tokens'" in sweep


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--model", "/nonexistent/model"], "'/nonexistent/model' does not exist"),
        (["--device", "bogus"], "bogus"),
    ],
)
def test_a_bad_model_or_device_writes_nothing(tmp_path, capsys, args, pattern):
    expect_usage_error(["reproduce", "--scale", "tiny", *args], tmp_path / "out", capsys, pattern)
