"""CLI conventions: `--json` (the result JSON alone on stdout, messages on stderr) and shell
completion (`--install-completion [SHELL]`, `--show-completion [SHELL]`), in-process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from resstream.cli.completion import shell_optional
from resstream.cli.main import JSON_COMMANDS, app, main
from resstream.errors import RunError
from resstream.rundir import result_file
from tests.cli_support import assert_nothing_written

TEXT = "The king said that the queen was in the garden, and the queen said that the king was not."
FAST = ["--device", "cpu", "--quiet"]
COMMANDS = [info.name for info in app.registered_commands]

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small text corpus (the built-in one takes seconds to tokenise)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join([TEXT] * 8), encoding="utf-8")
    return path


def run_json(args: list[str], out: Path, capsys) -> tuple[str, str]:
    """Run `resstream ARGS --out OUT --json`: exit 0, and stdout holds exactly the result JSON
    the run wrote (its file parsed equals stdout parsed); returns (stdout, stderr)."""
    capsys.readouterr()
    code = main([*args, "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out) == json.loads(result_file(out).read_text(encoding="utf-8"))
    assert captured.out == result_file(out).read_text(encoding="utf-8")  # as written, nothing else
    return captured.out, captured.err


#: Per command, quick arguments on the built-in reference model (--dataset: the small corpus).
QUICK = {
    "shift": [*FAST, "--num-seqs", "2", "--seq-len", "12", "--top-k", "3"],
    "lens": [*FAST, "--text", TEXT, "--positions", "1:3", "--top-k", "2", "--no-colour"],
    "attribute": [*FAST, "--text", TEXT, "--no-sources", "--no-neurons"],
    "routes": [*FAST, "--text", TEXT],
    "recency": [*FAST, "--num-seqs", "2", "--seq-len", "10", "--batch-size", "2"],
    "simulate": ["--quiet", "--sims", "200", "--tokens", "4", "--layers", "2"],
}


@pytest.mark.parametrize("command", QUICK)
def test_json_prints_the_result_file_and_sends_messages_to_stderr(command, corpus, tmp_path, capsys) -> None:
    corpus_args = ["--dataset", str(corpus)] if command in ("shift", "recency") else []
    out = tmp_path / "out"
    printed, messages = run_json([command, *QUICK[command], *corpus_args], out, capsys)
    assert result_file(out) == out / f"{command}.json"
    assert f"wrote {command}.json" in messages and "wrote" not in printed


def test_without_json_the_messages_stay_on_stdout(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = main(["simulate", "--quiet", "--sims", "200", "--tokens", "4", "--layers", "2", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "wrote simulate.json" in captured.out and not captured.out.lstrip().startswith("{")


def test_bad_input_with_json_is_one_line_on_stderr_and_nothing_on_stdout(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = main(["simulate", "--layers", "0", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("resstream: error:")
    assert_nothing_written(out)


@pytest.mark.parametrize("command", COMMANDS)
def test_the_analysis_commands_and_only_they_offer_json(command, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    offered = "Print the result JSON to standard output (messages go to standard error)." in text
    assert offered == (command in JSON_COMMANDS)


def test_json_is_listed_after_quiet(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["shift", "--help"]) == 0
    text = capsys.readouterr().out
    flags = ("--out", "--quiet", "--json", "--model")
    row = {flag: re.search(rf"^\W*{flag}\b", text, re.MULTILINE) for flag in flags}
    assert all(row.values()), row  # each option's own row (--out's help names --json)
    starts = [found.start() for found in row.values() if found]
    assert starts == sorted(starts), row


def test_the_result_file_is_the_one_the_run_record_lists(tmp_path) -> None:
    def record(command: str, files: list[str]) -> Path:
        folder = tmp_path / command
        folder.mkdir()
        (folder / "run.json").write_text(json.dumps({"config": {"command": command}, "files": files}))
        return folder

    assert result_file(record("tune-lens", ["evaluation.json", "lens.json", "run.json"])).name == (
        "evaluation.json"
    )
    assert result_file(record("eval", ["eval.csv", "eval.json", "run.json"])).name == "eval.json"
    with pytest.raises(RunError, match=r"compare run \(compare\.json is not listed\)"):
        result_file(record("compare", ["compare.md", "run.json"]))  # not in this run's set
    with pytest.raises(RunError, match=r"holds no resstream run \(run\.json is missing\)"):
        result_file(tmp_path / "missing")


def test_json_beside_an_option_that_writes_no_result_is_refused_before_anything_is_written(
    tmp_path, capsys
) -> None:
    export = tmp_path / "export"
    args = ["--out", str(tmp_path / "lens"), "--export", "tuned-lens", str(export), "--json"]
    code = main(["tune-lens", *args])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip() == (
        "resstream: error: --json prints a run's result JSON, and --export writes none; leave one out"
    )
    assert not export.exists() and not (tmp_path / "lens").exists()


SIMULATE = ["simulate", "--quiet", "--sims", "200", "--tokens", "4", "--layers", "2"]


def test_json_without_out_prints_the_result_and_leaves_no_folder(tmp_path, capsys, monkeypatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the run's temporary folder goes
    assert main([*SIMULATE, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["label"]  # the result JSON alone
    wrote = "wrote simulate.json, simulate.npz, simulate.png and run.json to a temporary folder"
    assert wrote in captured.err
    assert str(tmp_path) not in captured.err and not any(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["simulate", "shift", "verify"])
def test_without_json_out_is_required_as_before(command, capsys) -> None:
    assert main([command]) == 2
    captured = capsys.readouterr()
    assert captured.err == "resstream: error: Missing option '--out'.\n" and captured.out == ""


@pytest.mark.parametrize("command", JSON_COMMANDS)
def test_the_help_of_out_says_json_does_without_it(command, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    assert "Required, except with --json: then the run writes into a temporary folder" in text


# Shell completion


def test_the_top_level_help_lists_the_completion_options(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "--install-completion" in text and "--show-completion" in text
    assert "<bool>" not in text and "[SHELL]" in text


@pytest.mark.parametrize(
    ("shell", "marker"), [("bash", "complete -o default -F"), ("zsh", "#compdef resstream")]
)
def test_show_completion_for_a_named_shell_prints_its_script(shell, marker, capsys) -> None:
    assert main(["--show-completion", shell]) == 0
    captured = capsys.readouterr()
    assert marker in captured.out and "_RESSTREAM_COMPLETE" in captured.out, captured.err
    assert "resstream" in captured.out and captured.err == ""


def test_an_unknown_shell_is_one_line_naming_the_shells(capsys) -> None:
    assert main(["--show-completion", "tcsh"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error:")
    assert "'tcsh'" in err and "bash, zsh, fish" in err


def test_install_completion_writes_the_script_into_home(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["--install-completion", "bash"]) == 0
    script = tmp_path / ".bash_completions" / "resstream.sh"
    assert "_RESSTREAM_COMPLETE=complete_bash" in script.read_text()
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()
    assert "bash completion installed" in capsys.readouterr().out


def test_the_installed_script_gets_completions_from_resstream(capsys, monkeypatch) -> None:
    """What the bash script runs on Tab: `resstream` with the completion variables set."""
    monkeypatch.setenv("_RESSTREAM_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", "resstream sh")
    monkeypatch.setenv("COMP_CWORD", "1")
    with pytest.raises(SystemExit) as stop:
        main([])
    assert stop.value.code == 0
    assert capsys.readouterr().out.split() == ["shift"]


def test_a_bare_completion_option_means_the_current_shell() -> None:
    commands = ["shift", "lens"]
    assert shell_optional(["--show-completion"], commands) == ["--show-completion="]
    assert shell_optional(["--show-completion", "zsh"], commands) == ["--show-completion", "zsh"]
    assert shell_optional(["--install-completion", "--version"], commands) == [
        "--install-completion=",
        "--version",
    ]
    assert shell_optional(["--show-completion", "shift"], commands) == ["--show-completion=", "shift"]
    assert shell_optional(["--show-completion", "tcsh"], commands) == ["--show-completion", "tcsh"]
    # after the command's name the options are the command's own
    assert shell_optional(["shift", "--show-completion"], commands) == ["shift", "--show-completion"]
