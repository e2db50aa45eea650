"""Tuned-lens translators (resstream.analysis.decoding.tuned_lens) and the `tuned` decoder kind.

Spec (issue 12): one affine translator per layer 0..L−1, h ↦ h + A_l h + b_l, the last layer's
the identity; A and b start at zero, so an untrained lens IS the logit lens, bit for bit (in
the decoder, in `shift` and in `lens`); saved as safetensors + JSON and loaded back exactly;
refused, naming the fingerprint it expects, on any model but its own (a bfloat16 load of the
same checkpoint is its own). Several decoders in one `shift` read one forward pass and give
what separate runs give.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

import resstream
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.decoding.tuned_lens import FORMAT, Translators, TunedLens, load_lens, model_signature
from resstream.api.decoders import decoder_spec, decoder_specs
from resstream.capture import residual_states
from resstream.errors import UsageError
from resstream.models import as_loaded, load_model

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")

TEXT = "the residual stream carries the input token forward to the last layer"
#: Plain-text lines for a small corpus (the 5 MB built-in one takes seconds to tokenise).
CORPUS = "\n".join(
    [
        "to be or not to be that is the question",
        "whether tis nobler in the mind to suffer the slings and arrows of outrageous fortune",
        "or to take arms against a sea of troubles and by opposing end them",
        "now is the winter of our discontent made glorious summer by this sun of york",
    ]
    * 6
)


@pytest.fixture(scope="module")
def reference():
    """The built-in reference model (6 layers, d_model 128, vocab 4096), float32 on the CPU."""
    return load_model(None, device="cpu", progress=False)


@pytest.fixture(scope="module")
def states(reference):
    """h_0..h_L of TEXT under the reference model, (L+1, positions, d)."""
    ids = torch.tensor([reference.tokenizer.encode(TEXT)])
    with torch.inference_mode():
        return residual_states(reference.view, ids)[:, 0].clone()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(CORPUS + "\n", encoding="utf-8")
    return path


def other_model(reference, seed: int = 1):
    """A freshly initialised model of the reference's very shape (another seed): not its model."""
    from resstream.training.model import GPT

    torch.manual_seed(seed)
    return as_loaded(GPT(reference.view.model.config).eval(), reference.tokenizer, name="other")


def random_lens(view, model: str = "reference", seed: int = 0, scale: float = 0.5) -> TunedLens:
    """A lens of `view` with random non-zero translators (large enough to change decodings)."""
    lens = TunedLens.zero(view, model)
    fill_random(lens.translators, seed, scale)
    return lens


def fill_random(translators: Translators, seed: int, scale: float = 0.5) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        d = translators.d_model
        translators.weight.copy_(scale * torch.randn(translators.weight.shape, generator=g) / math.sqrt(d))
        translators.bias.copy_(scale * torch.randn(translators.bias.shape, generator=g))


# --------------------------------------------------------------------------- translators


def test_translators_start_at_zero_and_refuse_empty_shapes() -> None:
    translators = Translators(3, 4)
    assert (translators.n_layers, translators.d_model) == (3, 4)
    assert translators.weight.shape == (3, 4, 4) and translators.bias.shape == (3, 4)
    assert not translators.weight.any() and not translators.bias.any()
    assert translators.weight.dtype == translators.bias.dtype == torch.float32
    for layers, d in ((0, 4), (3, 0)):
        with pytest.raises(ValueError, match="n_layers >= 1 and d_model >= 1"):
            Translators(layers, d)


def test_translate_by_hand() -> None:
    # L = 2, d = 2. Layer 0: A = [[1, 2], [0, -1]], b = (0.5, -1); layer 1: A swaps, b = 0.
    # h = (1, 2): A h = (5, -2), so h + A h + b = (6.5, -1); h = (3, -1): A h = (1, 1) -> (4.5, -1).
    # Layer 1: h + swap(h) = (3, 3) and (2, 2). Layer 2 = L: the identity.
    translators = Translators(2, 2)
    with torch.no_grad():
        translators.weight[0] = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
        translators.bias[0] = torch.tensor([0.5, -1.0])
        translators.weight[1] = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    h = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    with torch.no_grad():
        assert torch.equal(translators.translate(h, 0), torch.tensor([[6.5, -1.0], [4.5, -1.0]]))
        assert torch.equal(translators.translate(h, 1), torch.tensor([[3.0, 3.0], [2.0, 2.0]]))
        assert translators.translate(h, 2) is h
        # computed in float32, returned in the state's dtype
        half = translators.translate(h.to(torch.bfloat16), 0)
        assert half.dtype == torch.bfloat16 and torch.equal(
            half.float(), torch.tensor([[6.5, -1.0], [4.5, -1.0]])
        )
    for layer in (-1, 3):
        with pytest.raises(ValueError, match=f"layer {layer} is outside 0..2"):
            translators.translate(h, layer)


def test_translate_all_equals_translate_per_layer() -> None:
    translators = Translators(3, 5)
    fill_random(translators, seed=3, scale=1.0)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for depth, shape in ((3, (4, 6, 5)), (2, (7, 5))):  # all layers, and fewer (batch dims vary)
            stacked = torch.randn(depth, *shape, generator=g)
            together = translators.translate_all(stacked)
            assert together.shape == stacked.shape and together.dtype == torch.float32
            for layer in range(depth):
                one = translators.translate(stacked[layer], layer)
                torch.testing.assert_close(together[layer], one, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- the decoder kind


def test_zero_translators_decode_exactly_like_the_logit_lens(reference, states) -> None:
    view = reference.view
    logit = decoder_of(view)
    tuned = decoder_of(view, "tuned", TunedLens.zero(view, "reference"))
    exact_logit, exact_tuned = logit.exact(), tuned.exact()
    ids = torch.stack([torch.arange(states.shape[1]), torch.arange(states.shape[1]).flip(0)], 1) * 7
    assert logit.at(3) is logit  # one decoder for every layer
    with torch.no_grad():
        for layer in range(view.n_layers + 1):
            h = states[layer]
            assert tuned.at(layer).layer == layer
            assert torch.equal(tuned.at(layer).logits(h), logit.logits(h)), layer
            scorer = exact_tuned.at(layer)
            assert scorer.engine is exact_tuned.engine  # one rank engine, shared by the layers
            for got, want in zip(scorer.ranks(h, ids), exact_logit.ranks(h, ids), strict=True):
                assert torch.equal(got, want), layer
            for got, want in zip(scorer.top_k(h, 5), exact_logit.top_k(h, 5), strict=True):
                assert torch.equal(got, want), layer
            assert torch.equal(scorer.scores(h, ids), exact_logit.scores(h, ids)), layer


def test_a_tuned_decoder_decodes_the_translated_state(reference, states) -> None:
    view = reference.view
    lens = random_lens(view)
    tuned, logit = decoder_of(view, "tuned", lens), decoder_of(view)
    with torch.no_grad():
        for layer in range(view.n_layers):
            translated = lens.translators.translate(states[layer], layer)
            assert torch.equal(tuned.at(layer).logits(states[layer]), logit.logits(translated))
            assert not torch.equal(tuned.at(layer).logits(states[layer]), logit.logits(states[layer]))
        last = view.n_layers  # h_L is decoded as it is, whatever the translators
        assert torch.equal(tuned.at(last).logits(states[last]), logit.logits(states[last]))
    with pytest.raises(ValueError, match=r"one layer at a time: use decoder.at\(layer\)"):
        tuned.logits(states[0])
    assert lens.fingerprint in tuned.description and "h + A_l h + b_l" in tuned.description
    assert tuned.description.endswith(logit.description)


# --------------------------------------------------------------------------- saving, loading


def test_save_and_load_round_trip_is_exact(reference, tmp_path) -> None:
    lens = random_lens(reference.view, seed=5)
    lens.record = {"dataset": "shakespeare", "steps": 3, "kl_bits_per_step": [2.5, 1.25, 0.625]}
    out = lens.save(tmp_path / "a" / "lens")  # created with its parents
    assert sorted(p.name for p in out.iterdir()) == ["lens.json", "translators.safetensors"]
    loaded = load_lens(out)
    assert torch.equal(loaded.translators.weight, lens.translators.weight)
    assert torch.equal(loaded.translators.bias, lens.translators.bias)
    assert loaded.fingerprint == lens.fingerprint and loaded.signature == lens.signature
    assert loaded.model == "reference" and loaded.record == lens.record
    assert loaded.metadata() == lens.metadata()
    meta = json.loads((out / "lens.json").read_text())
    assert meta["format"] == FORMAT and (meta["n_layers"], meta["d_model"]) == (6, 128)
    assert meta["fingerprint"] == model_signature(reference.view)[0]
    assert meta["training"] == lens.record
    loaded.check_model(reference.view)  # its own model: accepted
    h = torch.randn(4, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for layer in range(7):
            want = decoder_of(reference.view, "tuned", lens).at(layer).logits(h)
            assert torch.equal(decoder_of(reference.view, "tuned", loaded).at(layer).logits(h), want)


def test_a_lens_is_refused_on_another_model_of_the_same_shape(reference) -> None:
    lens = TunedLens.zero(reference.view, "reference")
    other = other_model(reference).view
    theirs = model_signature(other)[0]
    assert theirs != lens.fingerprint
    with pytest.raises(UsageError) as caught:
        decoder_of(other, "tuned", lens)
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    assert f"expects fingerprint {lens.fingerprint}" in message and f"has fingerprint {theirs}" in message
    assert "6 layers, d_model 128" in message


def test_a_lens_is_refused_on_a_model_of_another_shape(reference) -> None:
    from resstream.training.config import ModelConfig
    from resstream.training.model import GPT

    lens = TunedLens.zero(reference.view, "reference")
    torch.manual_seed(0)
    small = as_loaded(
        GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=16, vocab_size=64)),
        None,
        needs_tokenizer=False,
    ).view
    with pytest.raises(UsageError, match=rf"expects fingerprint {lens.fingerprint} .*2 layers, d_model 32"):
        lens.check_model(small, source="the tuned lens 'x'")
    with pytest.raises(UsageError, match=r"^the tuned lens 'x' was trained on another model"):
        lens.check_model(small, source="the tuned lens 'x'")


def test_a_bfloat16_load_of_the_same_model_is_accepted(reference, states) -> None:
    lens = TunedLens.zero(reference.view, "reference")
    half = load_model(None, dtype="bfloat16", device="cpu", progress=False).view
    assert half.W_U.dtype == torch.bfloat16
    assert model_signature(half) == (lens.fingerprint, lens.signature)
    tuned, logit = decoder_of(half, "tuned", lens), decoder_of(half)  # accepted
    h = states[2].to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(tuned.at(2).logits(h), logit.logits(h))


def write_lens(path: Path, reference) -> Path:
    return TunedLens.zero(reference.view, "reference").save(path)


def corrupt(kind: str, path: Path) -> None:
    """Damage the lens directory `path` in one way."""
    from safetensors.torch import save_file

    meta_path, weights_path = path / "lens.json", path / "translators.safetensors"
    meta = json.loads(meta_path.read_text())
    if kind == "no lens.json":
        meta_path.unlink()
    elif kind == "no safetensors":
        weights_path.unlink()
    elif kind == "invalid json":
        meta_path.write_text('{"format": "resstream-tuned-lens/1", "n_la')
    elif kind == "wrong format":
        meta_path.write_text(json.dumps({**meta, "format": "tuned-lens/0"}))
    elif kind == "a list":
        meta_path.write_text("[1, 2]")
    elif kind == "no fingerprint":
        meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != "fingerprint"}))
    elif kind == "zero layers":
        meta_path.write_text(json.dumps({**meta, "n_layers": 0}))
    elif kind == "truncated safetensors":
        weights_path.write_bytes(weights_path.read_bytes()[:100])
    elif kind == "garbage safetensors":
        weights_path.write_bytes(b"not a safetensors file at all")
    elif kind == "wrong shapes":
        save_file({"weight": torch.zeros(6, 128, 64), "bias": torch.zeros(6, 128)}, str(weights_path))
    elif kind == "non-finite":
        weight = torch.zeros(6, 128, 128)
        weight[2, 0, 0] = math.nan
        save_file({"weight": weight, "bias": torch.zeros(6, 128)}, str(weights_path))
    else:
        raise KeyError(kind)


@pytest.mark.parametrize(
    ("kind", "pattern"),
    [
        ("no lens.json", "holds no lens.json: not a lens directory"),
        ("no safetensors", "holds no translators.safetensors: not a lens directory"),
        ("invalid json", "lens.json is not valid JSON"),
        ("wrong format", "has format 'tuned-lens/0', expected 'resstream-tuned-lens/1'"),
        ("a list", "has format 'list'"),
        ("no fingerprint", "lacks a valid 'fingerprint'"),
        ("zero layers", "has n_layers 0"),
        ("truncated safetensors", "translators.safetensors is corrupt"),
        ("garbage safetensors", "translators.safetensors is corrupt"),
        ("wrong shapes", "translators.safetensors holds"),
        ("non-finite", "non-finite values"),
    ],
)
def test_a_damaged_lens_directory_is_one_line(reference, tmp_path, kind, pattern) -> None:
    path = write_lens(tmp_path / "lens", reference)
    corrupt(kind, path)
    with pytest.raises(UsageError) as caught:
        load_lens(path)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and pattern in message and str(path) in message, message


def test_a_missing_lens_directory(tmp_path) -> None:
    with pytest.raises(
        UsageError, match=r"does not exist \(train one with `resstream tune-lens --out DIR`\)"
    ):
        load_lens(tmp_path / "nowhere")


# --------------------------------------------------------------------------- decoder specs


def test_decoder_specs_as_users_write_them(reference, tmp_path) -> None:
    path = write_lens(tmp_path / "lens", reference)
    assert decoder_spec("logit-lens").kind == "logit-lens" and decoder_spec("embedding").kind == "embedding"
    spec = decoder_spec(f"tuned:{path}")
    assert (spec.kind, spec.source) == ("tuned", str(path)) and spec.lens.fingerprint == model_signature(
        reference.view
    )[0]
    lens = TunedLens.zero(reference.view, "reference")
    assert decoder_spec(lens).lens is lens and decoder_spec(lens).kind == "tuned"
    assert [s.kind for s in decoder_specs(["logit-lens", lens, "embedding"])] == [
        "logit-lens",
        "tuned",
        "embedding",
    ]
    assert decoder_spec(lens).build(reference.view).lens is lens


@pytest.mark.parametrize(
    ("specs", "patterns"),
    [
        ("bogus", ["unknown decoder 'bogus'", "allowed: logit-lens, embedding, tuned:DIR"]),
        ("logit_lens", ["unknown decoder 'logit_lens'", "logit-lens"]),
        ("tuned", ["'tuned' needs its lens directory: tuned:DIR"]),
        ("tuned:", ["'tuned' needs its lens directory: tuned:DIR"]),
        (["logit-lens", "logit-lens"], ["decoder 'logit-lens' is given twice"]),
        ([], ["no decoder given"]),
        ([3], ["decoder 3", "TunedLens"]),
    ],
)
def test_bad_decoder_specs(specs, patterns) -> None:
    with pytest.raises(UsageError) as caught:
        decoder_specs(specs)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and all(p in message for p in patterns), message


# --------------------------------------------------------------------------- shift and lens


def shift_of(corpus: Path, decoder, **kwargs):
    """`resstream.shift` of the reference model on 4 windows of 16 tokens of the small corpus."""
    options = {"dataset": str(corpus), "num_seqs": 4, "seq_len": 16, "top_k": 3, "batch_size": 3}
    return resstream.shift(None, decoder=decoder, device="cpu", progress=False, **options, **kwargs)


#: What a result records about its decoder (all else must agree between equal decoders).
DECODER_FIELDS = {"decoder", "decoding"}


def metrics(result) -> dict:
    return {k: v for k, v in dataclasses.asdict(result).items() if k not in DECODER_FIELDS}


def test_shift_through_a_zero_lens_is_the_logit_lens_shift(reference, corpus, tmp_path) -> None:
    lens = TunedLens.zero(reference.view, "reference")
    path = lens.save(tmp_path / "zero")
    (logit,) = shift_of(corpus, "logit-lens").results
    for decoder in (lens, f"tuned:{path}"):
        (tuned,) = shift_of(corpus, decoder).results
        assert tuned.decoder == "tuned" and lens.fingerprint in tuned.decoding
        assert metrics(tuned) == metrics(logit)  # every metric, every layer, exactly
    assert logit.num_sequences == 4 and logit.num_tokens == 4 * 15


def test_shift_with_two_decoders_equals_two_single_runs(reference, corpus) -> None:
    lens = random_lens(reference.view, seed=7)
    both = shift_of(corpus, ["logit-lens", lens])
    assert [r.decoder for r in both.results] == ["logit-lens", "tuned"]
    singles = [shift_of(corpus, "logit-lens").results[0], shift_of(corpus, lens).results[0]]
    for together, alone in zip(both.results, singles, strict=True):
        for field in dataclasses.fields(together):  # every field, one by one, for a clear failure
            assert getattr(together, field.name) == getattr(alone, field.name), field.name
    assert both.results[0].in_match != both.results[1].in_match  # the translators changed the decodings
    assert both.to_dict()["decoders"] == ["logit-lens", "tuned"]


def test_shift_refuses_another_models_lens_before_any_work(reference, corpus, monkeypatch) -> None:
    import resstream.api.shift as api

    lens = TunedLens.zero(other_model(reference).view, "other")
    monkeypatch.setattr(api, "residual_states", lambda *a, **k: pytest.fail("a forward pass ran"))
    with pytest.raises(
        UsageError,
        match=f"the tuned lens '\\(lens of other\\)' was trained on another model: "
        f"it expects fingerprint {lens.fingerprint}",
    ):
        shift_of(corpus, ["logit-lens", lens])


def test_lens_through_a_zero_lens_is_the_logit_lens(reference, tmp_path) -> None:
    path = TunedLens.zero(reference.view, "reference").save(tmp_path / "zero")
    options = {"top_k": 3, "device": "cpu", "progress": False}
    logit = resstream.lens(TEXT, **options)
    tuned = resstream.lens(TEXT, decoder=f"tuned:{path}", **options)
    assert tuned.decoder == "tuned" and logit.decoder == "logit-lens"
    assert tuned.trajectories == logit.trajectories and tuned.texts == logit.texts
    assert (tuned.num_layers, tuned.top_k, tuned.model) == (logit.num_layers, logit.top_k, logit.model)


def test_lens_through_trained_translators_decodes_each_layer_with_its_own(reference, states) -> None:
    lens = random_lens(reference.view, seed=9)
    result = resstream.lens(TEXT, decoder=lens, top_k=2, device="cpu", progress=False)
    scorer = decoder_of(reference.view, "tuned", lens).exact()
    with torch.no_grad():
        for row in result.trajectories:
            for layer in range(7):
                want = scorer.at(layer).top_k(states[layer, row.position : row.position + 1], 2)[0]
                assert list(row.top_ids[layer]) == want[0].tolist(), (row.position, layer)


def test_signature_reads_the_last_element_of_a_tensor_longer_than_float32_counts_exactly() -> None:
    # float32 holds integers exactly only up to 2**24: a float linspace of positions overshot the
    # last index of GPT-2's 38,597,376-element embedding and crashed
    from types import SimpleNamespace

    from resstream.analysis.decoding.tuned_lens import model_signature

    big = torch.nn.Module()
    big.weight = torch.nn.Parameter(torch.zeros(2**24 + 5), requires_grad=False)
    big.weight.data[-1] = 7.0
    view = SimpleNamespace(family="test", n_layers=1, d_model=1, W_U=torch.zeros(1, 1), model=big)
    _, signature = model_signature(view)  # type: ignore[arg-type]
    shape, values = signature["weight"]
    assert shape == (2**24 + 5,) and values[0] == 0.0 and values[-1] == 7.0


def test_an_offloaded_tensor_is_compared_by_shape_and_a_changed_one_is_named() -> None:
    # a device_map may leave tensors on the meta device: the lens must still be accepted there
    reference = load_model(None, device="cpu")
    lens = TunedLens.zero(reference.view, "reference")
    norm = reference.view.final_norm
    loaded = norm.weight
    try:
        norm.weight = torch.nn.Parameter(torch.empty(loaded.shape, device="meta"), requires_grad=False)
        lens.check_model(reference.view)
    finally:
        norm.weight = loaded
    with torch.no_grad():
        saved = loaded.detach().clone()
        loaded.mul_(1.5)
        try:
            with pytest.raises(UsageError, match=r"first difference: \S*weight holds other weights"):
                lens.check_model(reference.view)
        finally:
            loaded.copy_(saved)


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (lambda meta: meta["signature"].update(bad=["x", None]), "malformed signature entry for 'bad'"),
        (lambda meta: meta.update(training=None), "lacks a valid 'training' record"),
        (lambda meta: meta.update(model=None), "lacks a valid 'model'"),
    ],
)
def test_malformed_metadata_is_one_line(tmp_path, change, pattern) -> None:
    reference = load_model(None, device="cpu")
    path = TunedLens.zero(reference.view, "reference").save(tmp_path / "lens")
    meta = json.loads((path / "lens.json").read_text())
    change(meta)
    (path / "lens.json").write_text(json.dumps(meta))
    with pytest.raises(UsageError, match=pattern):
        load_lens(path)


def test_shift_refuses_a_tuned_lens_with_several_models_before_loading_any() -> None:
    reference = load_model(None, device="cpu")
    lens = TunedLens.zero(reference.view, "reference")
    with pytest.raises(UsageError, match="a tuned lens belongs to one model, and `models` has 2"):
        resstream.shift([None, "no/such/model"], decoder=["logit-lens", lens], progress=False)


def test_the_reading_translation_does_not_depend_on_the_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    translators = Translators(1, 64)
    with torch.no_grad():
        translators.weight.copy_(torch.randn(1, 64, 64, generator=generator))
    h = torch.randn(300, 64, generator=generator)
    together = translators.translate(h, 0)
    alone = torch.cat([translators.translate(h[i : i + 1], 0) for i in range(300)])
    assert torch.equal(together, alone)
