"""load_model: the reference model, resstream runs, local Hugging Face directories, bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from resstream.assets import reference_model_dir
from resstream.errors import UsageError
from resstream.models import load_model

SENTENCES = [
    "the residual stream carries the input token forward",
    "each block writes its update into the stream",
    "the last layers predict the next token",
    "attention moves information between positions",
] * 4


def _tiny_gpt2(vocab_size: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=vocab_size, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def tokenizer():
    from resstream.data import train_bpe

    return train_bpe(SENTENCES, vocab_size=300)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    model = _tiny_gpt2(len(tokenizer))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, model


def test_local_hf_directory_loads_with_its_tokenizer(gpt2_dir) -> None:
    path, original = gpt2_dir
    loaded = load_model(str(path), device="cpu")
    view = loaded.view
    assert (loaded.source, loaded.name, loaded.dtype, loaded.device) == ("local", str(path), "float32", "cpu")
    assert view.family == "gpt2" and view.tied and not view.model.training
    assert view.max_positions == 32
    ids = torch.tensor([loaded.tokenizer.encode("the residual stream predicts the next token")])
    assert ids.max() < len(loaded.tokenizer)
    with torch.no_grad():
        assert torch.equal(view.model(ids).logits, original(ids).logits)


def test_dtype_is_applied(gpt2_dir) -> None:
    loaded = load_model(str(gpt2_dir[0]), dtype="bfloat16", device="cpu")
    assert loaded.view.W_U.dtype == torch.bfloat16 and loaded.dtype == "bfloat16"


def test_resstream_run_directory_and_reference_model() -> None:
    run = load_model(str(reference_model_dir()), device="cpu")
    assert run.source == "resstream" and run.view.family == "resstream"
    ref = load_model(None, device="auto")
    assert ref.source == "reference" and ref.name == "reference"
    assert ref.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert ref.view.n_layers == run.view.n_layers


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "float64"}, r"unknown dtype 'float64'.*allowed: auto, float32, bfloat16, float16"),
        ({"device": "tpu"}, r"unknown `device` 'tpu'; allowed: auto, cpu, cuda"),
        ({"device_map": "everywhere"}, r"unknown device_map 'everywhere'.*allowed: auto"),
    ],
)
def test_bad_options(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_model(None, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu() -> None:
    with pytest.raises(UsageError, match=r"`device` 'cuda' is not available"):
        load_model(None, device="cuda")


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is not None, reason="accelerate is installed")
def test_device_map_needs_accelerate(gpt2_dir) -> None:
    with pytest.raises(UsageError, match=r"device_map='auto' needs the 'accelerate' package"):
        load_model(str(gpt2_dir[0]), device_map="auto")


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(UsageError, match=rf"model path '{missing}' does not exist"):
        load_model(str(missing))
    with pytest.raises(UsageError, match=r"model '' is empty"):
        load_model("  ")


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"has no config\.json"):
        load_model(str(tmp_path))
    file = tmp_path / "weights.bin"
    file.write_bytes(b"x")
    with pytest.raises(UsageError, match=r"is a file"):
        load_model(str(file))


def test_corrupt_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"cannot load its config"):
        load_model(str(tmp_path))


def test_missing_tokenizer(tmp_path: Path) -> None:
    _tiny_gpt2(300).save_pretrained(tmp_path)
    with pytest.raises(UsageError, match=r"has no tokenizer"):
        load_model(str(tmp_path))


def test_non_causal_model(tmp_path: Path) -> None:
    from transformers import BertConfig

    BertConfig(
        num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32, vocab_size=50
    ).save_pretrained(tmp_path)
    with pytest.raises(UsageError, match=r"is not a causal LM \(model_type 'bert'"):
        load_model(str(tmp_path))


def test_registered_family_without_a_causal_head(tmp_path: Path) -> None:
    from transformers import GPT2Config

    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)
    config.architectures = ["GPT2ForSequenceClassification"]
    config.save_pretrained(tmp_path)
    with pytest.raises(UsageError, match=r"not a causal LM \(architectures GPT2ForSequence"):
        load_model(str(tmp_path))


def test_unsupported_causal_family(tmp_path: Path) -> None:
    from transformers import OPTConfig

    OPTConfig(
        num_hidden_layers=1,
        hidden_size=16,
        ffn_dim=32,
        num_attention_heads=2,
        vocab_size=50,
        word_embed_proj_dim=16,
    ).save_pretrained(tmp_path)
    with pytest.raises(
        UsageError,
        match=r"unsupported family 'opt'; supported families: "
        r"gemma, gemma2, gpt2, gpt_neox, llama, mistral, qwen2, "
        r"resstream",
    ):
        load_model(str(tmp_path))


def test_custom_code_needs_trust_remote_code(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "my_custom_lm",
                "architectures": ["MyCustomForCausalLM"],
                "auto_map": {
                    "AutoConfig": "configuration_my.MyConfig",
                    "AutoModelForCausalLM": "modeling_my.MyForCausalLM",
                },
            }
        )
    )
    with pytest.raises(UsageError, match=r"needs custom code.*trust_remote_code=True"):
        load_model(str(tmp_path))


def test_hub_name_fails_fast_offline(hf_offline) -> None:
    with pytest.raises(
        UsageError,
        match=r"model 'no-such-org/no-such-model' not found: .*"
        r"offline mode is set \(HF_HUB_OFFLINE\)",
    ):
        load_model("no-such-org/no-such-model")


def test_messages_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UsageError) as info:
        load_model(str(tmp_path))
    assert "\n" not in str(info.value)


def test_check_model_refuses_what_load_model_refuses_without_reading_weights(
    tmp_path: Path, gpt2_dir
) -> None:
    from transformers import BertConfig

    from resstream.models import check_model

    check_model(None)
    check_model(str(reference_model_dir()))
    path, _ = gpt2_dir
    unread = tmp_path / "unread"
    unread.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (unread / name).write_bytes((path / name).read_bytes())
    (unread / "model.safetensors").write_bytes(b"not weights")  # never opened by check_model
    check_model(str(unread))
    with pytest.raises(UsageError, match="cannot load its weights"):
        load_model(str(unread))
    bert = tmp_path / "bert"
    BertConfig(
        num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32, vocab_size=50
    ).save_pretrained(bert)
    no_tokenizer = tmp_path / "no-tokenizer"
    _tiny_gpt2(300).save_pretrained(no_tokenizer)
    for spec, message in [
        (tmp_path / "nope", "does not exist"),
        (bert, "is not a causal LM"),
        (no_tokenizer, "has no tokenizer"),
        (tmp_path, "has no config.json"),
    ]:
        with pytest.raises(UsageError, match=message):
            check_model(str(spec))


def test_reference_is_the_built_in_models_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    loaded = load_model("reference")
    assert (loaded.name, loaded.source) == ("reference", "reference")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: chmod 000 does not deny")
def test_an_unreadable_weights_file_is_reported_as_permission_denied(gpt2_dir, tmp_path) -> None:
    path = tmp_path / "tiny"
    shutil.copytree(gpt2_dir[0], path)
    (path / "model.safetensors").chmod(0)
    with pytest.raises(UsageError, match=r"cannot read .*model\.safetensors': permission denied"):
        load_model(str(path), device="cpu")


def test_non_finite_weights_are_refused_with_the_tensor_named(gpt2_dir, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    path = tmp_path / "tiny"
    shutil.copytree(gpt2_dir[0], path)
    weights = load_file(str(path / "model.safetensors"))
    weights["transformer.wpe.weight"][3, :2] = float("nan")
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UsageError, match=r"not finite: tensor 'transformer.wpe.weight' holds 2 non-finite"):
        load_model(str(path), device="cpu", progress=False)
