"""Directions read from data (`resstream.analysis.steering`, `resstream.directions`): hand
computations of the AUC, DiffMean, the principal component and the probe; the held-out split;
the states read in padded batches; a concept planted in a tiny random model's stream; the
safetensors and GGUF files read back; the built-in concepts of the plays."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

import resstream
from resstream.analysis.steering import (
    export_control_vector,
    find_directions,
    held_out_split,
    load_directions,
    roc_auc,
    save_directions,
)
from resstream.analysis.steering.directions import (
    METHODS,
    check_set_size,
    first_principal_component,
    logistic_probe,
    minimum_texts,
)
from resstream.analysis.steering.files import gguf_layers
from resstream.errors import UsageError
from tests.test_models_adapters import char_tokenizer, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _states(n: int, layers: int = 3, d: int = 6, seed: int = 0, shift: float = 0.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((n, layers, d), generator=generator, dtype=torch.float64) + shift


# --------------------------------------------------------------------------- AUC


def test_the_auc_of_a_tiny_case_by_hand() -> None:
    # pairs (p, n): (3,0) (3,2) win; (1,0) wins, (1,2) loses; (2,0) wins, (2,2) ties: 4.5 of 6
    assert roc_auc(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0.0, 2.0])) == pytest.approx(0.75)
    assert roc_auc(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])) == 1.0
    assert roc_auc(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])) == 0.0
    assert roc_auc(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0, 1.0])) == 0.5
    with pytest.raises(ValueError, match="at least one positive and one negative"):
        roc_auc(torch.tensor([]), torch.tensor([1.0]))


def test_the_auc_equals_counting_every_pair_with_ties_half() -> None:
    generator = torch.Generator().manual_seed(3)
    pos = torch.randint(0, 5, (23,), generator=generator).double()  # many ties
    neg = torch.randint(0, 4, (17,), generator=generator).double()
    wins = sum((p > n) + 0.5 * (p == n) for p, n in itertools.product(pos.tolist(), neg.tolist()))
    assert roc_auc(pos, neg) == pytest.approx(wins / (23 * 17), abs=1e-12)


# --------------------------------------------------------------------------- split


def test_the_split_is_seeded_disjoint_and_the_same_for_every_method() -> None:
    first = held_out_split(20, 12, held_out=0.25, seed=5)
    again = held_out_split(20, 12, held_out=0.25, seed=5)
    other = held_out_split(20, 12, held_out=0.25, seed=6)
    for name in ("train_positive", "test_positive", "train_negative", "test_negative", "pair_positive"):
        assert torch.equal(getattr(first, name), getattr(again, name))
    assert not torch.equal(first.test_positive, other.test_positive)
    assert first.counts() == {
        "train_positive": 15,
        "test_positive": 5,
        "train_negative": 9,
        "test_negative": 3,
        "pairs": 9,
    }
    assert sorted(first.train_positive.tolist() + first.test_positive.tolist()) == list(range(20))
    assert set(first.pair_positive.tolist()) <= set(first.train_positive.tolist())
    assert set(first.pair_negative.tolist()) == set(first.train_negative.tolist())
    assert first.pairing == "shuffled"


def test_pairs_are_held_out_whole() -> None:
    split = held_out_split(8, 8, held_out=0.25, seed=0, paired=True)
    assert torch.equal(split.test_positive, split.test_negative) and len(split.test_positive) == 2
    assert torch.equal(split.pair_positive, split.train_positive) and split.pairing == "given"


def test_sets_too_small_to_split_are_refused_naming_the_minimum() -> None:
    assert minimum_texts(0.25) == 3 and minimum_texts(0.5) == 4
    check_set_size("`positive`", 3, 0.25)
    with pytest.raises(UsageError, match=r"`positive` has 2 texts.*at least 3 texts"):
        check_set_size("`positive`", 2, 0.25)
    with pytest.raises(UsageError, match=r"`pairs` has 1 pair:.*at least 4 pairs"):
        held_out_split(1, 1, held_out=0.5, paired=True)
    with pytest.raises(UsageError, match="held_out"):
        check_set_size("`positive`", 10, 1.0)


# --------------------------------------------------------------------------- methods


def test_diffmean_is_the_training_split_mean_difference() -> None:
    pos, neg = _states(16, shift=0.3), _states(12, seed=1)
    result = find_directions(pos.float(), neg.float(), seed=2)
    split = result.split
    for layer in range(3):
        hand = pos[split.train_positive, layer].mean(0) - neg[split.train_negative, layer].mean(0)
        raw = result.direction(layer, "diffmean", raw=True)
        assert torch.allclose(raw, hand, atol=1e-6)
        assert result.norm[0, layer] == pytest.approx(float(hand.norm()), abs=1e-6)
        for m in range(len(METHODS)):
            assert float(result.unit[m, layer].norm()) == pytest.approx(1.0, abs=1e-12)
            assert float(result.unit[m, layer] @ hand) >= 0  # positives project higher


def test_the_principal_component_is_the_uncentred_one_of_paired_differences_signed_to_the_positives() -> None:
    generator = torch.Generator().manual_seed(0)
    axis = torch.nn.functional.normalize(torch.randn(8, generator=generator, dtype=torch.float64), dim=0)
    neg = torch.randn((40, 1, 8), generator=generator, dtype=torch.float64)
    amounts = 2.0 + torch.rand(40, generator=generator, dtype=torch.float64)
    noise = 0.05 * torch.randn((40, 1, 8), generator=generator, dtype=torch.float64)
    pos = neg + amounts[:, None, None] * axis + noise
    result = find_directions(pos, neg, paired=True)
    pca = result.direction(0, "pca")
    assert float(pca @ axis) > 0.99  # the planted axis, with the positives' sign
    differences = (pos - neg)[result.split.pair_positive, 0]
    hand = torch.linalg.eigh(differences.T @ differences).eigenvectors[:, -1]  # uncentred
    assert abs(float(hand @ pca)) == pytest.approx(1.0, abs=1e-9)
    assert torch.allclose(first_principal_component(differences).abs(), hand.abs(), atol=1e-9)


@pytest.mark.parametrize(("n", "d"), [(40, 5), (12, 30)])  # Newton in the weights; in the texts' span
def test_the_probe_is_the_regularised_optimum(n: int, d: int) -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn((n, d), generator=generator, dtype=torch.float64) * torch.linspace(0.5, 3, d)
    y = (x[:, 0] + 0.5 * torch.randn(n, generator=generator, dtype=torch.float64) > 0).double()
    weight, bias = logistic_probe(x, y, l2=0.05)
    # the gradient of the objective (standardised features, bias column, both regularised) is zero
    mean, std = x.mean(0), x.std(0, unbiased=False)
    w_std = torch.cat([weight * std, torch.tensor([bias + float(weight @ mean)], dtype=torch.float64)])
    design = torch.cat([(x - mean) / std, torch.ones((n, 1), dtype=torch.float64)], dim=1)
    grad = design.T @ (torch.sigmoid(design @ w_std) - y) / n + 0.05 * w_std
    assert float(grad.abs().max()) < 1e-8
    probability = torch.sigmoid(x @ weight + bias)  # the classifier in the states' coordinates
    assert torch.allclose(probability, torch.sigmoid(design @ w_std), atol=1e-12)


def test_cosines_between_methods_and_to_token_rows() -> None:
    pos, neg = _states(20, shift=0.5), _states(20, seed=4)
    rows = torch.randn((2, 6), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    result = find_directions(pos, neg, unembedding=rows, tokens=("a", "b"), token_ids=(1, 2))
    for layer in range(3):
        cos = result.method_cosines[layer]
        assert torch.allclose(cos, cos.T) and torch.allclose(cos.diagonal(), torch.ones(3, dtype=cos.dtype))
        u = result.unit[:, layer]
        assert float(cos[0, 2]) == pytest.approx(float(u[0] @ u[2]), abs=1e-12)
        hand = float(u[1] @ rows[1] / rows[1].norm())
        assert float(result.token_cosines[1, layer, 1]) == pytest.approx(hand, abs=1e-12)


def test_a_layer_whose_states_are_all_alike_gets_zero_directions_and_chance() -> None:
    pos = torch.ones((6, 1, 4))
    result = find_directions(pos, pos.clone())
    assert float(result.auc[:, 0].sub(0.5).abs().max()) == 0.0
    assert float(result.unit[0, 0].abs().max()) == 0.0
    assert math.isnan(float(result.method_cosines[0, 0, 1]))


def test_non_finite_states_are_a_run_error() -> None:
    pos = _states(6)
    pos[0, 1, 0] = float("nan")
    with pytest.raises(resstream.errors.RunError, match=r"L1\.resid"):
        find_directions(pos, _states(6, seed=1))


# --------------------------------------------------------------------------- reading states


def _texts(count: int, seed: int) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    alphabet = "abcdefghij klmnop"
    lengths = torch.randint(3, 12, (count,), generator=generator).tolist()
    return [
        "".join(alphabet[i] for i in torch.randint(0, len(alphabet), (n,), generator=generator))
        for n in lengths
    ]


@pytest.mark.parametrize("case", ["gpt2", "resstream"])
@pytest.mark.parametrize("position", ["last", "mean"])
def test_states_read_in_padded_batches_equal_each_text_alone(case: str, position: str) -> None:
    from resstream.api.directions import _encoded, text_states
    from resstream.capture import residual_states
    from resstream.data.concepts import ContrastTexts
    from resstream.models.adapters import view_of

    model, tokenizer = tiny_model(case), char_tokenizer()
    view = view_of(model)
    texts = _texts(7, 1)
    encoded = _encoded(tokenizer, ContrastTexts(tuple(texts), (), False, ""), view)
    read = text_states(view, encoded, position, batch_size=3)  # type: ignore[arg-type]
    for row, (ids, first) in enumerate(encoded):
        alone = residual_states(view, ids[None])[:, 0]  # (L+1, T, d)
        expected = alone[:, -1] if position == "last" else alone[:, first:].mean(1)
        assert torch.allclose(read[row], expected.float(), atol=1e-5), row


def test_the_mean_leaves_out_a_bos_the_tokenizer_adds() -> None:
    from tokenizers import processors

    from resstream.api.directions import _encoded
    from resstream.data.concepts import ContrastTexts
    from resstream.models.adapters import view_of

    tokenizer = char_tokenizer()
    bos = tokenizer.convert_tokens_to_ids("~")
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="~ $A", special_tokens=[("~", bos)]
    )
    tokenizer.bos_token = "~"
    view = view_of(tiny_model("gpt2"))
    [(ids, first), (plain, start)] = _encoded(tokenizer, ContrastTexts(("ab",), ("~c",), False, ""), view)
    assert ids.tolist()[0] == bos and len(ids) == 3 and first == 1
    assert plain.tolist()[:2] == [bos, bos] and start == 1  # the text's own "~" is read


def test_a_concept_planted_in_a_random_models_stream_is_found_by_the_probe() -> None:
    """Positives run with a fixed vector added to L1.resid (`resstream.edited`), negatives
    without: every method finds it from h_1 on, the probe with held-out AUC >= 0.99."""
    from resstream.api.directions import _encoded, text_states
    from resstream.data.concepts import ContrastTexts
    from resstream.models.adapters import view_of

    model, tokenizer = tiny_model("resstream"), char_tokenizer()
    view = view_of(model)
    texts = ContrastTexts(tuple(_texts(48, 2)), tuple(_texts(48, 3)), False, "")
    encoded = _encoded(tokenizer, texts, view)
    plain = text_states(view, encoded, "mean", 16)
    planted = torch.nn.functional.normalize(
        torch.randn(view.d_model, generator=torch.Generator().manual_seed(7)), dim=0
    )
    spread = float(plain[:, 1].std(0).max())
    with resstream.edited(model, [resstream.Add("L1.resid", planted, coef=4 * spread)]):
        steered = text_states(view, encoded[:48], "mean", 16)
    result = find_directions(steered, plain[48:], position="mean", held_out=0.25, seed=0)
    assert result.auc[METHODS.index("probe"), 1] >= 0.99
    assert float(result.direction(1, "diffmean") @ planted.double()) > 0.9
    assert result.best()[1] >= 1


# --------------------------------------------------------------------------- the API


@pytest.fixture(scope="module")
def gpt2_result():
    model, tokenizer = tiny_model("gpt2"), char_tokenizer()
    positive = [f"yes {t}" for t in _texts(8, 4)]
    negative = [f"no {t}" for t in _texts(8, 5)]
    return resstream.directions(
        model, positive, negative, tokens=["a", "z"], tokenizer=tokenizer, batch_size=5
    )


def test_the_api_reads_every_layer_of_a_model_in_memory(gpt2_result) -> None:
    result = gpt2_result
    assert result.layers == (0, 1, 2) and result.unit.shape == (3, 3, 32)
    assert result.n_positive == result.n_negative == 8 and result.tokens == ("a", "z")
    assert result.token_cosines.shape == (3, 3, 2) and result.family == result.model_hint == "gpt2"
    assert result.model_fingerprint is None  # a model in memory
    frame = result.to_pandas()
    assert len(frame) == 9 and list(frame.columns)[-2:] == ["cos_unembed:a", "cos_unembed:z"]
    report = result.to_dict()
    json.dumps(report, allow_nan=False)
    assert report["texts"]["test_positive"] == 2 and len(report["layers"]) == 3
    html = result._repr_html_()
    assert "held-out ROC-AUC" in html and "<img" in html
    assert "best held-out AUC" in repr(result)


def test_bad_api_input_is_one_line_before_the_model_loads(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="give the texts one way"):
        resstream.directions(positive=["a"] * 4, negative=["b"] * 4, concept="comedy-tragedy")
    with pytest.raises(UsageError, match="`positive` needs `negative`"):
        resstream.directions(positive=["a"] * 4)
    with pytest.raises(UsageError, match=r"`negative` has 2 texts"):
        resstream.directions(positive=["a"] * 4, negative=["b"] * 2)
    with pytest.raises(UsageError, match="unknown `position` 'first'"):
        resstream.directions(positive=["a"] * 4, negative=["b"] * 4, position="first")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"`positive` '.*missing.txt' does not exist"):
        resstream.directions(positive=tmp_path / "missing.txt", negative=["b"] * 4)


def test_a_token_that_is_not_one_token_is_refused() -> None:
    with pytest.raises(UsageError, match=r"`tokens`: 'ab' is 2 tokens"):
        resstream.directions(
            tiny_model("gpt2"), ["a b"] * 4, ["c d"] * 4, tokens=["ab"], tokenizer=char_tokenizer()
        )


# --------------------------------------------------------------------------- files


def test_the_safetensors_file_reads_back_with_its_metadata(gpt2_result, tmp_path: Path) -> None:
    path = save_directions(gpt2_result, tmp_path / "directions.safetensors")
    saved = load_directions(path)
    assert saved.metadata["format"] == "resstream.directions" and saved.position == "last"
    assert saved.methods == METHODS and saved.layers == (0, 1, 2) and saved.sites[-1] == "L2.resid"
    assert saved.metadata["layer_convention"].startswith("L{l}.resid = h_l")
    for layer, method in itertools.product(range(3), METHODS):
        stored = saved.vector(layer, method)
        assert stored.dtype == torch.float32
        assert torch.allclose(stored.double(), gpt2_result.direction(layer, method, raw=True), atol=1e-6)
        assert torch.allclose(
            saved.direction(f"L{layer}.resid", method).double(),
            gpt2_result.direction(layer, method),
            atol=1e-5,
        )
    site, weight, bias = saved.probe(2)
    assert site == "L2.resid" and torch.allclose(weight.double(), gpt2_result.probe_weight[2], atol=1e-6)
    assert bias == pytest.approx(float(gpt2_result.probe_bias[2]), abs=1e-5)
    assert saved.auc["L1.resid/pca"] == pytest.approx(float(gpt2_result.auc[1, 1]))
    with pytest.raises(UsageError, match="fingerprint"):
        load_directions(path, fingerprint="0123")


def test_files_that_are_not_directions_are_refused(gpt2_result, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UsageError, match="is not a safetensors file"):
        load_directions(tmp_path / "junk.safetensors")
    save_file({"x": torch.zeros(3)}, str(tmp_path / "other.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UsageError, match="not written by resstream directions"):
        load_directions(tmp_path / "other.safetensors")
    path = save_directions(gpt2_result, tmp_path / "d.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata, tensors = handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    save_file(
        {**tensors, "L9.resid/diffmean": torch.zeros(32)},
        str(tmp_path / "bad.safetensors"),
        metadata=metadata,
    )
    with pytest.raises(UsageError, match=r"holds a tensor 'L9\.resid/diffmean'"):
        load_directions(tmp_path / "bad.safetensors")
    with pytest.raises(UsageError, match="does not exist"):
        load_directions(tmp_path / "none.safetensors")


def test_a_directions_file_is_checked_against_the_model_it_steers(gpt2_result, tmp_path: Path) -> None:
    from resstream.api.directions import direction_reader, read_direction_file
    from resstream.models import as_loaded

    path = save_directions(gpt2_result, tmp_path / "d.safetensors")
    same = as_loaded(tiny_model("gpt2"), char_tokenizer())
    reader = direction_reader(path, "probe", same)
    assert float(reader("L1.resid").norm()) == pytest.approx(1.0, abs=1e-6)
    assert read_direction_file(path, same).has_probe
    from transformers import GPT2Config, GPT2LMHeadModel

    deeper = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=128, n_positions=64))
    with pytest.raises(UsageError, match=r"width 32 over 2 layers; model .* has width 32 and 3 layers"):
        read_direction_file(path, as_loaded(deeper, char_tokenizer()))
    with pytest.raises(UsageError, match="unknown `method`"):
        direction_reader(path, "mean", same)


@pytest.mark.parametrize(("method", "scale"), [("diffmean", "raw"), ("probe", "unit")])
def test_the_control_vector_reads_back_as_llama_cpp_reads_it(
    gpt2_result, tmp_path: Path, method, scale
) -> None:
    import gguf

    result = gpt2_result
    path = export_control_vector(result, tmp_path / "directions.gguf", method=method, scale=scale)
    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert fields["general.architecture"] == "controlvector"
    assert fields["controlvector.model_hint"] == "gpt2" and fields["controlvector.method"] == method
    assert fields["controlvector.layer_count"] == 1  # 2 blocks: only block 1's output has a slot
    assert reader.fields["controlvector.layer_count"].types == [gguf.GGUFValueType.INT32]
    assert fields["resstream.scale"] == scale and fields["resstream.position"] == "last"
    assert [t.name for t in reader.tensors] == ["direction.1"]
    tensor = reader.tensors[0]
    assert tensor.tensor_type == gguf.GGMLQuantizationType.F32 and list(tensor.shape) == [32]
    expected = result.direction(2, method, raw=scale == "raw")  # direction.1: output of block 1 = h_2
    assert torch.allclose(torch.from_numpy(tensor.data.copy()).double(), expected, atol=1e-6)


def test_direction_k_is_the_state_after_block_k(tmp_path: Path) -> None:
    """llama.cpp adds direction.k to the output of 0-based block k: resstream's h_{k+1}."""
    import gguf

    result = find_directions(_states(8, layers=5, shift=0.2), _states(8, layers=5, seed=1), model="toy")
    assert gguf_layers(result) == [(1, 2), (2, 3), (3, 4)]
    reader = gguf.GGUFReader(str(export_control_vector(result, tmp_path / "d.gguf")))
    assert reader.fields["controlvector.layer_count"].contents() == 3
    assert reader.fields["controlvector.model_hint"].contents() == "unknown"  # no family given
    for tensor in reader.tensors:
        k = int(tensor.name.removeprefix("direction."))
        stored = torch.from_numpy(tensor.data.copy()).double()
        assert torch.allclose(stored, result.direction(k + 1, raw=True), atol=1e-6), k


# --------------------------------------------------------------------------- concepts


def test_text_sets_and_pairs_from_files(tmp_path: Path) -> None:
    from resstream.data.concepts import read_pairs, read_text_set

    (tmp_path / "a.txt").write_text("one\n\n two \nthree\n", encoding="utf-8")
    assert read_text_set(tmp_path / "a.txt", "`positive`") == ("one", " two ", "three")
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n\n{"text": "y z"}\n', encoding="utf-8")
    assert read_text_set(tmp_path / "a.jsonl", "`positive`") == ("x", "y z")
    (tmp_path / "e.jsonl").write_text('{"text": "x"}\n{"text": " "}\n', encoding="utf-8")
    with pytest.raises(UsageError, match="row 2 is an empty text"):
        read_text_set(tmp_path / "e.jsonl", "`positive`")
    (tmp_path / "blank.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(UsageError, match="holds no text"):
        read_text_set(tmp_path / "blank.txt", "`negative`")
    (tmp_path / "p.jsonl").write_text(
        '{"positive": "a", "negative": "b"}\n{"positive": "c"}\n', encoding="utf-8"
    )
    with pytest.raises(UsageError, match="line 2 needs a non-empty string 'positive' and 'negative'"):
        read_pairs(tmp_path / "p.jsonl")


def test_the_plays_concepts_are_fixed_by_title_and_seeded() -> None:
    from resstream.data.concepts import COMEDIES, TRAGEDIES, concept_texts, play_speeches

    texts = concept_texts("comedy-tragedy")
    assert len(texts.positive) == len(texts.negative) == 256 and not texts.paired
    assert concept_texts("comedy-tragedy") == texts and concept_texts("comedy-tragedy", seed=1) != texts
    assert not set(COMEDIES) & set(TRAGEDIES)
    assert all(2 <= len(t.splitlines()) <= 4 and len(t) <= 280 for t in texts.positive + texts.negative)
    hamlet = concept_texts("speaker:hamlet")
    assert "HAMLET" in hamlet.source and len(hamlet.positive) == len(hamlet.negative) == 256
    play = "Title\n\nACT I\n\nSCENE I. A room.\n\nEnter A\n\nFIRST LORD\nHail!\nAll hail.\n\nExit\n\n"
    play += "Still he.\n\nNurse\nAnon!"
    speeches = list(play_speeches(play))
    assert [(s.speaker, s.lines) for s in speeches] == [
        ("FIRST LORD", ("Hail!", "All hail.")),
        ("FIRST LORD", ("Still he.",)),
        ("NURSE", ("Anon!",)),
    ]
    with pytest.raises(
        UsageError, match=r"unknown `concept` 'comedy'.*allowed: comedy-tragedy, speaker:NAME"
    ):
        concept_texts("comedy")
    with pytest.raises(UsageError, match=r"no speaker 'HAMLOT' in the plays \(did you mean 'HAMLET'\?\)"):
        concept_texts("speaker:Hamlot")
