"""A model that accelerate spreads over devices gives the same analyses as one device.

On CPU the devices are the host and the disk: a hand-written `device_map` puts one block of a
tiny Llama and of a tiny GPT-2 (saved with `save_pretrained`) on "disk", with an offload
folder, so accelerate loads its weights only for the length of each forward — the code path
that moves a block's tensors in and out around its forward. attribute, decompose, neurons,
composition and tune-lens on that model equal the plain load (`resstream.models.dispatch`).
`--device-map auto` runs end to end through the CLI, and the captured states are checked
against the memory before any forward (`resstream.api.state_memory`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import resstream
from resstream.cli.main import main
from resstream.errors import UsageError
from tests.test_models_adapters import char_tokenizer, tiny_model
from tests.test_models_loading import SENTENCES

pytest.importorskip("accelerate")

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")

TEXT = "the residual stream carries the input"

#: One block on disk, the other on the host; everything else on the host.
DEVICE_MAPS = {
    "llama": {
        "model.embed_tokens": "cpu",
        "model.layers.0": "disk",
        "model.layers.1": "cpu",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    },
    "gpt2": {
        "transformer.wte": "cpu",
        "transformer.wpe": "cpu",
        "transformer.h.0": "cpu",
        "transformer.h.1": "disk",
        "transformer.ln_f": "cpu",
        "lm_head": "cpu",
    },
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(SENTENCES * 20) + "\n", encoding="utf-8")
    return path


def _saved(case: str, path: Path) -> Path:
    """The tiny model of `case` and a tokenizer saved to `path` as a Hugging Face directory."""
    copy.deepcopy(tiny_model(case)).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=sorted(DEVICE_MAPS))
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(case, saved directory, plain model, the model with one block offloaded to disk)."""
    from transformers import AutoModelForCausalLM

    case = request.param
    path = _saved(case, tmp_path_factory.mktemp(case))
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    spread = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, device_map=DEVICE_MAPS[case], offload_folder=str(path / "offload")
    ).eval()
    assert any(p.device.type == "meta" for p in spread.parameters())  # the block is really offloaded
    return case, path, plain, spread


def _both(models, call):
    """`call(model)` for the plain model and the spread one, and the spread one's weights
    offloaded again after (nothing left resident)."""
    _, _, plain, spread = models
    results = call(plain), call(spread)
    assert any(p.device.type == "meta" for p in spread.parameters())
    return results


def test_attribute_at_every_level_equals_one_device(models) -> None:
    tokenizer = char_tokenizer()
    one, spread = _both(models, lambda m: resstream.attribute(TEXT, model=m, tokenizer=tokenizer, top=5))
    _same(one.to_dict(), spread.to_dict())
    assert one.heads and one.neurons and one.sources  # every level was scored


def test_decompose_equals_one_device_and_sums_back(models) -> None:
    tokenizer = char_tokenizer()

    def run(model):
        return resstream.decompose(TEXT, model=model, tokenizer=tokenizer, sources=True, neurons=True)

    one, spread = _both(models, run)
    torch.testing.assert_close(spread.vectors, one.vectors, rtol=0, atol=1e-6)
    torch.testing.assert_close(spread.state, one.state, rtol=0, atol=1e-6)
    torch.testing.assert_close(spread.vectors.sum(0), spread.state, rtol=1e-5, atol=1e-5)
    assert spread.relative <= 1e-5


def test_neurons_of_the_offloaded_block_equal_one_device(models, corpus: Path) -> None:
    tokenizer = char_tokenizer()
    layer = int(next(n for n, where in DEVICE_MAPS[models[0]].items() if where == "disk").split(".")[-1])

    def run(model):
        return resstream.neurons(
            model, tokenizer=tokenizer, dataset=str(corpus), num_seqs=3, seq_len=12, layer=layer, top=2
        )

    one, spread = _both(models, run)
    _same(one.to_dict(), spread.to_dict())


def test_composition_equals_one_device(models) -> None:
    one, spread = _both(models, lambda m: resstream.composition(m, tokenizer=char_tokenizer()))
    for name in ("q", "k", "v"):
        torch.testing.assert_close(getattr(spread, name), getattr(one, name), equal_nan=True)


def test_tune_lens_equals_one_device(models, corpus: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RESSTREAM_CACHE", str(tmp_path))  # the windows' token store of this corpus
    tokenizer = char_tokenizer()

    def run(model):
        return resstream.tune_lens(
            model,
            tokenizer=tokenizer,
            dataset=str(corpus),
            steps=3,
            tokens=3 * 2 * 12,
            seq_len=12,
            batch_size=2,
            eval_seqs=2,
        )

    one, spread = _both(models, run)
    assert spread.history == pytest.approx(one.history, rel=1e-5)
    for a, b in zip(one.lens.translators.parameters(), spread.lens.translators.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def _same(one: object, other: object) -> None:
    """Equal JSON-like trees, floats to float tolerance."""
    if isinstance(one, dict):
        assert isinstance(other, dict) and one.keys() == other.keys()
        for key in one:
            _same(one[key], other[key])
    elif isinstance(one, (list, tuple)):
        assert isinstance(other, (list, tuple)) and len(one) == len(other)
        for a, b in zip(one, other, strict=True):
            _same(a, b)
    elif isinstance(one, float):
        assert other == pytest.approx(one, rel=1e-5, abs=1e-6, nan_ok=True)
    else:
        assert one == other


# --------------------------------------------------------------------------- the CLI


def _cli(*args: str) -> int:
    return main([*args, "--quiet"])


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("case", "command"),
    [
        ("llama", "attribute"),
        pytest.param("gpt2", "attribute", marks=SLOW),
        pytest.param("llama", "neurons", marks=SLOW),
        pytest.param("gpt2", "neurons", marks=SLOW),
    ],
)
def test_cli_device_map_auto_equals_one_device(
    case: str, command: str, corpus: Path, tmp_path: Path, capsys
) -> None:
    path = _saved(case, tmp_path / case)
    args = {
        "attribute": ["--text", TEXT],
        "neurons": [
            "--dataset",
            str(corpus),
            "--num-seqs",
            "3",
            "--seq-len",
            "12",
            "--layer",
            "1",
            "--top",
            "2",
        ],
    }[command]
    outputs = []
    for placement in (["--device", "cpu"], ["--device-map", "auto"]):
        out = tmp_path / str(len(outputs))
        assert _cli(command, "--model", str(path), *args, *placement, "--out", str(out)) == 0, (
            capsys.readouterr().err
        )
        outputs.append(json.loads((out / f"{command}.json").read_text()))
    _same(*outputs)
    assert "device_map=auto" in (tmp_path / "1" / "run.json").read_text()


# --------------------------------------------------------------------------- the memory check


@pytest.fixture
def little_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 KB free, the weights' own check switched off: only the captured states are refused."""
    monkeypatch.setattr("resstream.resources.available_bytes", lambda device="cpu": 1000)
    monkeypatch.setattr("resstream.models.hf_sizes.check_fits", lambda *args, **kwargs: None)


@pytest.mark.usefixtures("little_memory")
def test_captured_states_that_do_not_fit_are_refused_in_one_line(
    models, corpus: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("RESSTREAM_CACHE", str(tmp_path))
    _, path, _, _ = models
    with pytest.raises(
        UsageError,
        match=r"^the text \(\d+ tokens\) needs ~[\d.]+ KB for the states captured "
        r"from 2 layers .*; 1.0 KB available on this machine; use a shorter `text`$",
    ):
        resstream.decompose(TEXT, model=str(path), device="cpu")
    sample = {"dataset": str(corpus), "seq_len": 12, "device": "cpu"}
    with pytest.raises(
        UsageError,
        match=r"^`num_seqs` 4 × `seq_len` 12 \(`batch_size` 2\) needs .*; "
        r"lower `num_seqs`, `seq_len` or `batch_size`$",
    ):
        resstream.attribute_corpus(str(path), num_seqs=4, batch_size=2, **sample)
    with pytest.raises(UsageError, match=r"^`batch_size` 3 × `seq_len` 12 needs .* from 1 layer "):
        resstream.neurons(str(path), num_seqs=3, layer=1, top=2, **sample)
    with pytest.raises(UsageError, match=r"^`batch_size` 2 × `seq_len` 12 needs .* from 3 layers"):
        resstream.tune_lens(str(path), steps=3, tokens=72, batch_size=2, eval_seqs=2, **sample)
    with pytest.raises(UsageError, match=r"^`batch_size` 2 × `seq_len` 12 needs .* from 3 layers"):
        resstream.shift(str(path), num_seqs=4, batch_size=2, **sample)


@pytest.mark.usefixtures("little_memory")
def test_cli_refuses_states_that_do_not_fit_naming_the_flags(
    models, corpus: Path, tmp_path: Path, capsys
) -> None:
    _, path, _, _ = models
    out = tmp_path / "out"
    args = ["--model", str(path), "--dataset", str(corpus), "--num-seqs", "4", "--seq-len", "12"]
    code = _cli("attribute", *args, "--batch-size", "2", "--device", "cpu", "--out", str(out))
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert len(err.strip().splitlines()) == 1
    assert "--num-seqs 4 × --seq-len 12 (--batch-size 2) needs" in err
    assert err.strip().endswith("lower --num-seqs, --seq-len or --batch-size")


def test_offloaded_weights_that_do_not_fit_are_refused_before_loading(models, monkeypatch) -> None:
    from resstream.models.dispatch import offloaded_bytes

    spread = models[3]
    block = sum(p.numel() * 4 for p in spread.parameters() if p.device.type == "meta")
    assert offloaded_bytes(spread) == {torch.device("cpu"): block}
    monkeypatch.setattr("resstream.resources.available_bytes", lambda device="cpu": 1000)
    with pytest.raises(
        UsageError, match=r"^a `device_map` that offloads weights needs ~[\d.]+ KB to load them"
    ):
        resstream.decompose(TEXT, model=spread, tokenizer=char_tokenizer())
    assert sum(p.numel() * 4 for p in spread.parameters() if p.device.type == "meta") == block  # untouched


def test_blocks_on_several_devices_are_refused_in_one_line() -> None:
    from types import SimpleNamespace

    from resstream.api.inputs import check_one_device

    view = SimpleNamespace(
        blocks=[SimpleNamespace(W_O=torch.zeros(1)), SimpleNamespace(W_O=torch.zeros(1, device="meta"))],
        W_U=torch.zeros(1),
    )
    with pytest.raises(UsageError, match=r"^`device_map` placed the blocks on several devices \(cpu, meta\)"):
        check_one_device(view)  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_half_the_blocks_on_the_gpu_and_half_on_the_cpu_equal_the_gpu(models) -> None:
    """The issue's device check: block 0 on the GPU, block 1 offloaded to the CPU (run on the
    GPU), against the whole model on the GPU."""
    from transformers import AutoModelForCausalLM

    case, path, _, _ = models
    placement = {name: 0 if where == "cpu" else "cpu" for name, where in DEVICE_MAPS[case].items()}
    split = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map=placement).eval()
    whole = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to("cuda").eval()
    tokenizer = char_tokenizer()
    one, spread = (resstream.attribute(TEXT, model=m, tokenizer=tokenizer, top=5) for m in (whole, split))
    _same(one.to_dict(), spread.to_dict())
    parts = [resstream.decompose(TEXT, model=m, tokenizer=tokenizer, neurons=True) for m in (whole, split)]
    torch.testing.assert_close(parts[1].vectors, parts[0].vectors, rtol=1e-5, atol=1e-5)


def test_an_offloaded_read_out_is_loaded_for_shift_and_tune_lens(
    tmp_path: Path, corpus: Path, monkeypatch
) -> None:
    """`device_map="auto"` on a full GPU offloads the last modules (final norm, unembedding):
    analyses that read no block still read those, so they are loaded for the analysis."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("RESSTREAM_CACHE", str(tmp_path / "cache"))
    path = _saved("llama", tmp_path / "llama")
    placement = {
        **DEVICE_MAPS["llama"],
        "model.norm": "disk",
        "lm_head": "disk",
        "model.embed_tokens": "disk",
    }
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    spread = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, device_map=placement, offload_folder=str(tmp_path / "offload")
    ).eval()
    assert spread.lm_head.weight.device.type == "meta"
    tokenizer = char_tokenizer()

    def shift(model):
        return resstream.shift(model, tokenizer=tokenizer, dataset=str(corpus), num_seqs=4, seq_len=12)

    assert shift(spread).to_dict() == shift(plain).to_dict()
    assert spread.lm_head.weight.device.type == "meta"  # offloaded again afterwards
