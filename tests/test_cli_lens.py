"""`resstream lens` end to end, in-process, and its answers to bad input.

Spec (issue 3): `lens (--text S | --text-file F) [--positions A:B] --out DIR` writes lens.json,
lens.html, lens.png and run.json and prints the trajectory table; bad input is one line on
stderr naming the value and what is allowed, exit code 2, nothing written to --out.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from resstream.cli.main import main
from tests.cli_support import (
    assert_complete_files,
    assert_nothing_written,
    check_non_finite,
    expect_usage_error,
    overflowing,
)

TEXT = "the residual stream carries the input token forward to the last layer"
FAST = ["--device", "cpu"]

#: No test here may reach the network (the hub fails at once); one torch thread.
pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture
def no_plot(monkeypatch):
    """Skip rendering lens.png (about 1 s) in tests that only read lens.json."""
    import resstream.reporting.lens as rendering

    monkeypatch.setattr(rendering, "plot_lens", lambda _result, path: [path])


def run_lens(out: Path, *args: str) -> int:
    return main(["lens", *FAST, *args, "--out", str(out)])


def check_lens_json(report: dict, *, positions: list[int], top_k: int, num_layers: int = 6) -> None:
    assert report["model"] == "reference" and report["num_layers"] == num_layers
    assert report["top_k"] == top_k
    rows = report["positions"]
    assert [row["position"] for row in rows] == positions
    for row, following in itertools.pairwise(rows):
        assert row["next_id"] == following["input_id"]  # consecutive positions of one text
    for row in rows:
        assert row["input"] and row["input"] in TEXT
        top = row["top_ids"]
        assert len(top) == num_layers + 1  # layers 0..L
        assert all(len(ids) == top_k and len(set(ids)) == top_k for ids in top)
        check_probabilities(row, top_k=top_k, depth=num_layers + 1)
        # the merged ranges cover layers 0..L in order, each holding that layer's top-1
        covered = []
        for cell in row["ranges"]:
            first, _, last = cell["layers"].partition("–")
            layers = list(range(int(first), int(last or first) + 1))
            assert all(top[layer][0] == cell["token_id"] for layer in layers)
            assert cell["is_input"] == (cell["token_id"] == row["input_id"])
            assert cell["is_next"] == (cell["token_id"] == row["next_id"])
            covered += layers
        assert covered == list(range(num_layers + 1))


def check_probabilities(row: dict, *, top_k: int, depth: int) -> None:
    """Every layer's top-k probabilities: in [0, 1], best first, summing to at most 1; t_{i+1}'s
    probability is the top-1's when its rank is 0 and at most the top-1's otherwise."""
    assert len(row["top_probs"]) == len(row["input_probs"]) == depth
    for layer, probs in enumerate(row["top_probs"]):
        assert len(probs) == top_k and all(0 <= p <= 1 for p in probs)
        assert all(a >= b * (1 - 1e-5) for a, b in itertools.pairwise(probs)) and sum(probs) <= 1 + 1e-5
        assert row["input_probs"][layer] <= probs[0] * (1 + 1e-5)
        if row["next_probs"] is not None:
            assert row["next_probs"][layer] <= probs[0] * (1 + 1e-5)
            if row["next_ranks"][layer] == 0:
                assert row["next_probs"][layer] == pytest.approx(probs[0], rel=1e-5)
    if row["next_id"] is None:
        assert row["next_probs"] is None


def check_table(stdout: str, report: dict) -> None:
    """The printed trajectory table: a header naming the layers, one line per position."""
    lines = stdout.rstrip("\n").split("\n")  # not splitlines(): a token may decode to e.g. '\x1d'
    assert f"layers 0–{report['num_layers']} (0 = embedding)" in lines[0]
    body = [line for line in lines[1:] if not line.startswith("wrote ")]
    assert len(body) == len(report["positions"])
    for line, row in zip(body, report["positions"], strict=True):
        assert line.split()[0] == str(row["position"])
        for cell in row["ranges"]:
            assert f"{cell['layers']}:" in line, (cell["layers"], line)


def test_lens_with_text_and_with_text_file(tmp_path, capsys):
    out = tmp_path / "text"
    code = run_lens(out, "--text", TEXT, "--positions", "1:4", "--top-k", "3", "--no-colour")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for name in ("lens.json", "lens.html", "lens.png", "run.json"):
        assert (out / name).is_file(), name
    assert_complete_files(out)
    report = json.loads((out / "lens.json").read_text())
    check_lens_json(report, positions=[1, 2, 3], top_k=3)
    check_table(captured.out, report)
    assert "wrote lens.json" in captured.out
    html = (out / "lens.html").read_text()
    assert html.startswith("<!doctype html>") and "</table>" in html
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["command"] == "lens" and record["config"]["positions"] == "1:4"
    assert record["config"]["top_k"] == 3 and record["device"] == "cpu"

    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT, encoding="utf-8")
    out2 = tmp_path / "file"
    code = run_lens(out2, "--text-file", str(text_file), "--positions", "1:4", "--top-k", "3", "--no-colour")
    captured2 = capsys.readouterr()
    assert code == 0, captured2.err
    assert json.loads((out2 / "lens.json").read_text()) == report  # the same text, the same trajectories
    assert json.loads((out2 / "run.json").read_text())["config"]["text_file"] == str(text_file)
    for name in ("lens.html", "lens.png"):
        assert (out2 / name).is_file(), name
    check_table(captured2.out, report)


def test_all_positions_and_the_embedding_decoder(tmp_path, capsys, no_plot):
    out = tmp_path / "out"
    code = run_lens(out, "--text", TEXT, "--decoder", "embedding", "--top-k", "2")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads((out / "lens.json").read_text())
    assert report["decoder"] == "embedding"
    count = len(report["positions"])
    assert count > 4
    check_lens_json(report, positions=list(range(count)), top_k=2)
    assert report["positions"][-1]["next_id"] is None  # the last position has no next token
    check_table(captured.out, report)


def test_a_single_position(tmp_path, capsys, no_plot):
    out = tmp_path / "out"
    assert run_lens(out, "--text", TEXT, "--positions", "2") == 0, capsys.readouterr().err
    check_lens_json(json.loads((out / "lens.json").read_text()), positions=[2], top_k=1)


def test_open_ended_positions(tmp_path, capsys, no_plot):
    out = tmp_path / "out"
    assert run_lens(out, "--text", TEXT, "--positions", "2:") == 0, capsys.readouterr().err
    report = json.loads((out / "lens.json").read_text())
    assert report["positions"][0]["position"] == 2 and report["positions"][-1]["next_id"] is None


def test_a_long_text_is_split_over_several_images_and_a_shorter_rerun_drops_the_extra_ones(
    tmp_path, capsys, monkeypatch
):
    import resstream.reporting.lens as rendering

    monkeypatch.setattr(rendering, "POSITIONS_PER_IMAGE", 2)
    out = tmp_path / "out"
    assert run_lens(out, "--text", TEXT, "--positions", "1:6") == 0, capsys.readouterr().err
    images = ["lens.png", "lens_2.png", "lens_3.png"]  # positions 1–2, 3–4, 5
    assert sorted(p.name for p in out.glob("lens*.png")) == images
    assert json.loads((out / "run.json").read_text())["files"] == sorted(
        ["lens.html", "lens.json", *images, "run.json"]
    )
    assert (
        f"wrote lens.json, lens.html, lens.png … lens_3.png (at most 2 positions each) and run.json to {out}"
        in (capsys.readouterr().out)
    )
    assert run_lens(out, "--text", TEXT, "--positions", "1:3") == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.glob("lens*.png")) == ["lens.png"]
    assert f"wrote lens.json, lens.html, lens.png and run.json to {out}" in capsys.readouterr().out


# --------------------------------------------------------------------------- colour or text marks


def printed_table(tmp_path, capsys, *args: str) -> list[str]:
    code = run_lens(tmp_path / "out", "--text", TEXT, "--positions", "1:4", *args)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out.split("\n")


def assert_text_marks(lines: list[str]) -> None:
    assert "[input] = input token t_i, [next] = next token t_{i+1}" in lines[0], lines[0]
    assert "blue" not in lines[0] and "green" not in lines[0]
    assert not any("\x1b[" in line for line in lines)
    assert any("[next]" in line or "[input]" in line for line in lines[1:])


def test_piped_output_uses_text_marks_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert_text_marks(printed_table(tmp_path, capsys))  # capsys is not a terminal


@pytest.fixture
def terminal(monkeypatch):
    """stdout is a terminal."""
    import resstream.cli.lens as command

    monkeypatch.setattr(command, "stdout_is_terminal", lambda: True)
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_a_terminal_gets_colour_and_a_header_naming_the_colours(tmp_path, capsys, terminal):
    lines = printed_table(tmp_path, capsys)
    assert "blue = input token t_i, green = next token t_{i+1}" in lines[0]
    assert any("\x1b[" in line for line in lines[1:]) and not any("[next]" in line for line in lines)


@pytest.mark.parametrize("how", [["--no-colour"], "NO_COLOR"])
def test_no_colour_on_a_terminal_when_asked(tmp_path, capsys, monkeypatch, terminal, how):
    if how == "NO_COLOR":
        monkeypatch.setenv("NO_COLOR", "1")
    assert_text_marks(printed_table(tmp_path, capsys, *(how if isinstance(how, list) else [])))


def test_help_names_the_text_marks(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per option
    assert main(["lens", "--help"]) == 0
    assert "Mark cells with [input]/[next] instead of colour" in capsys.readouterr().out


def test_an_empty_no_color_is_ignored(tmp_path, capsys, monkeypatch, terminal):
    monkeypatch.setenv("NO_COLOR", "")  # no-color.org: only a non-empty value counts
    assert any("\x1b[" in line for line in printed_table(tmp_path, capsys))


# --------------------------------------------------------------------------- bad input


def _bad(tmp_path: Path, capsys, args: list[str], *patterns: str, out: Path | None = None) -> str:
    """Exit code 2, one line on stderr naming the value and what is allowed, nothing written."""
    return expect_usage_error(["lens", *FAST, *args], out or tmp_path / "out", capsys, *patterns)


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        ([], ["--text", "--text-file"]),  # neither
        (["--text", ""], ["--text"]),
        (["--text", " \n "], ["--text"]),
        (["--text", TEXT, "--positions", "a:b"], ["'a:b'", "A:B"]),
        (["--text", TEXT, "--positions", "x"], ["'x'"]),
        (["--text", TEXT, "--positions", "1:1000"], ["1:1000", "outside"]),
        (["--text", TEXT, "--positions", "5:2"], ["5:2"]),
        (["--text", TEXT, "--positions=-1:3"], ["-1:3"]),
        (["--text", TEXT, "--positions", "100"], ["100", "outside"]),
        (["--text", TEXT, "--top-k", "0"], ["--top-k 0", "[1, 4096]"]),
        (["--text", TEXT, "--top-k", "4097"], ["--top-k 4097", "[1, 4096]"]),
        (["--text", TEXT, "--decoder", "tuned"], ["'tuned'", "logit-lens", "embedding"]),
        (["--text", TEXT, "--decoder", "tuned:"], ["'tuned' needs its lens directory: tuned:DIR"]),
        (
            ["--text", TEXT, "--decoder", "bogus"],
            ["unknown decoder 'bogus'", "logit-lens, embedding, tuned:DIR"],
        ),
        (["--text", " ".join(["residual"] * 200)], ["128"]),  # longer than the context
    ],
)
def test_bad_options(tmp_path, capsys, args, patterns):
    _bad(tmp_path, capsys, args, *patterns)


def test_both_text_and_text_file(tmp_path, capsys):
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    _bad(tmp_path, capsys, ["--text", TEXT, "--text-file", str(path)], "--text", "--text-file")


def test_missing_text_file(tmp_path, capsys):
    _bad(tmp_path, capsys, ["--text-file", str(tmp_path / "missing.txt")], "missing.txt", "does not exist")


def test_text_file_that_is_a_directory(tmp_path, capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    _bad(
        tmp_path,
        capsys,
        ["--text-file", str(folder)],
        f"--text-file {str(folder)!r} is a directory",
        "--text",
    )


def test_non_utf8_text_file(tmp_path, capsys):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"the caf\xe9 stream\n")
    _bad(tmp_path, capsys, ["--text-file", str(path)], "latin1.txt", "byte offset 7")


def test_empty_text_file_names_the_file(tmp_path, capsys):
    path = tmp_path / "empty.txt"
    path.write_text(" \n\n", encoding="utf-8")
    _bad(tmp_path, capsys, ["--text-file", str(path)], "empty.txt")


def test_empty_text_file_is_refused(tmp_path, capsys):
    path = tmp_path / "empty.txt"
    path.write_text("", encoding="utf-8")
    _bad(tmp_path, capsys, ["--text-file", str(path)], "empty")


def test_missing_model(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    _bad(tmp_path, capsys, ["--model", str(missing), "--text", TEXT], str(missing), "does not exist")


def test_unsupported_family(tmp_path, capsys):
    from transformers import OPTConfig

    from resstream.models.adapters.registry import supported_families

    path = tmp_path / "tiny-opt"
    OPTConfig(
        num_hidden_layers=1,
        hidden_size=16,
        ffn_dim=32,
        num_attention_heads=2,
        vocab_size=50,
        word_embed_proj_dim=16,
        architectures=["OPTForCausalLM"],
    ).save_pretrained(path)
    err = _bad(tmp_path, capsys, ["--model", str(path), "--text", TEXT], str(path), "'opt'")
    assert all(family in err for family in supported_families()), err


def test_out_is_an_existing_file(tmp_path, capsys):
    target = tmp_path / "out"
    target.write_text("keep me")
    code = run_lens(target, "--text", TEXT)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--out" in err and str(target) in err, err
    assert target.read_text() == "keep me"


# --------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_while_plotting_writes_nothing(tmp_path, capsys, monkeypatch):
    import resstream.reporting.lens as rendering

    def interrupt(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rendering, "plot_lens", interrupt)
    out = tmp_path / "out"
    code = run_lens(out, "--text", TEXT, "--positions", "1:3")
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err, err
    assert_nothing_written(out)  # lens.json and lens.html were staged: they are gone with the rest


def test_non_finite_states_are_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    import importlib

    module = importlib.import_module("resstream.api.lens")
    monkeypatch.setattr(module, "residual_states", overflowing(module.residual_states))
    out = tmp_path / "out"
    check_non_finite(run_lens(out, "--text", "To be, or not to be"), capsys, out)
