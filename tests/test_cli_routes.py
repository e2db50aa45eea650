"""`resstream routes` end to end, in-process, on the built-in reference model: one text (routes.json,
routes.csv, routes.png, routes.html, run.json, the terminal lines), corpus mode, and bad input
(exit 2, one line, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resstream.cli.main import main
from tests.cli_support import assert_complete_files, expect_usage_error, strict_json

FAST = ["--device", "cpu", "--quiet"]
TEXT = "KING HENRY: Come, come, my lord"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def one_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output directory of one run on TEXT."""
    out = tmp_path_factory.mktemp("routes") / "out"
    code = main(["routes", *FAST, "--text", TEXT, "--out", str(out)])
    assert code == 0
    return out


def test_one_text_writes_the_graph_the_picture_and_the_page(one_text: Path) -> None:
    out = one_text
    assert sorted(p.name for p in out.iterdir()) == [
        "routes.csv",
        "routes.html",
        "routes.json",
        "routes.png",
        "run.json",
    ]
    assert_complete_files(out)
    result = strict_json(out / "routes.json")
    last = len(result["tokens"]) - 1
    assert result["position"] == last and result["threshold"] == 0.04
    assert result["edges"] and all(edge["importance"] >= 0.04 for edge in result["edges"])
    tops = {(node["point"], node["position"]) for node in result["nodes"]}
    assert (2 * result["n_layers"], last) in tops  # the prediction's node
    for edge in result["edges"]:  # every edge joins nodes on the route
        assert (edge["from_point"], edge["source"]) in tops and (edge["to_point"], edge["target"]) in tops
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["command"] == "routes" and record["config"]["threshold"] == 0.04
    page = (out / "routes.html").read_text(encoding="utf-8")
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page


def test_position_and_threshold_change_the_route(tmp_path: Path, capsys) -> None:
    out = tmp_path / "routes"
    code = main(["routes", *FAST, "--text", TEXT, "--position", "3", "--threshold", "0.2", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    result = strict_json(out / "routes.json")
    assert result["position"] == 3 and result["threshold"] == 0.2
    assert all(edge["importance"] >= 0.2 and edge["target"] <= 3 for edge in result["edges"])
    assert "wrote routes.json" in printed


@pytest.mark.slow
def test_corpus_mode_counts_heads_on_routes(tmp_path: Path) -> None:
    out = tmp_path / "corpus"
    code = main(
        ["routes", *FAST, "--dataset", "shakespeare", "--num-seqs", "2", "--seq-len", "12", "--out", str(out)]
    )
    assert code == 0
    assert_complete_files(out)
    result = strict_json(out / "routes.json")
    assert result["positions"] == 2 * 11 and result["num_seqs"] == 2
    for row in result["head_on_route"]:
        assert all(0.0 <= rate["value"] <= 1.0 for rate in row)
    assert set(result["edge_shares"]) == {"first", "previous", "same"}
    assert (out / "routes.png").is_file() and (out / "routes.csv").is_file()


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--text", TEXT, "--threshold", "0"], "--threshold 0"),
        (["--text", TEXT, "--threshold", "1"], "--threshold 1"),
        (["--text", TEXT, "--threshold", "1.5"], "strictly between 0 and 1"),
        (["--text", TEXT, "--threshold", "-0.1"], "--threshold -0.1"),
        (["--text", TEXT, "--position", "99"], "--position 99"),
        (["--text", TEXT, "--position", "-99"], "--position -99"),
        (["--text", " "], "empty"),
        (["--text", TEXT, "--dataset", "shakespeare"], "not both"),
        (["--text", TEXT, "--num-seqs", "2"], "--num-seqs"),
        (["--dataset", "shakespeare", "--position", "2"], "--position"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    args: list[str], pattern: str, tmp_path: Path, capsys
) -> None:
    expect_usage_error(["routes", *FAST, *args], tmp_path / "out", capsys, pattern)
