"""`resstream ablate` and `resstream patch` end to end, in-process, and their answers to bad input."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from resstream.cli.main import main
from resstream.rundir import result_file
from tests.cli_support import assert_complete_files, assert_nothing_written, expect_usage_error

TEXT = "The king said that the queen"
CORRUPT = "The queen said that the king"  # as many tokens as TEXT
FAST = ["--device", "cpu", "--quiet"]
#: A head, an MLP and a residual state: fast, and one of each kind of restart.
FEW = ["--component", "L0.H1", "--component", "L3.mlp", "--component", "L2.resid@3"]

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


def run(args: list[str], out: Path, capsys) -> tuple[str, str]:
    """Run `resstream ARGS --out OUT`: exit 0; returns (stdout, stderr)."""
    capsys.readouterr()
    code = main([*args, "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out, captured.err


def check_written(out: Path, command: str, components: set[str], paths: tuple[str, ...] = ("total",)) -> dict:
    """The run's files are complete: `<command>.json` with one effect per component along each
    of `paths` (the direct path only with --direct), its page, and run.json listing them;
    returns the result JSON."""
    assert_complete_files(out)
    names = {p.name for p in out.iterdir()}
    assert {f"{command}.json", f"{command}.html", "run.json"} <= names, names
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["command"] == command and set(record["files"]) == names
    report = json.loads((out / f"{command}.json").read_text())
    assert report["target_id"] >= 0 and report["position"] == 5
    assert isinstance(report["clean"]["logprob"], float) and report["clean"]["logprob"] < 0
    effects = report["effects"]
    assert {e["component"] for e in effects} == components
    assert {e["path"] for e in effects} == set(paths) and report["direct"] == ("direct" in paths)
    for path in paths:
        assert {e["component"] for e in effects if e["path"] == path} == components
    for effect in effects:
        assert {"component", "mode", "path", "logprob", "d_logprob", "kl", "rank"} <= set(effect)
        assert effect["d_logprob"] == pytest.approx(effect["logprob"] - report["clean"]["logprob"], abs=1e-5)
    return report


def test_ablate_writes_its_json_page_and_run_record(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ablate"
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT, encoding="utf-8")
    args = ["--text-file", str(text_file), *FEW, "--positions", "3,5", "--batch-size", "3", "--direct"]
    printed, _ = run(["ablate", *FAST, *args], out, capsys)
    report = check_written(out, "ablate", {"L0.H1", "L3.mlp", "L2.resid@3"}, ("total", "direct"))
    assert report["command"] == "ablate" and report["mode"] == "zero" and report["positions"] == [3, 5]
    assert {e["mode"] for e in report["effects"]} == {"zero"}
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["component"] == ["L0.H1", "L3.mlp", "L2.resid@3"]
    assert record["config"]["positions"] == [3, 5] and record["seed"] is None
    assert record["config"]["text_file"] == str(text_file)
    assert record["config"]["batch_size"] == 3  # once lost: the corpus options' None wrote over it
    assert record["config"]["direct"] is True
    assert (
        "wrote ablate.json, " in printed and str(out) in printed and "direct path not computed" not in printed
    )


def test_patch_writes_its_json_page_and_run_record(tmp_path: Path, capsys) -> None:
    out = tmp_path / "patch"
    printed, _ = run(["patch", *FAST, "--text", TEXT, "--corrupt", CORRUPT, *FEW, "--foil", "."], out, capsys)
    report = check_written(out, "patch", {"L0.H1", "L3.mlp", "L2.resid@3"})
    assert report["command"] == "patch" and report["mode"] == "noise" and report["foil"] == "."
    assert report["corrupt"]["logprob"] < 0 and len(report["corrupt_tokens"]) == 6
    assert all(e["d_logit_diff"] is not None for e in report["effects"])
    assert "wrote patch.json, " in printed and "screen.csv" not in printed
    assert json.loads((out / "run.json").read_text())["config"]["direct"] is False
    # the summary says the direct path was not computed, and names the flag that asks for it
    assert "direct path not computed (total path only): --direct measures it too" in printed


@pytest.mark.parametrize("command", ["ablate", "patch"])
def test_direct_adds_the_direct_path(tmp_path: Path, capsys, command: str) -> None:
    out = tmp_path / "out"
    corrupt = ["--corrupt", CORRUPT] if command == "patch" else []
    printed, _ = run(
        [command, *FAST, "--text", TEXT, *corrupt, "--component", "L1.H0", "--direct"], out, capsys
    )
    check_written(out, command, {"L1.H0"}, ("total", "direct"))
    assert json.loads((out / "run.json").read_text())["config"]["direct"] is True
    assert "direct path not computed" not in printed


@pytest.mark.parametrize(
    "args",
    [
        ["ablate", "--text", TEXT, "--component", "L1.H0"],
        ["patch", "--text", TEXT, "--corrupt", CORRUPT, "--component", "L1.H0", "--denoise"],
    ],
)
def test_json_prints_the_result_file_alone(tmp_path: Path, capsys, args: list[str]) -> None:
    out = tmp_path / "out"
    printed, messages = run([*args, *FAST, "--json"], out, capsys)
    assert result_file(out) == out / f"{args[0]}.json"
    assert printed == result_file(out).read_text(encoding="utf-8")
    assert f"wrote {args[0]}.json" in messages and "wrote" not in printed


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (["--component", "L0.X1"], ("--component 'L0.X1'", "emb, L<l>.attn", "L<l>.resid@<p>")),
        (["--component", "L0.H99"], ("head 99", "0..3")),
        (["--component", "L9.mlp"], ("layer 9", "0..5")),
        (["--component", "L0.N99999"], ("neuron 99999", "0..511")),
        (["--component", "L2.resid@9"], ("position 9", "0..5")),
        (["--component", "L0.H1.S5", "--position", "3"], ("--component L0.H1.S5", "0..3")),
        (["--positions", "9"], ("--positions 9", "0..5")),
        (["--positions", "x"], ("--positions 'x'", "integer")),
        (["--position", "6"], ("--position 6", "0..5")),
        (["--target", " queen said"], ("--target", "2 tokens", "one token")),
        (["--top-neurons", "-1"], ("--top-neurons -1", "0 or more")),
        (["--batch-size", "0"], ("--batch-size 0", "1 or more")),
    ],
)
@pytest.mark.parametrize("command", ["ablate", "patch"])
def test_bad_input_of_one_prediction_is_one_line_exit_2(
    tmp_path: Path, capsys, command: str, args: list[str], patterns: tuple[str, ...]
) -> None:
    corrupt = ["--corrupt", CORRUPT] if command == "patch" else []
    expect_usage_error([command, *FAST, "--text", TEXT, *corrupt, *args], tmp_path / "out", capsys, *patterns)


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (["--text", TEXT, "--mode", "foo"], ("mode 'foo'", "zero, mean, resample")),
        (["--dataset", "shakespeare", "--position", "3"], ("--position is for one text",)),
        (["--dataset", "shakespeare", "--target", ","], ("--target is for one text",)),
        (["--dataset", "shakespeare", "--target-id", "3"], ("--target-id is for one text",)),
        (["--dataset", "shakespeare", "--component", "L0.H1"], ("--component applies to ablating",)),
        (["--dataset", "shakespeare", "--positions", "3"], ("--positions applies to ablating",)),
        (["--dataset", "shakespeare", "--foil", "."], ("--foil applies to ablating",)),
        (["--dataset", "shakespeare", "--mode", "mean"], ("--mode applies to ablating",)),
        (["--text", TEXT, "--faithfulness", "--component", "L0.H1"], ("--component applies to ablating",)),
        (["--text", TEXT, "--faithfulness", "--dataset", "shakespeare"], ("--text is for one text",)),
        (["--text", TEXT, "--faithfulness", "--num-seqs", "2"], ("--num-seqs is for a corpus",)),
        (["--text", TEXT, "--faithfulness", "--top-k", "0"], ("--top-k 0", "1 or more")),
        (["--text", TEXT, "--top-k", "3"], ("--top-k applies to faithfulness",)),
        (["--text", TEXT, "--candidates", "3"], ("--candidates applies to faithfulness",)),
        (["--text", TEXT, "--dataset", "shakespeare"], ("--dataset applies to --mode mean or resample",)),
        (["--text", TEXT, "--num-seqs", "4"], ("--num-seqs applies to --mode mean or resample",)),
        (["--text", TEXT, "--data-dir", "."], ("--data-dir applies to --mode mean or resample",)),
        (["--text", TEXT, "--mode", "mean", "--seq-len", "8"], ("--seq-len applies to faithfulness",)),
        ([], ("exactly one of --text or --text-file",)),
    ],
)
def test_bad_input_of_ablate_is_one_line_exit_2(
    tmp_path: Path, capsys, args: list[str], patterns: tuple[str, ...]
) -> None:
    expect_usage_error(["ablate", *FAST, *args], tmp_path / "out", capsys, *patterns)


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (["--corrupt", ""], ("--corrupt is empty",)),
        (["--corrupt", "   "], ("--corrupt is empty",)),
        (["--corrupt", "The queen"], ("6 tokens", "--corrupt is 2 tokens", "--align-end")),
        (["--corrupt", CORRUPT, "--confirm", "3"], ("--confirm applies to attribution patching (--atp)",)),
    ],
)
def test_bad_input_of_patch_is_one_line_exit_2(
    tmp_path: Path, capsys, args: list[str], patterns: tuple[str, ...]
) -> None:
    expect_usage_error(["patch", *FAST, "--text", TEXT, *args], tmp_path / "out", capsys, *patterns)


@pytest.mark.parametrize(
    "args",
    [
        ["--text", TEXT, "--mode", "mean", "--dataset", "wikitext-2"],
        ["--text", TEXT, "--mode", "resample", "--dataset", "wikitext-2", "--num-seqs", "2"],
        ["--dataset", "wikitext-2", "--num-seqs", "2"],  # faithfulness over the corpus
    ],
)
@pytest.mark.usefixtures("no_data_dir")
def test_a_corpus_that_is_not_available_is_refused_before_a_model_loads(
    tmp_path: Path, capsys, monkeypatch, args: list[str]
) -> None:
    """Mean and resample ablation and corpus faithfulness find out that the corpus is missing
    before loading the model (they loaded it first, then failed on the data)."""

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the corpus was found")

    def unreachable(*args, **kwargs):
        raise ConnectionError("the hub is not reachable")

    monkeypatch.setattr("resstream.api.inputs.load_model", no_loading)
    monkeypatch.setattr("resstream.data.sources._hub_rows", unreachable)  # no `datasets` import
    out = tmp_path / "out"
    expect_usage_error(
        ["ablate", *FAST, *args], out, capsys, "dataset 'wikitext-2'", "RESSTREAM_DATA", "not reachable"
    )


def test_patch_without_corrupt_is_refused_and_writes_nothing(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["patch", *FAST, "--text", TEXT, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--corrupt" in err
    assert_nothing_written(out)


def test_align_end_patches_texts_of_different_lengths(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["--corrupt", "the king", "--align-end", "--component", "L5.mlp"]
    run(["patch", *FAST, "--text", TEXT, *args], out, capsys)
    report = json.loads((out / "patch.json").read_text())
    assert len(report["corrupt_tokens"]) == len(report["tokens"]) == 6
    assert report["corrupt_tokens"][:4] == report["tokens"][:4]  # padded with the clean text's own
    assert report["corrupt_tokens"][-2:] == ["the", " king"]


def test_receiver_adds_path_patching_effects(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["--component", "L0.H1", "--receiver", "L3.H0.q", "--receiver", "L4.mlp"]
    run(["patch", *FAST, "--text", TEXT, "--corrupt", CORRUPT, *args], out, capsys)
    report = json.loads((out / "patch.json").read_text())
    assert {"L3.H0.q", "L4.mlp"} <= {e["path"] for e in report["effects"]}
    assert json.loads((out / "run.json").read_text())["config"]["receiver"] == ["L3.H0.q", "L4.mlp"]


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (["--receiver", "L3.H0.x"], ("--receiver 'L3.H0.x'", "is not a receiver name")),
        (["--receiver", "L3.H9.q"], ("--receiver 'L3.H9.q'", "0..3")),
        (["--receiver", "L0.mlp"], ("--receiver L0.mlp", "earlier block")),
        (["--receiver", "L3.mlp", "--atp"], ("--receiver cannot be combined with --atp",)),
    ],
)
def test_bad_receivers_are_one_line_exit_2(
    tmp_path: Path, capsys, args: list[str], patterns: tuple[str, ...]
) -> None:
    base = ["--text", TEXT, "--corrupt", CORRUPT, "--component", "L1.H1"]
    expect_usage_error(["patch", *FAST, *base, *args], tmp_path / "out", capsys, *patterns)


def test_atp_screens_and_confirms_the_top_components(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    run(["patch", *FAST, "--text", TEXT, "--corrupt", CORRUPT, "--atp", "--confirm", "3"], out, capsys)
    report = json.loads((out / "patch.json").read_text())
    confirmed = report["effects"]
    assert 0 < len({e["component"] for e in confirmed}) <= 3 and report["notes"]
    assert all(e["mode"] == "patch" and e["estimate"] is not None for e in confirmed)
    assert json.loads((out / "run.json").read_text())["config"]["confirm"] == 3
    screen = [line.split(",") for line in (out / "screen.csv").read_text(encoding="utf-8").splitlines()[1:]]
    assert {r[0] for r in screen if r[5] == "True"} == {e["component"] for e in confirmed}


def test_atp_confirming_none_writes_the_whole_screen_alone(tmp_path: Path, capsys) -> None:
    """--confirm 0: no exact patching; screen.csv holds every head's and neuron's estimate (as it
    does beside confirmed ones), and the terminal lists the largest."""
    out = tmp_path / "out"
    args = ["--text", TEXT, "--corrupt", CORRUPT, "--atp", "--confirm", "0"]
    printed, _ = run(["patch", *FAST, *args], out, capsys)
    report = json.loads((out / "patch.json").read_text())
    assert report["effects"] == [] and "none confirmed" in report["notes"][0]
    assert len((out / "effects.csv").read_text(encoding="utf-8").splitlines()) == 1  # its header alone
    screen = (out / "screen.csv").read_text(encoding="utf-8").splitlines()
    assert screen[0] == "component,kind,layer,index,estimate,confirmed"
    layers, heads = report["n_layers"], report["n_heads"]
    rows = [line.split(",") for line in screen[1:]]
    assert [r[0] for r in rows[:2]] == ["L0.H0", "L0.H1"] and rows[layers * heads][0] == "L0.N0"
    assert {r[1] for r in rows} == {"head", "neuron"} and {r[5] for r in rows} == {"False"}
    assert len(rows) == layers * heads + layers * len([r for r in rows if r[1] == "neuron" and r[2] == "0"])
    assert "screen.csv" in json.loads((out / "run.json").read_text())["files"]
    assert "the largest first-order estimates of d_logprob" in printed and "screen.csv" in printed


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (["--atp", "--confirm", "-1"], ("--confirm -1", "0 (estimates only) or more")),
        (["--atp", "--direct"], ("--direct cannot be combined with --atp",)),
        (["--confirm", "2"], ("--confirm", "--atp")),
    ],
)
def test_bad_attribution_patching_is_one_line_exit_2(
    tmp_path: Path, capsys, args: list[str], patterns: tuple[str, ...]
) -> None:
    base = ["--text", TEXT, "--corrupt", CORRUPT]
    expect_usage_error(["patch", *FAST, *base, *args], tmp_path / "out", capsys, *patterns)


def test_direct_is_refused_for_faithfulness(tmp_path: Path, capsys) -> None:
    args = ["--text", TEXT, "--faithfulness", "--direct"]
    expect_usage_error(["ablate", *FAST, *args], tmp_path / "out", capsys, "--direct", "faithfulness")


def test_faithfulness_of_one_text_writes_its_report(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["--text", TEXT, "--faithfulness", "--candidates", "4", "--top-k", "3", "--position", "4"]
    printed, _ = run(["ablate", *FAST, *args], out, capsys)
    assert_complete_files(out)
    assert {"ablate.json", "ablate.html", "run.json"} <= {p.name for p in out.iterdir()}
    report = json.loads((out / "ablate.json").read_text())
    assert report["dataset"] is None and report["top_k"] == 3 and report["candidates"] == 4
    assert [p["position"] for p in report["predictions"]] == [4]
    assert {a["level"] for a in report["agreement"]} == {"head", "neuron"}
    record = json.loads((out / "run.json").read_text())["config"]
    assert record["faithfulness"] is True and record["position"] == 4 and record["top_k"] == 3
    assert "Spearman" in printed and "wrote ablate.json, " in printed


def test_the_printed_summary_names_parameters_as_flags(tmp_path: Path, capsys) -> None:
    """A note of the library (faithfulness over too few windows names `num_seqs`) reads as the
    flag on the terminal."""
    from resstream.cli.interventions import Report

    Report((), "note: 7 windows or more (`num_seqs`) give ± 0.92").show(tmp_path, "ablate")
    assert "note: 7 windows or more (--num-seqs) give" in capsys.readouterr().out


@pytest.mark.slow
def test_dataset_without_a_text_checks_faithfulness_over_the_corpus(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The king said that the queen was there, and the prince went home. " * 20)
    out = tmp_path / "out"
    args = ["--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "8", "--candidates", "4", "--json"]
    printed, messages = run(["ablate", *FAST, *args], out, capsys)
    assert printed == (out / "ablate.json").read_text(encoding="utf-8")
    report = json.loads(printed)
    assert report["dataset"] == str(corpus) and report["num_seqs"] == 2 and report["seq_len"] == 8
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["faithfulness"] is True and record["config"]["num_seqs"] == 2
    assert record["config"]["seq_len"] == 8 and record["seed"] == 0
    assert record["dataset_fingerprint"] == report["dataset_fingerprint"] is not None
    assert "wrote ablate.json" in messages


@pytest.mark.parametrize("mode", ["mean", "resample"])
def test_mean_and_resample_read_the_corpus_given(tmp_path: Path, capsys, monkeypatch, mode: str) -> None:
    monkeypatch.setenv("RESSTREAM_CACHE", str(tmp_path / "cache"))  # mean ablation caches its means
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The king said that the queen was there, and the prince went home. " * 20)
    out = tmp_path / "out"
    args = ["--mode", mode, "--dataset", str(corpus), "--num-seqs", "2", "--seed", "3"]
    run(["ablate", *FAST, "--text", TEXT, *args, "--component", "L1.H2"], out, capsys)
    report = json.loads((out / "ablate.json").read_text())
    assert report["mode"] == mode and {e["mode"] for e in report["effects"]} == {mode}
    assert report["samples"] == (2 if mode == "resample" else None)
    record = json.loads((out / "run.json").read_text())
    assert record["seed"] == 3 and record["config"]["dataset"] == str(corpus)
    assert record["config"]["mode"] == mode and record["config"]["num_seqs"] == 2


def option_helps(command: str, capsys) -> dict[str, str]:
    """Per option of `command --help` (one line each on a wide terminal), its whole line."""
    assert main([command, "--help"]) == 0
    lines = [" ".join(line.strip("│ ").split()) for line in capsys.readouterr().out.splitlines()]
    return {line.split()[0]: line for line in lines if line.startswith("--")}


def test_the_defaults_the_help_states_are_the_apis(capsys, monkeypatch) -> None:
    """Rich drops an unescaped [default: …] in help text; each default stated is the one the API uses."""
    import resstream.api.faithfulness as faithfulness
    import resstream.api.interventions as interventions
    from resstream.analysis.interventions.atp import DEFAULT_CONFIRM
    from resstream.analysis.interventions.engine import DEFAULT_BATCH
    from resstream.analysis.interventions.faithfulness import CORPUS_CANDIDATES, TEXT_CANDIDATES, TOP_K

    monkeypatch.setenv("COLUMNS", "400")
    ablate, patch = option_helps("ablate", capsys), option_helps("patch", capsys)
    for option in ("--top-neurons", "--batch-size", "--component", "--positions", "--target"):
        assert ablate[option] == patch[option]  # declared once for both
    assert f"[default: {interventions.TOP_NEURONS}]" in ablate["--top-neurons"]
    assert f"[default: {DEFAULT_BATCH}]" in ablate["--batch-size"]
    assert f"[default: {DEFAULT_CONFIRM}]" in patch["--confirm"]
    assert f"[default: {TOP_K}]" in ablate["--top-k"]
    assert inspect.signature(faithfulness.faithfulness).parameters["top_k"].default == TOP_K
    assert f"[default: {TEXT_CANDIDATES} for one text, {CORPUS_CANDIDATES} per" in ablate["--candidates"]
    mean, resample = interventions.MEAN_WINDOWS, interventions.RESAMPLE_WINDOWS
    assert f"mean [default: {mean}], resampled by resample [default: {resample}]" in ablate["--num-seqs"]
    assert f"faithfulness [default: {faithfulness.DEFAULT_NUM_SEQS}]" in ablate["--num-seqs"]
    assert f"[default: {faithfulness.DEFAULT_SEQ_LEN}]" in ablate["--seq-len"]
    assert "[default: zero]" in ablate["--mode"]
