"""Every family of issue 26 from a local `save_pretrained` directory, as a user opens it:
`shift`, `attribute`, `neurons` and `composition` run end to end in-process; a mixture of
experts' attribution names the routed experts; GPT-OSS's sink shares are shown. (An
unsupported family's one-line refusal: tests/test_cli_attribute.py.)"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from resstream.cli.main import main
from tests.test_models_adapters import NEW_FAMILIES, tiny_model
from tests.test_models_loading import SENTENCES

FAST = ["--device", "cpu", "--quiet"]

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer():
    from resstream.data import train_bpe

    return train_bpe(SENTENCES, vocab_size=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(SENTENCES * 2) + "\n", encoding="utf-8")
    return path


def _saved(case: str, root: Path, tokenizer) -> Path:
    path = root / case
    model = copy.deepcopy(tiny_model(case))
    model.resize_token_embeddings(len(tokenizer))  # the tiny models' vocabulary is smaller
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _run(command: str, *args: str) -> int:
    return main([command, *FAST, *args])


#: One family end to end in the default suite; every family in the slow one (~8 s each on two
#: cores). The adapters' exactness for every family is in the default suite (test_models_adapters).
FAMILY_CASES = [
    case if case == "qwen3" else pytest.param(case, marks=pytest.mark.slow) for case in NEW_FAMILIES
]


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_every_new_family_runs_shift_attribute_neurons_and_composition(
    case: str, tmp_path: Path, tokenizer, corpus: Path, capsys
) -> None:
    model = ["--model", str(_saved(case, tmp_path, tokenizer))]
    sample = ["--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "12"]
    text = ["--text", SENTENCES[0]]
    runs = {
        "shift": ["shift", *model, *sample],
        "attribute": ["attribute", *model, *text],
        "neurons": ["neurons", *model, *sample, "--layer", "1", "--top", "2"],
        "composition": ["composition", *model, "--samples", "8"],
        "routes": ["routes", *model, *text],
    }
    if case in ("mixtral", "qwen3_moe", "gpt_oss"):  # an expert is a component like any other
        runs["ablate"] = ["ablate", *model, *text, "--component", "L1.E*"]
    for name, args in runs.items():
        out = tmp_path / name
        code = _run(*args, "--out", str(out))
        assert code == 0, (name, capsys.readouterr().err)
        assert (out / "run.json").is_file(), name
    route = json.loads((tmp_path / "routes" / "routes.json").read_text())
    assert route["edges"] and route["nodes"][0]["point"] == 2 * route["n_layers"]
    attribution = json.loads((tmp_path / "attribute" / "attribute.json").read_text())
    assert attribution["check"]["decomposition_relative"] <= 1e-5
    if case in ("mixtral", "qwen3_moe", "gpt_oss"):
        experts = attribution["experts"]
        assert {e["layer"] for e in experts} == {0, 1} and all(e["weight"] > 0 for e in experts)
        assert (tmp_path / "attribute" / "experts.csv").is_file()
        for layer in attribution["layers"]:
            written = sum(e["dla"] for e in experts if e["layer"] == layer["layer"])
            assert written == pytest.approx(layer["mlp_dla"] - layer["mlp_bias_dla"], abs=1e-6)
    if "ablate" in runs:
        effects = json.loads((tmp_path / "ablate" / "ablate.json").read_text())["effects"]
        assert {e["component"] for e in effects} == {f"L1.E{e}" for e in range(4)}
        assert all(e["kind"] == "expert" for e in effects)
    if case == "gpt_oss":
        shares = [h["sink_share"] for h in attribution["heads"]]
        assert all(0 < s < 1 for s in shares)
        assert "sinks" in (tmp_path / "attribute" / "attribute.html").read_text()
    else:
        assert all(h["sink_share"] is None for h in attribution["heads"])
