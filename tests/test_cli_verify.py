"""`resstream verify` end to end, in-process: a local Hugging Face directory with the GPT-2 BPE
verified in fp32 and bf16 (verify.json, run.json, one table), a mixture of experts with its
router check, resstream's reference model, a failed check (exit 1, one line, files written)
and bad input (exit 2, one line, nothing written)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from resstream.analysis.verification import CHECKS, TOLERANCES
from resstream.api import verify as verify_api
from resstream.api.verify import DEFAULT_TEXT
from resstream.cli.main import main
from tests.cli_support import assert_complete_files, expect_usage_error, strict_json
from tests.test_models_adapters import tiny_model

FAST = ["--device", "cpu", "--quiet"]

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer) -> Path:
    """A tiny random GPT-2 saved with the GPT-2 BPE (its full vocabulary)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=len(gpt2_tokenizer), n_positions=64)
    path = tmp_path_factory.mktemp("models") / "gpt2-tiny"
    GPT2LMHeadModel(config).save_pretrained(path)
    gpt2_tokenizer.save_pretrained(path)
    return path


def _verify(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["verify", *FAST, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_local_hugging_face_model_passes_and_writes_its_figures(
    dtype: str, gpt2_dir: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "verify"
    code, printed, err = _verify(capsys, "--model", str(gpt2_dir), "--dtype", dtype, "--out", str(out))
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["run.json", "verify.json"]
    assert_complete_files(out)
    report = strict_json(out / "verify.json")
    assert (report["model"], report["family"], report["dtype"], report["device"]) == (
        str(gpt2_dir),
        "gpt2",
        dtype,
        "cpu",
    )
    assert report["passed"] is True and report["failed"] == []
    assert report["text"] == DEFAULT_TEXT and 15 <= report["tokens"] <= 25
    assert report["tolerances"]["logits"] == TOLERANCES[dtype].logits
    assert [check["name"] for check in report["checks"]] == list(CHECKS)
    assert [check["applies"] for check in report["checks"]] == [True, True, True, True, True, False]
    assert report["last_state"] == "after the final norm" and len(report["layers"]) == 3
    assert report["logits"]["relative"] <= TOLERANCES[dtype].logits
    lines = printed.splitlines()
    assert lines[0].startswith(f"{gpt2_dir} (gpt2, {dtype} on cpu), {report['tokens']} tokens")
    assert lines[1].split() == ["check", "result", "figure", "tolerance", "compared"]
    assert [line.split()[:2] for line in lines[2:8]] == [
        ["logits", "pass"],
        ["states", "pass"],
        ["weights", "pass"],
        ["decomposition", "pass"],
        ["lens", "pass"],
        ["router", "n/a"],
    ]
    assert lines[-1] == f"wrote verify.json and run.json to {out}"
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["command"] == "verify" and record["config"]["dtype"] == dtype
    assert record["config"]["text"] == DEFAULT_TEXT and record["files"] == ["verify.json", "run.json"]


def test_a_mixture_of_experts_checks_its_routing(tmp_path: Path, capsys) -> None:
    from resstream.data import train_bpe
    from tests.test_models_loading import SENTENCES

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    model = copy.deepcopy(tiny_model("mixtral"))
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(tmp_path / "mixtral")
    tokenizer.save_pretrained(tmp_path / "mixtral")
    out = tmp_path / "verify"
    code, printed, err = _verify(
        capsys, "--model", str(tmp_path / "mixtral"), "--text", SENTENCES[0], "--out", str(out)
    )
    assert code == 0, err
    report = strict_json(out / "verify.json")
    assert [block["block"] for block in report["router"]] == [0, 1]
    assert all(block["agreement"] == 1.0 for block in report["router"])
    assert report["checks"][-1]["passed"] is True
    assert any(line.split()[:2] == ["router", "pass"] for line in printed.splitlines())


def test_the_reference_model_is_verified_against_its_own_forward(tmp_path: Path, capsys) -> None:
    out = tmp_path / "verify"
    code, printed, err = _verify(capsys, "--text", "The king said", "--out", str(out), "--json")
    assert code == 0, err
    report = json.loads(printed)  # --json: the result alone on stdout
    assert report == strict_json(out / "verify.json")
    assert report["family"] == "resstream" and report["reference"].startswith("resstream GPT")
    assert report["passed"] and report["last_state"] == "before the final norm"
    assert any(line.split()[:2] == ["router", "n/a"] for line in err.splitlines())  # the table: stderr


def test_a_failed_check_exits_1_in_one_line_after_writing_the_files(
    gpt2_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """The model's logits seen as shifted at one token: only the logit check can fail."""
    real = verify_api.own_forward

    def shifted(view, ids):
        reference = real(view, ids)
        logits = reference.logits.clone()
        logits[-1, 7] += 1.0
        return type(reference)(reference.source, logits, reference.hidden_states, reference.head)

    monkeypatch.setattr(verify_api, "own_forward", shifted)
    out = tmp_path / "verify"
    code, printed, err = _verify(capsys, "--model", str(gpt2_dir), "--out", str(out))
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("resstream: error: verification failed: logits outside the float32 tolerances")
    report = strict_json(out / "verify.json")
    assert report["passed"] is False and report["failed"] == ["logits"]
    assert (out / "run.json").is_file()
    assert any(line.split()[:2] == ["logits", "FAIL"] for line in printed.splitlines())


def test_bad_input_is_one_line_and_nothing_is_written(
    gpt2_dir: Path, gpt2_tokenizer, tmp_path: Path, capsys
) -> None:
    from transformers import BertConfig, BertLMHeadModel

    out = tmp_path / "verify"
    model = ["--model", str(gpt2_dir)]
    expect_usage_error(["verify", *FAST, *model, "--dtype", "float16"], out, capsys, "--dtype 'float16'")
    expect_usage_error(
        ["verify", *FAST, *model, "--dtype", "int8"], out, capsys, "allowed: float32, bfloat16"
    )
    expect_usage_error(["verify", *FAST, *model, "--text", " "], out, capsys, "--text is empty")
    bert = tmp_path / "bert"
    config = BertConfig(
        vocab_size=len(gpt2_tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        is_decoder=True,
    )
    BertLMHeadModel(config).save_pretrained(bert)
    gpt2_tokenizer.save_pretrained(bert)
    expect_usage_error(
        ["verify", *FAST, "--model", str(bert)],
        out,
        capsys,
        "unsupported family 'bert'",
        "supported families",
    )
