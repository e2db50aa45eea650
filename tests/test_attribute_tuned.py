"""`attribute --decoder tuned:DIR`: the target's trajectory through a tuned lens (issue 12)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

import resstream
from resstream.analysis.decoding.tuned_lens import TunedLens
from resstream.cli.main import main
from resstream.models import load_model
from tests.cli_support import expect_usage_error

TEXT = "The king said that the queen"
FAST = ["--device", "cpu", "--quiet"]

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def zero_lens_dir(tmp_path_factory) -> Path:
    view = load_model(None, device="cpu").view
    return TunedLens.zero(view, "reference").save(tmp_path_factory.mktemp("lens") / "zero")


@pytest.fixture(scope="module")
def random_lens() -> TunedLens:
    view = load_model(None, device="cpu").view
    lens = TunedLens.zero(view, "reference")
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        lens.translators.weight.copy_(torch.randn(lens.translators.weight.shape, generator=generator) * 0.05)
        lens.translators.bias.copy_(torch.randn(lens.translators.bias.shape, generator=generator))
    return lens


def test_a_zero_lens_reads_the_block_boundaries_like_the_logit_lens(zero_lens_dir: Path) -> None:
    result = resstream.attribute(
        TEXT, decoder=f"tuned:{zero_lens_dir}", sources=False, neurons=False, progress=False
    )
    boundaries = [point for point in result.trajectory if point.stage != "res"]
    assert [p.point for p in result.tuned_trajectory] == [p.point for p in boundaries]
    assert len(result.tuned_trajectory) == 7  # h_0..h_6 of the reference model
    for tuned, logit in zip(result.tuned_trajectory, boundaries, strict=True):
        assert tuned.rank == logit.rank
        assert tuned.logprob == pytest.approx(logit.logprob, abs=1e-4)
    assert result.tuned_decoding.startswith("tuned lens")


def test_a_trained_lens_changes_the_inner_layers_but_not_the_last(random_lens: TunedLens) -> None:
    plain = resstream.attribute(TEXT, sources=False, neurons=False, progress=False)
    tuned = resstream.attribute(TEXT, decoder=random_lens, sources=False, neurons=False, progress=False)
    assert plain.tuned_trajectory == () and plain.tuned_decoding is None
    assert tuned.layers == plain.layers and tuned.trajectory == plain.trajectory  # the logit lens's scores
    last = tuned.tuned_trajectory[-1]
    assert last.rank == plain.rank and last.logprob == pytest.approx(plain.logprob, abs=1e-4)
    inner = [
        abs(t.logprob - p.logprob)
        for t, p in zip(tuned.tuned_trajectory[:-1], plain.trajectory[::2], strict=False)
    ]
    assert max(inner) > 0.1


def test_cli_writes_the_tuned_trajectory(tmp_path: Path, zero_lens_dir: Path, capsys) -> None:
    out = tmp_path / "attr"
    code = main(
        [
            "attribute",
            *FAST,
            "--text",
            TEXT,
            "--no-sources",
            "--decoder",
            f"tuned:{zero_lens_dir}",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr()
    rows = list(csv.DictReader((out / "tuned_trajectory.csv").open()))
    assert [row["point"] for row in rows] == ["L_in_0", *(f"L_out_{layer}" for layer in range(6))]
    saved = json.loads((out / "attribute.json").read_text())
    assert len(saved["tuned_trajectory"]) == 7
    assert json.loads((out / "run.json").read_text())["config"]["decoder"] == f"tuned:{zero_lens_dir}"


@pytest.mark.parametrize(
    ("extra", "patterns"),
    [
        (["--decoder", "embedding"], ["logit lens", "tuned:DIR"]),
        (["--decoder", "tuned:/nonexistent/lens"], ["/nonexistent/lens", "does not exist"]),
        (["--decoder", "lens"], ["'lens'", "logit-lens", "tuned:DIR"]),
    ],
)
def test_bad_decoders(tmp_path: Path, capsys, extra: list[str], patterns: list[str]) -> None:
    expect_usage_error(["attribute", *FAST, "--text", TEXT, *extra], tmp_path / "out", capsys, *patterns)


def test_corpus_mode_refuses_a_tuned_lens(tmp_path: Path, zero_lens_dir: Path, capsys) -> None:
    args = ["attribute", *FAST, "--dataset", "shakespeare", "--decoder", f"tuned:{zero_lens_dir}"]
    expect_usage_error(args, tmp_path / "out", capsys, "one text", "corpus mode")
