"""load_model: the reference model, resstream runs, local Hugging Face directories, bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from resstream.assets import reference_model_dir
from resstream.errors import UsageError
from resstream.models import check_model, load_model
from tests.test_data_tokenizer import with_custom_tokenizer_code

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
        ({"dtype": "float64"}, r"unknown `dtype` 'float64'.*allowed: auto, float32, bfloat16, float16"),
        ({"device": "tpu"}, r"unknown `device` 'tpu'; allowed: auto, cpu, cuda"),
        ({"device_map": "everywhere"}, r"unknown `device_map` 'everywhere'.*allowed: auto"),
    ],
)
def test_bad_options(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_model(None, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu() -> None:
    with pytest.raises(UsageError, match=r"`device` 'cuda' is not available"):
        load_model(None, device="cuda")


def test_device_map_needs_accelerate(gpt2_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec  # accelerate is in the test extra: hide it
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else find_spec(name, *a)
    )
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


def test_an_analysis_that_reads_no_text_takes_a_folder_without_tokenizer(tmp_path: Path) -> None:
    import resstream
    from resstream.analysis.decoding.tuned_lens import TunedLens

    _tiny_gpt2(300).save_pretrained(tmp_path / "model")
    assert check_model(str(tmp_path / "model"), tokenizer=False) is not None
    loaded = load_model(str(tmp_path / "model"), device="cpu", tokenizer=False)
    assert loaded.tokenizer is None and loaded.view.n_layers == 2
    lens = TunedLens.zero(loaded.view, "tiny").save(tmp_path / "lens")
    assert resstream.load_lens(lens, model=str(tmp_path / "model")).model == "tiny"
    assert resstream.composition(str(tmp_path / "model"), samples=8).n_layers == 2
    with pytest.raises(UsageError, match=r"has no tokenizer"):  # a text analysis still needs one
        resstream.shift(str(tmp_path / "model"), num_seqs=1)


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
        r"cohere, falcon, gemma, gemma2, gemma3_text, gpt2, gpt_neox, gpt_oss, granite, llama, mistral, "
        r"mixtral, olmo2, olmo3, phi, phi3, qwen2, qwen3, qwen3_moe, resstream, smollm3 "
        r"\(to add one, see docs/adding-a-model.md\)",
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


# ----------------------------------------------------------------- sizes of a config
@pytest.fixture
def machine_of_12gb(monkeypatch: pytest.MonkeyPatch) -> None:
    from resstream import resources

    monkeypatch.setattr(resources, "host_available_bytes", lambda: 12_300_000_000)


def _with_config(source: Path, target: Path, config_file: str, **changes) -> Path:
    """A copy of model directory `source` whose `config_file` has `changes` (the weights are
    left out: nothing here may read them)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((source / config_file).read_text())
    section = config["config"]["model"] if config_file == "model.json" else config
    section.update(changes)
    (target / config_file).write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_layer": 1_000_000_000}, r"config.json' with n_layer 1000000000 and n_embd 32 needs ~56.2 TB"),
        ({"n_embd": 1_000_000_000}, r"config.json' with n_embd 1000000000 and n_layer 2 needs ~\d+.\d EB"),
        ({"vocab_size": 10**12}, r"config.json' with vocab_size 1000000000000 and n_embd 32 needs ~128.0 TB"),
        (
            {"n_positions": 10**12},
            r"config.json' with n_positions 1000000000000 and n_embd 32 needs ~128.0 TB",
        ),
        ({"vocab_size": -5}, r"config.json' has vocab_size -5; allowed: an integer >= 1$"),
        ({"n_head": 0}, r"config.json' has n_head 0; allowed: an integer >= 1$"),
        ({"n_inner": -1}, r"config.json' has n_inner -1; allowed: an integer >= 1$"),
    ],
)
def test_absurd_hugging_face_configs_are_refused_before_loading(
    tmp_path: Path, gpt2_dir, machine_of_12gb, changes: dict, message: str
) -> None:
    from resstream.models import check_model

    bad = _with_config(gpt2_dir[0], tmp_path / "bad", "config.json", **changes)
    for load in (check_model, load_model):
        with pytest.raises(UsageError, match=message):
            load(str(bad))


def test_absurd_resstream_run_config_is_refused_before_building(tmp_path: Path, machine_of_12gb) -> None:
    from resstream.models import check_model
    from resstream.training.checkpoint import load_run

    bad = _with_config(reference_model_dir(), tmp_path / "run", "model.json", n_layer=1_000_000_000)
    message = r"model.json' with n_layer 1000000000 and d_model 128 needs ~\d+.\d TB for the weights"
    for load in (check_model, load_model, load_run):
        with pytest.raises(UsageError, match=message):
            load(str(bad))


def test_a_saved_config_out_of_range_names_its_file_not_a_flag(tmp_path: Path) -> None:
    from resstream.training.checkpoint import load_run

    bad = _with_config(reference_model_dir(), tmp_path / "run", "model.json", vocab_size=-5)
    with pytest.raises(
        UsageError, match=r"model.json' holds a bad config: vocab_size -5 is outside \[0, 2\*\*32\]"
    ):
        load_run(bad)


def test_a_7b_model_in_bfloat16_passes_where_it_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-2-7B's shape: 6.7e9 parameters, 13.5 GB in bfloat16: judged, never refused where it fits."""
    from transformers import LlamaConfig

    from resstream import resources
    from resstream.models import check_model

    LlamaConfig(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        vocab_size=32000,
    ).save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(resources, "host_available_bytes", lambda: 16_000_000_000)
    check_model(str(tmp_path), dtype="bfloat16", device="cpu")
    with pytest.raises(
        UsageError, match=r"with intermediate_size 11008 and hidden_size 4096 needs ~21.2 GB .*\(float32\)"
    ):
        check_model(str(tmp_path), dtype="float32", device="cpu")


def test_weights_missing_for_the_configs_layers_are_refused(tmp_path: Path, gpt2_dir) -> None:
    """A config.json with more layers than the weights hold: refused, not initialised at random."""
    bad = _with_config(gpt2_dir[0], tmp_path / "bad", "config.json", n_layer=3)
    (bad / "model.safetensors").write_bytes((gpt2_dir[0] / "model.safetensors").read_bytes())
    expected = (
        r"^model '.*bad': its weights lack transformer.h.2.[\w.]+ and 11 more that its config.json asks"
    )
    with pytest.raises(UsageError, match=expected):
        load_model(str(bad))


@pytest.mark.slow
def test_transformers_reports_are_silenced(tmp_path: Path, gpt2_dir) -> None:
    """Only our one line reaches stderr: transformers' multi-line load report is kept quiet."""
    import subprocess
    import sys

    bad = _with_config(gpt2_dir[0], tmp_path / "bad", "config.json", n_layer=3, vocab_size=-5)
    (bad / "model.safetensors").write_bytes((gpt2_dir[0] / "model.safetensors").read_bytes())
    wrong = _with_config(gpt2_dir[0], tmp_path / "wrong", "config.json", n_layer=3)
    (wrong / "model.safetensors").write_bytes((gpt2_dir[0] / "model.safetensors").read_bytes())
    for model in (bad, wrong):
        command = [
            "shift",
            "--model",
            str(model),
            "--out",
            str(tmp_path / "out"),
            "--quiet",
            "--seq-len",
            "16",
        ]
        done = subprocess.run(
            [sys.executable, "-m", "resstream", *command], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("resstream: error: "), done.stderr


# --------------------------------------------------------------------------- a tokenizer's own code


def _with_tokenizer_code(gpt2_dir, target: Path, marker: Path) -> Path:
    """A copy of the tiny GPT-2 folder whose tokenizer asks for its own class (which writes `marker`)."""
    shutil.copytree(gpt2_dir[0], target)
    return with_custom_tokenizer_code(target, marker)


def test_a_model_whose_tokenizer_needs_its_own_code_is_refused_without_trust_remote_code(
    gpt2_dir, tmp_path: Path
) -> None:
    """Hugging Face would give the model a plain fast tokenizer in place of its own, silently."""
    from resstream.models import check_model

    marker = tmp_path / "imported"
    hf = _with_tokenizer_code(gpt2_dir, tmp_path / "hf", marker)
    config = re.escape(repr(str(hf / "tokenizer_config.json")))
    expected = (
        rf"^the tokenizer of model {re.escape(repr(str(hf)))} needs custom code: the auto_map of "
        rf"{config} names 'tokenization_custom\.CustomTokenizerFast'; "
        r"allowed only with `trust_remote_code=True`, if you trust it$"
    )
    with pytest.raises(UsageError, match=expected):
        check_model(str(hf))
    with pytest.raises(UsageError, match=expected):
        load_model(str(hf))
    assert check_model(str(hf), trust_remote_code=True) == 32  # reads JSON only: nothing is imported
    assert not marker.exists()


@pytest.mark.slow
def test_with_trust_remote_code_shift_runs_with_the_tokenizers_own_class(gpt2_dir, tmp_path: Path) -> None:
    from tests.test_train import corpus_text

    marker = tmp_path / "imported"
    hf = _with_tokenizer_code(gpt2_dir, tmp_path / "hf", marker)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(), encoding="utf-8")
    command = ["shift", "--model", str(hf), "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "8"]
    command += ["--quiet", "--out", str(tmp_path / "out"), "--trust-remote-code"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    done = subprocess.run(
        [sys.executable, "-m", "resstream", *command], capture_output=True, text=True, env=env, timeout=300
    )
    assert "needs custom code" not in done.stderr
    assert done.returncode == 0, done.stderr
    assert marker.exists() and any((tmp_path / "out").iterdir())
