"""What `resstream`, `resstream --help`, `--version` and `--debug` show a new user."""

from __future__ import annotations

import itertools
import re

import pytest

import resstream
from resstream.api.neurons import DEFAULT_SEQ_LEN as NEURONS_SEQ_LEN
from resstream.api.recency import DEFAULT_SEQ_LEN as RECENCY_SEQ_LEN
from resstream.api.shift import DEFAULT_SEQ_LEN as SHIFT_SEQ_LEN
from resstream.cli.main import app, main

COMMANDS = [info.name for info in app.registered_commands]


def test_a_bare_resstream_prints_the_help_and_no_error(capsys):
    code = main([])
    captured = capsys.readouterr()
    assert code == 0
    assert "Usage: resstream" in captured.out
    assert "error" not in captured.err.lower()


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"resstream {resstream.__version__}"


def test_the_top_level_help_lists_version_and_debug(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--version" in out and "--debug" in out


@pytest.mark.parametrize("command", COMMANDS)
def test_no_flag_shows_a_type_as_if_it_took_a_value(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "<bool>" not in out, out
    assert re.search(r"--help\s+Show this message", out), out


def test_options_with_values_keep_their_type(capsys):
    assert main(["shift", "--help"]) == 0
    assert re.search(r"--seq-len\s+<int>", capsys.readouterr().out)


def test_debug_shows_the_traceback_instead_of_one_line(tmp_path):
    with pytest.raises(resstream.errors.UsageError, match="top_k"):
        main(
            [
                "shift",
                "--top-k",
                "0",
                "--num-seqs",
                "1",
                "--seq-len",
                "8",
                "--out",
                str(tmp_path / "o"),
                "--debug",
            ]
        )


def test_the_train_field_list_continues_under_its_own_column():
    from resstream.cli.train import HELP_WIDTH, field_help

    lines = field_help().split("\n\n", 1)[1].splitlines()  # after the paragraph of prose
    assert all(len(line) <= HELP_WIDTH for line in lines)
    continued = [line for line in lines if line and not line.startswith("  --") and line[0] == " "]
    assert continued and all(line.startswith(" " * 25) and line[25] != " " for line in continued)


@pytest.mark.parametrize(
    ("command", "default"),
    [
        ("shift", f"[default: {SHIFT_SEQ_LEN}, or the shortest model context if shorter]"),
        ("recency", f"[default: {RECENCY_SEQ_LEN}, or the shortest model context if shorter]"),
        ("neurons", f"[default: {NEURONS_SEQ_LEN}, or the shortest model context if shorter]"),
        ("attribute", "[default: 64]"),
    ],
)
def test_bracketed_defaults_in_help_text_are_shown(command, default, capsys, monkeypatch):
    """Rich reads [default: …] in help text as markup and drops it unless it is escaped; the
    --seq-len default each command names is the one its API uses."""
    monkeypatch.setenv("COLUMNS", "200")
    assert main([command, "--help"]) == 0
    assert default in capsys.readouterr().out


def _command_rows(out: str) -> dict[str, list[str]]:
    """The command list of `resstream --help`: per command its description's screen lines, and
    under the key "" the width its description column has."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "─ Commands ─" in line)
    rows: dict[str, list[str]] = {}
    name = ""
    width = 0
    for line in lines[start + 1 :]:
        if line.startswith("╰"):
            break
        inner = line[1 : line.rindex("│")]
        match = re.match(r" (\S+)?(\s+)(.*?)\s*$", inner)
        assert match, line
        if match.group(1):
            name = match.group(1)
            rows[name] = []
        column = 1 + len(match.group(1) or "") + len(match.group(2))
        width = len(inner) - column - 1  # the one space of padding before the border
        rows[name].append(match.group(3))
    rows[""] = [str(width)]
    return rows


@pytest.mark.parametrize("columns", ["100", "80"])
def test_every_command_summary_is_a_whole_sentence_broken_only_where_a_word_would_not_fit(
    columns, capsys, monkeypatch
):
    from resstream.cli.help import command_summary

    monkeypatch.setenv("COLUMNS", columns)
    assert main(["--help"]) == 0
    rows = _command_rows(capsys.readouterr().out)
    width = int(rows.pop("")[0])
    assert sorted(rows) == sorted(COMMANDS)
    helps = {info.name: info.callback.__doc__ for info in app.registered_commands}
    for name, lines in rows.items():
        summary = " ".join(lines)
        assert summary == command_summary(helps[name]), (name, lines)
        assert summary.endswith("."), (name, summary)  # a whole sentence
        paragraph = " ".join(helps[name].split("\n\n")[0].split())
        assert paragraph.startswith(summary), name
        for line, after in itertools.pairwise(lines):  # a line ends only when full
            assert len(line) + 1 + len(after.split()[0]) > width, (name, line, after)


def test_command_summary_is_the_first_sentence_on_one_line():
    from resstream.cli.help import command_summary

    text = """Train a model; writes weights and
    loss_curve.png into --out. Ctrl-C saves a checkpoint.

    More detail, e.g. on flags."""
    assert command_summary(text) == "Train a model; writes weights and loss_curve.png into --out."
    assert command_summary("Uses e.g. a preset.") == "Uses e.g. a preset."
    assert command_summary("One line without a stop") == "One line without a stop"


#: Bad values that need no model and no data, one per shared option and a few commands' own,
#: each with the flag its one line names: each is refused (exit 2) before torch, transformers
#: or matplotlib is imported.
REFUSED_AT_ONCE = [
    (["shift", "--num-seqs", "-1"], "--num-seqs"),
    (["recency", "--batch-size", "0"], "--batch-size"),
    (["neurons", "--layer", "0", "--seq-len", "1"], "--seq-len"),
    (["lens", "--text", "a", "--dtype", "float64"], "--dtype"),
    (["lens", "--text", "a", "--positions", "x"], "--positions"),
    (["routes", "--text", "a", "--device", "tpu"], "--device"),
    (["attribute", "--text", "a", "--device-map", "everywhere"], "--device-map"),
    (["tune-lens", "--seq-len", "1"], "--seq-len"),
    (["tune-lens", "--steps", "0"], "--steps"),
    (["tune-lens", "--lr", "-1"], "--lr"),
    (["verify", "--device", "tpu"], "--device"),
    (["simulate", "--layers", "0"], "--layers"),
    (["simulate", "--sims", "0"], "--simulations"),
    (["simulate", "--tokens", "1"], "--tokens"),
    (["eval", "--batch-size", "0"], "--batch-size"),
    (["compare", "some-sweep", "--max-eval-tokens", "1"], "--max-eval-tokens"),
    (["attribute", "--text", "a", "--top", "0"], "--top"),
    (["composition", "--top", "0"], "--top"),
    (["routes", "--text", "a", "--threshold", "1.5"], "--threshold"),
    (["verify", "--dtype", "float16"], "--dtype"),
    (["shift", "--decoder", "bogus"], "decoder 'bogus'"),
    (["lens", "--text", "a", "--decoder", "tuned"], "decoder 'tuned'"),
    (["lens"], "--text"),
    (["attribute"], "--text"),
    (["attribute", "--dataset", "shakespeare", "--text", "a"], "--text"),
    (["attribute", "--dataset", "shakespeare", "--decoder", "embedding"], "logit lens"),
    (["routes"], "--text"),
    (["ablate"], "--text"),
    (["patch", "--corrupt", "b"], "--text"),
    (["patch", "--corrupt", "b", "--text", " "], "--text"),
]
REFUSE_AND_LIST_IMPORTS = """
import json, sys
from resstream.cli.main import main
codes = [main([*args, "--out", sys.argv[1]]) for args in json.loads(sys.argv[2])]
heavy = sorted(name for name in ("torch", "transformers", "matplotlib") if name in sys.modules)
print(json.dumps({"codes": codes, "heavy": heavy}))
"""


def test_bad_values_are_refused_before_torch_is_imported(tmp_path):
    """Issue 38: `shift --num-seqs -1` took 3 s to refuse, most of it importing torch. One fresh
    interpreter runs every refusal of `REFUSED_AT_ONCE` in-process, then lists what it imported."""
    import json
    import subprocess
    import sys

    out = tmp_path / "out"
    refusals = [args for args, _ in REFUSED_AT_ONCE]
    done = subprocess.run(
        [sys.executable, "-c", REFUSE_AND_LIST_IMPORTS, str(out), json.dumps(refusals)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    lines = done.stderr.strip().splitlines()
    assert found["codes"] == [2] * len(REFUSED_AT_ONCE), lines
    assert len(lines) == len(REFUSED_AT_ONCE) and all(line.startswith("resstream: error:") for line in lines)
    assert [line for line, (_, flag) in zip(lines, REFUSED_AT_ONCE, strict=True) if flag not in line] == []
    assert found["heavy"] == [], lines
    assert not out.exists()
