"""Lenses of the `tuned-lens` package (Belrose et al., EleutherAI) in resstream, and ours in its layout.

Spec (issue 24, item 5): `--decoder tuned:DIR` and `resstream.load_lens` read a lens the package
saved (config.json + params.pt: the state dict of one nn.Linear(d, d) per layer, "{i}.weight" and
"{i}.bias") and decode exactly what the package's formula gives: for HF hidden_states[i], i < L,
lm_head(ln_f(h + W_i h + b_i)), and the model's own logits for the last state. Parameters are read
without running code (torch.load with weights_only=True, or params.safetensors): a pickle that
would run code is refused in one line and does not run. A lens of another shape is refused naming
both shapes. `tune-lens --export tuned-lens DIR` writes our lens in the package's layout, which
reads back as the same lens. The package need not be installed: `write_package_lens` below writes
what its `TunedLens.save` writes (tuned_lens/nn/lenses.py).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import resstream
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.decoding.tuned_lens import TunedLens, load_lens, model_signature
from resstream.analysis.decoding.tuned_lens_package import unembed_hash
from resstream.capture import residual_states
from resstream.cli.main import main
from resstream.errors import UsageError
from resstream.models import as_loaded, load_model
from resstream.notices import ResstreamNotice
from tests.cli_support import expect_usage_error

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")

TEXT = "the residual stream carries the input token forward"
FAST = ["--device", "cpu", "--quiet"]
#: The fields of the package's `TunedLensConfig`, which its config.json holds.
CONFIG_FIELDS = {
    "base_model_name_or_path",
    "d_model",
    "num_hidden_layers",
    "bias",
    "base_model_revision",
    "unembed_hash",
    "lens_type",
}
LAYERS, D_MODEL = 3, 32


# --------------------------------------------------------------------------- the package, by hand


def write_package_lens(
    directory: Path,
    seed: int,
    *,
    layers: int = LAYERS,
    d_model: int = D_MODEL,
    unembed: str | None = None,
    base_model: str = "tiny-gpt2",
) -> nn.ModuleList:
    """What the package's `TunedLens.save(directory)` writes: its config (`TunedLensConfig.to_dict`)
    as config.json and `torch.save(self.layer_translators.state_dict())` as params.pt, for random
    translators (nn.Linear's own initialisation, seeded). Returns the translators."""
    torch.manual_seed(seed)
    translators = nn.ModuleList([nn.Linear(d_model, d_model, bias=True) for _ in range(layers)])
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(translators.state_dict(), directory / "params.pt")
    config = {
        "base_model_name_or_path": base_model,
        "d_model": d_model,
        "num_hidden_layers": layers,
        "bias": True,
        "base_model_revision": None,
        "unembed_hash": unembed,
        "lens_type": "linear_tuned_lens",
    }
    (directory / "config.json").write_text(json.dumps(config))
    return translators


def package_logits(model, translators: nn.ModuleList, ids: torch.Tensor) -> list[torch.Tensor]:
    """The package's decoding of every layer (`PredictionTrajectory.from_lens_and_model`): the
    lens on hidden_states[i] for i < L, `unembed(h + translator_i(h))` with unembed = lm_head ∘
    ln_f, then the model's own logits for the last state."""
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        lens = [
            model.lm_head(model.transformer.ln_f(h + translators[i](h)))[0]
            for i, h in enumerate(out.hidden_states[:-1])
        ]
    return [*lens, out.logits[0]]


def package_unembed_hash(matrix: torch.Tensor) -> str:
    """The package's `tensor_hash` of its unembedding weight (tuned_lens/utils.py)."""
    return hashlib.sha256(str.encode(np.array_str(matrix.detach().numpy(), precision=1))).hexdigest()


# --------------------------------------------------------------------------- fixtures


def tiny_gpt2(tokenizer, seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        n_layer=LAYERS,
        n_embd=D_MODEL,
        n_head=4,
        vocab_size=len(tokenizer),
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def tokenizer():
    from resstream.data import train_bpe
    from tests.test_models_loading import SENTENCES

    return train_bpe(SENTENCES, vocab_size=300)


@pytest.fixture(scope="module")
def model(tokenizer):
    """A tiny Hugging Face GPT-2: 3 layers, d_model 32, in memory."""
    return tiny_gpt2(tokenizer, seed=0)


@pytest.fixture(scope="module")
def view(model, tokenizer):
    return as_loaded(model, tokenizer).view


@pytest.fixture(scope="module")
def ids(tokenizer) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(TEXT)])


@pytest.fixture(scope="module")
def model_dir(model, tokenizer, tmp_path_factory) -> Path:
    """The tiny GPT-2 saved for the command line."""
    path = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join([TEXT, "each block writes its update into the stream"] * 10), encoding="utf-8")
    return path


@pytest.fixture
def no_plots(monkeypatch):
    """Skip rendering PNGs in tests that only read shift.json."""
    import resstream.reporting.shift as rendering

    for name in ("plot_match_rates", "plot_similarity", "plot_shift_depths", "plot_comparison"):
        monkeypatch.setattr(rendering, name, lambda *args, **kwargs: None)


def random_lens(view, name: str, seed: int = 5) -> TunedLens:
    """A resstream lens with random translators."""
    lens = TunedLens.zero(view, name)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lens.translators.weight.copy_(torch.randn(lens.translators.weight.shape, generator=generator) * 0.1)
        lens.translators.bias.copy_(torch.randn(lens.translators.bias.shape, generator=generator))
    return lens


def resstream_logits(view, lens: TunedLens, ids: torch.Tensor) -> list[torch.Tensor]:
    """resstream's tuned decoder at every layer 0..L, on h_0..h_L."""
    decoder = decoder_of(view, "tuned", lens)
    with torch.no_grad():
        states = residual_states(view, ids)[:, 0]
        return [decoder.at(layer).logits(states[layer]) for layer in range(view.n_layers + 1)]


def one_line_error(call) -> str:
    with pytest.raises(UsageError) as caught:
        call()
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    return message


# --------------------------------------------------------------------------- decoding


def test_a_package_lens_decodes_as_the_package_formula(model, view, ids, tmp_path) -> None:
    translators = write_package_lens(tmp_path / "lens", seed=1)
    expected = package_logits(model, translators, ids)
    got = resstream_logits(view, resstream.load_lens(tmp_path / "lens"), ids)
    assert len(got) == len(expected) == LAYERS + 1
    for layer, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=f"layer {layer}")
    plain = resstream_logits(view, TunedLens.zero(view, "zero"), ids)
    assert all((g - p).abs().max() > 0.1 for g, p in zip(got[:-1], plain[:-1], strict=True))  # a real lens


def test_the_lens_api_reads_a_package_lens_through_tuned_dir(model, tokenizer, ids, tmp_path) -> None:
    translators = write_package_lens(tmp_path / "lens", seed=2)
    probs = [logits.softmax(-1) for logits in package_logits(model, translators, ids)]
    result = resstream.lens(
        TEXT, model=model, tokenizer=tokenizer, decoder=f"tuned:{tmp_path / 'lens'}", top_k=3
    )
    targets = ids[0].tolist()
    for trajectory in result.trajectories[:-1]:
        expected = [float(p[trajectory.position, targets[trajectory.position + 1]]) for p in probs]
        assert trajectory.next_probs == pytest.approx(expected, abs=1e-5)
        best = [float(p[trajectory.position].max()) for p in probs]
        assert [probs_of_layer[0] for probs_of_layer in trajectory.top_probs] == pytest.approx(best, abs=1e-5)


def test_the_whole_lens_state_dict_and_safetensors_are_read_alike(view, ids, tmp_path) -> None:
    base = tmp_path / "base"
    translators = write_package_lens(base, seed=3)
    expected = resstream_logits(view, load_lens(base), ids)
    prefixed = tmp_path / "prefixed"  # torch.save(lens.state_dict()): translators and the unembedding
    shutil.copytree(base, prefixed)
    state = {f"layer_translators.{k}": v for k, v in translators.state_dict().items()}
    torch.save({**state, "unembed.unembedding.weight": torch.zeros(7, D_MODEL)}, prefixed / "params.pt")
    safetensors = tmp_path / "safetensors"
    shutil.copytree(base, safetensors)
    from safetensors.torch import save_file

    save_file(
        {k: v.contiguous() for k, v in translators.state_dict().items()},
        str(safetensors / "params.safetensors"),
    )
    (safetensors / "params.pt").write_bytes(b"not read: params.safetensors comes first")
    for path in (prefixed, safetensors):
        for ours, theirs in zip(resstream_logits(view, load_lens(path), ids), expected, strict=True):
            assert torch.equal(ours, theirs), path.name


# --------------------------------------------------------------------------- safety


class RunsCode:
    """A pickled object whose unpickling calls `open(marker, "w")`: it creates a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickle_that_would_run_code_is_refused_and_does_not_run(tmp_path, capsys) -> None:
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(RunsCode(proof))).close()  # the payload is live: unpickled, it writes
    assert proof.exists()
    marker = tmp_path / "ran"
    lens = tmp_path / "lens"
    write_package_lens(lens, seed=4)
    torch.save({"0.weight": torch.zeros(D_MODEL, D_MODEL), "0.bias": RunsCode(marker)}, lens / "params.pt")
    message = one_line_error(lambda: resstream.load_lens(lens))
    assert str(lens) in message and "params.pt is not a plain state dict of tensors" in message, message
    assert "io.open" in message and "refused without running" in message, message
    err = expect_usage_error(
        ["shift", *FAST, "--decoder", f"tuned:{lens}"], tmp_path / "out", capsys, "params.pt"
    )
    assert "weights_only=True" in err
    assert not marker.exists()


@pytest.mark.parametrize(
    ("damage", "pattern"),
    [
        ("no params", "holds config.json but no params.pt or params.safetensors"),
        ("garbage params", "params.pt is not a plain state dict of tensors"),
        ("truncated params", "params.pt cannot be read (truncated or corrupt)"),
        ("a list", "params.pt holds list, expected a state dict of tensors"),
        ("missing bias", "params.pt lacks 2.bias"),
        (
            "extra layer",
            "params.pt holds translators for 4 layers (layers 0..3), config.json num_hidden_layers 3",
        ),
        ("foreign key", "params.pt holds entries that are not layer translators ('head.weight')"),
        ("wrong shape", "params.pt has 1.weight of shape (32, 16), expected (32, 32) for d_model 32"),
        ("lens type", "config.json has lens_type 'mlp_lens'; resstream reads 'linear_tuned_lens'"),
        ("bad json", "config.json is not valid JSON"),
        ("no d_model", "config.json lacks 'd_model': not the config of a tuned-lens package lens"),
        ("zero layers", "config.json has num_hidden_layers 0, expected a positive integer"),
        (
            "a model",
            "lacks 'base_model_name_or_path', 'd_model': not the config of a tuned-lens package lens",
        ),
    ],
)
def test_a_damaged_package_lens_is_one_line(tmp_path, damage: str, pattern: str) -> None:
    lens = tmp_path / "lens"
    state = write_package_lens(lens, seed=6).state_dict()
    config = json.loads((lens / "config.json").read_text())
    params = lens / "params.pt"
    if damage == "no params":
        params.unlink()
    elif damage == "garbage params":
        params.write_bytes(b"\x80\x04garbage")
    elif damage == "truncated params":
        params.write_bytes(params.read_bytes()[:-200])  # a copy cut short
    elif damage == "a list":
        torch.save(list(state.values()), params)
    elif damage == "missing bias":
        torch.save({k: v for k, v in state.items() if k != "2.bias"}, params)
    elif damage == "extra layer":
        torch.save({**state, "3.weight": state["0.weight"], "3.bias": state["0.bias"]}, params)
    elif damage == "foreign key":
        torch.save({**state, "head.weight": state["0.weight"]}, params)
    elif damage == "wrong shape":
        torch.save({**state, "1.weight": torch.zeros(D_MODEL, 16)}, params)
    elif damage == "lens type":
        (lens / "config.json").write_text(json.dumps({**config, "lens_type": "mlp_lens"}))
    elif damage == "bad json":
        (lens / "config.json").write_text("{")
    elif damage == "no d_model":
        (lens / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "d_model"}))
    elif damage == "zero layers":
        (lens / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 0}))
    elif damage == "a model":  # tuned:DIR naming a Hugging Face model's directory
        (lens / "config.json").write_text(
            json.dumps({"model_type": "gpt2", "n_embd": 32, "num_hidden_layers": 3})
        )
    message = one_line_error(lambda: load_lens(lens))
    assert pattern in message and str(lens) in message, message


def test_a_directory_of_neither_layout_names_both(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    message = one_line_error(lambda: resstream.load_lens(tmp_path / "empty"))
    assert "lens.json + translators.safetensors" in message and "config.json + params.pt" in message, message


# --------------------------------------------------------------------------- which model


def test_a_lens_of_another_shape_is_refused_naming_both(
    model, tokenizer, view, model_dir, tmp_path, capsys
) -> None:
    wide = tmp_path / "wide"
    write_package_lens(wide, seed=7, d_model=64)
    deep = tmp_path / "deep"
    write_package_lens(deep, seed=7, layers=4)
    message = one_line_error(
        lambda: resstream.lens(TEXT, model=model, tokenizer=tokenizer, decoder=f"tuned:{wide}")
    )
    assert "d_model 64" in message and "d_model 32" in message and str(wide) in message, message
    message = one_line_error(lambda: resstream.load_lens(deep, model=model))
    assert "4 layers" in message and "3 layers" in message, message
    expect_usage_error(
        ["shift", *FAST, "--model", str(model_dir), "--seq-len", "16", "--decoder", f"tuned:{wide}"],
        tmp_path / "out",
        capsys,
        "d_model 64",
        "d_model 32",
    )


def test_the_unembed_hash_is_the_packages(view) -> None:
    generator = torch.Generator().manual_seed(0)
    shapes = [(50, 20), (6, 9), (4, 400), (400, 4)]  # 1,000 elements and fewer are printed whole
    for matrix in (view.W_U.detach(), *(torch.randn(shape, generator=generator) for shape in shapes)):
        assert unembed_hash(matrix) == package_unembed_hash(matrix)
        assert unembed_hash(matrix.half()) == package_unembed_hash(matrix.half())


def test_another_unembed_hash_is_said_once(view, ids, tmp_path) -> None:
    own = tmp_path / "own"
    write_package_lens(own, seed=8, unembed=package_unembed_hash(view.W_U.detach()))
    other = tmp_path / "other"
    write_package_lens(other, seed=8, unembed="0" * 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resstream_logits(view, load_lens(own), ids)
        lens = load_lens(other)
        resstream_logits(view, lens, ids)
        resstream_logits(view, lens, ids)
    notices = [str(w.message) for w in caught if issubclass(w.category, ResstreamNotice)]
    assert len(notices) == 1 and "records the unembedding hash 0000000000000000" in notices[0], notices


def test_a_lens_bound_to_a_model_is_refused_on_another(model, view, tokenizer, tmp_path) -> None:
    write_package_lens(tmp_path / "lens", seed=9)
    other_view = as_loaded(tiny_gpt2(tokenizer, seed=1), tokenizer).view  # the same shapes, other weights
    unbound = resstream.load_lens(tmp_path / "lens")
    assert unbound.signature == {} and unbound.fingerprint == "unrecorded"
    assert (
        repr(unbound)
        == "TunedLens(tiny-gpt2; 3 layers × d_model 32; tuned-lens package lens, checked by shapes)"
    )
    decoder_of(other_view, "tuned", unbound)  # shapes alone: accepted
    bound = resstream.load_lens(tmp_path / "lens", model=model)
    assert (bound.fingerprint, bound.signature) == model_signature(view)
    assert repr(bound) == f"TunedLens(tiny-gpt2; 3 layers × d_model 32; fingerprint {bound.fingerprint})"
    assert torch.equal(bound.translators.weight, unbound.translators.weight)
    decoder_of(view, "tuned", bound)
    saved = load_lens(bound.save(tmp_path / "saved"))
    for lens in (bound, saved):
        message = one_line_error(lambda lens=lens: decoder_of(other_view, "tuned", lens))
        assert f"expects fingerprint {bound.fingerprint}" in message, message


# --------------------------------------------------------------------------- export


def test_an_exported_lens_is_the_packages_and_reads_back_as_it_was(model, view, ids, tmp_path) -> None:
    lens = random_lens(view, "tiny-gpt2")
    lens.record = {"steps": 3}
    out = lens.save(tmp_path / "export", layout="tuned-lens")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "params.pt", "resstream-lens.json"]
    config = json.loads((out / "config.json").read_text())
    assert set(config) == CONFIG_FIELDS and config["lens_type"] == "linear_tuned_lens"
    assert (config["base_model_name_or_path"], config["d_model"], config["num_hidden_layers"]) == (
        "tiny-gpt2",
        32,
        3,
    )
    state = torch.load(out / "params.pt", weights_only=True)  # what the package loads
    translators = nn.ModuleList([nn.Linear(D_MODEL, D_MODEL) for _ in range(LAYERS)])
    translators.load_state_dict(state)  # strict, as the package's `load_state_dict`
    for ours, theirs in zip(
        resstream_logits(view, lens, ids), package_logits(model, translators, ids), strict=True
    ):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    back = resstream.load_lens(out)
    assert torch.equal(back.translators.weight, lens.translators.weight)
    assert torch.equal(back.translators.bias, lens.translators.bias)
    assert (back.fingerprint, back.signature, back.model, back.record) == (
        lens.fingerprint,
        lens.signature,
        lens.model,
        lens.record,
    )
    (out / "resstream-lens.json").unlink()  # as the package's own save would leave it
    bare = resstream.load_lens(out)
    assert torch.equal(bare.translators.weight, lens.translators.weight) and bare.model == "tiny-gpt2"
    again = load_lens(bare.save(tmp_path / "ours"))  # a package lens in resstream's layout
    assert torch.equal(again.translators.bias, lens.translators.bias) and again.signature == {}


def test_cli_export_then_shift_reads_the_exported_lens(model_dir, corpus, tmp_path, capsys, no_plots) -> None:
    loaded = load_model(str(model_dir), device="cpu")
    lens_dir = random_lens(loaded.view, str(model_dir)).save(tmp_path / "lens")
    export = tmp_path / "export"
    assert main(["tune-lens", "--out", str(lens_dir), "--export", "tuned-lens", str(export)]) == 0
    assert "tuned-lens layout" in capsys.readouterr().out
    assert {p.name for p in export.iterdir()} >= {"config.json", "params.pt"}
    reports = {}
    for name, source in (("ours", lens_dir), ("exported", export)):
        args = ["--model", str(model_dir), "--dataset", str(corpus), "--num-seqs", "2", "--seq-len", "12"]
        code = main(["shift", *FAST, *args, "--decoder", f"tuned:{source}", "--out", str(tmp_path / name)])
        assert code == 0, capsys.readouterr().err
        reports[name] = json.loads((tmp_path / name / "shift.json").read_text())["models"][0]
    assert reports["exported"] == reports["ours"] and reports["ours"]["decoding"].startswith("tuned lens")


def test_cli_export_refusals_write_nothing(tmp_path, view, capsys) -> None:
    lens_dir = random_lens(view, "tiny").save(tmp_path / "lens")
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    (crowded / "notes.txt").write_text("mine")
    cases = [
        (["--export", "tuned-lenz", str(tmp_path / "a")], "did you mean 'tuned-lens'", tmp_path / "a"),
        (
            ["--export", "tuned-lens", str(tmp_path / "b"), "--eval"],
            "cannot be combined with --eval",
            tmp_path / "b",
        ),
        (["--export", "tuned-lens", str(crowded)], "holds other files (notes.txt)", crowded),
        (["--export", "tuned-lens", str(lens_dir)], "is --out itself", lens_dir),
    ]
    for args, pattern, target in cases:
        before = sorted(p.name for p in target.iterdir()) if target.exists() else None
        capsys.readouterr()
        code = main(["tune-lens", "--out", str(lens_dir), *args])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and pattern in err, err
        assert (sorted(p.name for p in target.iterdir()) if target.exists() else None) == before
