"""`NeuronsResult` and `CompositionResult` in a notebook (issue 24): each displays as a
self-contained fragment with the tables and figures its command writes, gives a long-format
DataFrame with the documented columns whose cells are the JSON's values, and the CSV the
command writes is that frame; `to_dict()` is what the command's JSON holds.

Each command runs once per module on the built-in reference model (its result kept by
wrapping the API function the command calls).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from resstream.analysis.memories.composition import COMPOSITION_COLUMNS, KINDS
from resstream.analysis.memories.neurons import NEURONS_COLUMNS
from resstream.cli.main import main
from resstream.reporting.notebook import frame_csv
from tests.cli_support import strict_json
from tests.notebook_support import assert_displays, assert_frame_columns
from tests.test_cli_shift import TEXT

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_keeping_result(
    command: list[str], api_module: str, tmp: Path, *, unplotted: Sequence[str] = ()
) -> tuple[Path, Any]:
    """Run `resstream <command> --out tmp/out` offline; the output folder and the result the
    API function of `resstream.api.<api_module>` (of the same name) returned. The functions
    `unplotted` of `resstream.reporting.attention` draw nothing (tests that read numbers)."""
    import resstream.reporting.attention as attention

    module = importlib.import_module(f"resstream.api.{api_module}")
    original = getattr(module, api_module)
    kept: list[Any] = []

    def keep(*args: Any, **kwargs: Any) -> Any:
        kept.append(original(*args, **kwargs))
        return kept[-1]

    out = tmp / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(module, api_module, keep)
        for name in unplotted:
            patch.setattr(attention, name, lambda *args, **kwargs: None)
        assert main([*command, "--device", "cpu", "--quiet", "--out", str(out)]) == 0
    assert len(kept) == 1
    return out, kept[0]


def as_json(data: dict[str, Any]) -> Any:
    """`data` as the JSON file holds it (tuples as lists)."""
    return json.loads(json.dumps(data))


# --------------------------------------------------------------------------- neurons


@pytest.fixture(scope="module")
def neurons_run(tmp_path_factory) -> tuple[Path, Any]:
    """`resstream neurons --layer 2 --top 3` on a small corpus: (output folder, NeuronsResult)."""
    tmp = tmp_path_factory.mktemp("neurons")
    corpus = tmp / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    sample = ["--dataset", str(corpus), "--num-seqs", "4", "--seq-len", "24"]
    command = ["neurons", *sample, "--layer", "2", "--top", "3", "--contexts", "4", "--value-tokens", "5"]
    return run_keeping_result(command, "neurons", tmp)


def test_neurons_display_the_pages_tables_and_the_figure(neurons_run) -> None:
    _, result = neurons_run
    headings = [f"L{result.layer}.N{n.neuron} (max m = {n.max_activation:.4g})" for n in result.neurons]
    fragment = assert_displays(
        result, ["context (activating token marked)", "seq:pos", "promotes", "suppresses", *headings]
    )
    assert fragment.count("<mark>") == 3 * 4  # every context's activating token
    assert fragment.count("<img") == 1  # neurons.png
    assert "body{" not in fragment and "resstream-neurons mark{" in fragment  # styles kept to its element
    assert len(repr(result).splitlines()) <= 3 and "layer 2" in repr(result)


def test_neurons_frame_holds_the_json_values(neurons_run) -> None:
    out, result = neurons_run
    frame = assert_frame_columns(result, NEURONS_COLUMNS)
    report = strict_json(out / "neurons.json")
    assert len(frame) == 3 * (5 + 5 + 4) and set(frame["layer"]) == {2}
    for entry in report["neurons"]:
        rows = frame[frame["neuron"] == entry["neuron"]]
        for kind in ("promoted", "suppressed"):
            tokens = rows[rows["kind"] == kind]
            assert list(tokens["rank"]) == list(range(5))
            assert list(tokens["token_id"]) == [t["token_id"] for t in entry[kind]]
            assert list(tokens["value"]) == [t["score"] for t in entry[kind]]
            assert tokens["sequence"].isna().all() and tokens["context"].isna().all()
        contexts = rows[rows["kind"] == "context"]
        assert list(contexts["value"]) == [c["activation"] for c in entry["contexts"]]
        assert list(contexts["sequence"]) == [c["sequence"] for c in entry["contexts"]]
        assert list(contexts["position"]) == [c["position"] for c in entry["contexts"]]
        assert list(contexts["token_id"]) == [c["token_id"] for c in entry["contexts"]]
        assert all(text.endswith("⟧") for text in contexts["context"])


def test_neurons_csv_and_json_are_the_frame_and_the_dict(neurons_run) -> None:
    out, result = neurons_run
    assert (out / "neurons.csv").read_text(encoding="utf-8") == frame_csv(result.to_pandas())
    assert strict_json(out / "neurons.json") == as_json(result.to_dict())


# --------------------------------------------------------------------------- composition


@pytest.fixture(scope="module")
def composition_run(tmp_path_factory) -> tuple[Path, Any]:
    """`resstream composition --top 3` on the reference model: (output folder, CompositionResult)."""
    command = ["composition", "--samples", "16", "--top", "3"]
    return run_keeping_result(command, "composition", tmp_path_factory.mktemp("composition"))


def test_composition_displays_its_tables_and_three_heatmaps(composition_run) -> None:
    _, result = composition_run
    fragment = assert_displays(
        result, ["strongest pairs", "writer_layer", "reader_head", "above_baseline", "composition_v.png"]
    )
    assert fragment.count("<img") == 3
    best = result.top("k", 1)[0]
    assert f"{best.score:.4g}" in fragment
    assert len(repr(result).splitlines()) <= 5


def test_composition_frame_holds_the_json_values(composition_run) -> None:
    out, result = composition_run
    frame = assert_frame_columns(result, COMPOSITION_COLUMNS)
    report = strict_json(out / "composition.json")
    pairs = report["pairs"]
    assert len(frame) == 3 * len(pairs) == 3 * 240
    assert (frame["writer_layer"] < frame["reader_layer"]).all()
    assert set(frame["baseline"]) == {report["baseline"]["mean"]}
    for index, kind in enumerate(KINDS):
        rows = frame.iloc[index * len(pairs) : (index + 1) * len(pairs)]
        assert set(rows["kind"]) == {kind}
        assert list(rows["score"]) == [pair[kind] for pair in pairs]
        assert list(rows["writer_head"]) == [pair["head_a"] for pair in pairs]
        assert list(rows["reader_layer"]) == [pair["layer_b"] for pair in pairs]
        best = report["top"][kind][0]
        assert rows["score"].max() == best["score"]


def test_composition_csv_and_json_are_the_frame_and_the_dict(composition_run) -> None:
    out, result = composition_run
    assert (out / "composition.csv").read_text(encoding="utf-8") == frame_csv(result.to_pandas())
    assert strict_json(out / "composition.json") == as_json(result.to_dict(top=3))
