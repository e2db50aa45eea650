"""FFN neurons as key -> value memories (issue 11, item 4): value scores by hand, the streaming
top-N against a full sort, the recorded coefficients against act(x W_in + b) on every family,
and top contexts whose recomputed coefficient is the reported one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import resstream
from resstream.analysis.decoding.decoder import Decoder, decoder_of
from resstream.analysis.memories.neurons import (
    TopActivations,
    promoted_tokens,
    rank_neurons,
    top_activations,
    value_logits,
)
from resstream.api.neurons import layer_coefficients
from resstream.capture import record
from resstream.data.sampling import SequenceSample
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from tests.test_models_adapters import ALL_CASES, tiny_ids, tiny_model
from tests.test_models_experts import experts_by_hand
from tests.test_models_loading import SENTENCES, _tiny_gpt2

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")

# --------------------------------------------------------------------------- value side

#: W_U of a 3-dimensional model with 4 tokens: e_0, e_1, e_2 and (1, 1, 1).
W_U = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]])


def layer_norm_decoder() -> Decoder:
    norm = nn.LayerNorm(3)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        norm.bias.copy_(torch.tensor([5.0, -5.0, 7.0]))  # the bias does not enter
    return Decoder("logit-lens", W_U, bias=torch.tensor([9.0, 9, 9, 9]), norm=norm)


def test_value_logits_by_hand_layer_norm() -> None:
    # w = (1, 2, 6): centre → (−2, −1, 3); gain (1, 2, 0.5) → (−2, −2, 1.5);
    # W_U rows: e_0, e_1, e_2 and (1, 1, 1) → −2, −2, 1.5, −2.5
    scores = value_logits(layer_norm_decoder(), torch.tensor([[1.0, 2.0, 6.0]]))
    torch.testing.assert_close(scores, torch.tensor([[-2.0, -2.0, 1.5, -2.5]]))


def test_value_logits_by_hand_rms_norm_does_not_centre() -> None:
    norm = nn.RMSNorm(3, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    decoder = Decoder("logit-lens", W_U, norm=norm)
    # w = (1, 2, 6) · gain → (1, 4, 3); scores 1, 4, 3, 8
    scores = value_logits(decoder, torch.tensor([[1.0, 2.0, 6.0]]))
    torch.testing.assert_close(scores, torch.tensor([[1.0, 4.0, 3.0, 8.0]]))


def test_value_logits_without_final_norm_is_W_U_w() -> None:
    decoder = Decoder("logit-lens", W_U, norm=nn.Identity())
    torch.testing.assert_close(
        value_logits(decoder, torch.tensor([[1.0, 2.0, 6.0]])), torch.tensor([[1.0, 2, 6, 9]])
    )


@pytest.mark.parametrize("case", ["gpt2", "llama", "gemma2", "resstream_post"])
def test_value_logits_are_the_direct_effect_through_the_frozen_final_norm(case: str) -> None:
    """Adding w to a state u moves the decoder's pre-bias scores by value_logits(w) / s(u),
    the final norm's scale fixed at u + w (norm(u + w) = norm's affine map of u plus of w)."""
    from resstream.analysis.norms import norm_form

    view = view_of(tiny_model(case))
    decoder = decoder_of(view)
    w = view.blocks[-1].mlp_weights().W_out[:3].detach()
    u = torch.randn(3, view.d_model, generator=torch.Generator().manual_seed(4))
    frozen = norm_form(view.final_norm).freeze(u + w)
    with torch.no_grad():
        effect = frozen.apply(w) @ decoder.matrix.T
        expected = value_logits(decoder, w) * frozen.inverse_scale
    torch.testing.assert_close(effect, expected, rtol=1e-5, atol=1e-6)


def test_promoted_tokens_by_hand_and_chunked_like_whole() -> None:
    decoder = layer_norm_decoder()
    rows = torch.tensor([[1.0, 2.0, 6.0], [0.0, 3.0, 0.0], [4.0, 0.0, 1.0]])
    result = promoted_tokens(decoder, rows, 2)
    assert result.promoted_ids[0] == (2, 0) or result.promoted_ids[0] == (2, 1)  # −2 twice: a tie
    assert result.promoted_scores[0] == pytest.approx((1.5, -2.0))
    assert result.suppressed_ids[0][0] == 3 and result.suppressed_ids[0][1] in (0, 1)
    assert result.suppressed_scores[0] == pytest.approx((-2.5, -2.0))
    # w = (0, 3, 0): centre (−1, 2, −1), gain → (−1, 4, −0.5): scores −1, 4, −0.5, 2.5
    assert result.promoted_ids[1] == (1, 3) and result.suppressed_ids[1] == (0, 2)
    one_at_a_time = promoted_tokens(decoder, rows, 2, chunk_bytes=1)
    for name in ("promoted_scores", "suppressed_scores"):
        torch.testing.assert_close(
            torch.tensor(getattr(one_at_a_time, name)),
            torch.tensor(getattr(result, name)),
            rtol=1e-6,
            atol=1e-6,
        )
    with pytest.raises(ValueError, match="outside"):
        promoted_tokens(decoder, rows, 5)


def test_promoted_tokens_are_the_extremes_of_value_logits() -> None:
    decoder = decoder_of(view_of(tiny_model("gpt2")))
    rows = torch.randn(7, 32, generator=torch.Generator().manual_seed(5))
    scores = value_logits(decoder, rows)
    result = promoted_tokens(decoder, rows, 4, chunk_bytes=3 * 4 * decoder.vocab_size)  # chunks of 3
    assert len(result) == 7
    for i in range(7):
        assert list(result.promoted_ids[i]) == scores[i].argsort(descending=True)[:4].tolist()
        assert list(result.suppressed_ids[i]) == scores[i].argsort()[:4].tolist()


# --------------------------------------------------------------------------- key side


def brute_force_top(all_m: torch.Tensor, keep: int) -> list[list[tuple[float, int, int]]]:
    """(value, sequence, position) of each neuron's `keep` largest coefficients by a full sort."""
    n_seq, seq, neurons = all_m.shape
    best = []
    for k in range(neurons):
        entries = [(float(all_m[s, p, k]), s, p) for s in range(n_seq) for p in range(seq)]
        best.append(sorted(entries, key=lambda e: -e[0])[:keep])
    return best


@pytest.mark.parametrize("ties", [False, True])
def test_streaming_top_n_equals_a_full_sort(ties: bool) -> None:
    """Against a stable full sort (equal values in corpus order); with `ties`, small integers
    with most values repeated, including ReLU-like runs of zeros."""
    gen = torch.Generator().manual_seed(6)
    all_m = torch.randn(11, 9, 5, generator=gen)
    if ties:
        all_m = all_m.mul(1.5).round().clamp(min=0)
    tracker = TopActivations(5, keep=7)
    for start, stop in ((0, 3), (3, 4), (4, 11)):  # batches of 3, 1 and 7 sequences
        tracker.update(all_m[start:stop], start)
    expected = brute_force_top(all_m, 7)
    for k in range(5):
        assert [(a.value, a.sequence, a.position) for a in tracker.best(k)] == expected[k]
    torch.testing.assert_close(tracker.maxima(), all_m.amax(dim=(0, 1)))


def test_streaming_top_n_with_fewer_positions_than_asked_and_ties_in_corpus_order() -> None:
    tracker = TopActivations(1, keep=10)
    tracker.update(torch.tensor([[[1.0], [3.0], [1.0]]]), 0)
    tracker.update(torch.tensor([[[3.0], [0.0]]]), 1)
    assert [(a.value, a.sequence, a.position) for a in tracker.best(0)] == [
        (3.0, 0, 1),
        (3.0, 1, 0),
        (1.0, 0, 0),
        (1.0, 0, 2),
        (0.0, 1, 1),
    ]


def test_non_finite_coefficients_are_refused() -> None:
    tracker = TopActivations(1, keep=2)
    with pytest.raises(resstream.errors.RunError, match="non-finite"):
        tracker.update(torch.tensor([[[float("nan")]]]), 0)


def test_rank_neurons_by_largest_activation_ties_lower_index() -> None:
    assert rank_neurons(torch.tensor([1.0, 5.0, 2.0, 5.0]), 3) == [1, 3, 2]


def test_top_activations_windows_and_chosen_neurons() -> None:
    ids = torch.arange(20).view(2, 10)
    m = torch.zeros(2, 10, 4)
    m[1, 6, 2] = 9.0  # neuron 2's best: sequence 1, position 6 (token 16)
    m[0, 1, 2] = 4.0  # then sequence 0, position 1 (token 1)
    m[0, 0, 3] = 7.0
    key = top_activations([(ids, m)], neurons=[2, 0], keep=2, window=3)
    assert key.neurons == (2, 0) and key.maxima == (9.0, 0.0) and key.num_positions == 20
    first, second = key.contexts[0]
    assert (first.activation, first.sequence, first.position, first.window) == (9.0, 1, 6, (13, 14, 15, 16))
    assert (second.sequence, second.position, second.window, second.token_id) == (0, 1, (0, 1), 1)
    ranked = top_activations([(ids, m)], top=2, keep=1)
    assert ranked.neurons == (2, 3) and ranked.maxima == (9.0, 7.0)


# --------------------------------------------------------------------------- recorded coefficients


def sample_of(ids: torch.Tensor) -> SequenceSample:
    return SequenceSample(tuple(ids), "test rows", bos_prepended=False, windows_available=None)


@pytest.mark.parametrize("case", ALL_CASES)
def test_recorded_coefficients_are_act_of_the_key_reading(case: str) -> None:
    """m recorded at mlp_out_proj = act(x W_in + b_in) [· (x W_up + b_up)] with x what the MLP
    receives, for every block of every family."""
    view = view_of(tiny_model(case))
    ids = tiny_ids(batch=3)
    for layer, block in enumerate(view.blocks):
        w = block.mlp_weights()
        with record([block.mlp], inputs=True) as seen:
            batches = list(layer_coefficients(view, layer, sample_of(ids), 2, False, "test"))
        x = torch.cat(seen["0"])
        with torch.no_grad():
            m = w.act(x @ w.W_in + (0 if w.b_in is None else w.b_in))
            if w.gated:
                m = m * (x @ w.W_up + (0 if w.b_up is None else w.b_up))
            if block.experts is not None:  # routed and weighted, computed by hand token by token
                m = experts_by_hand(block, x.reshape(-1, x.shape[-1])).reshape(m.shape)
        assert [len(b) for b, _ in batches] == [2, 1]
        recorded = torch.cat([coefficients for _, coefficients in batches])
        assert recorded.shape == (3, ids.shape[1], w.d_ff)
        torch.testing.assert_close(recorded, m, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- the API


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[torch.nn.Module, object, Path]:
    """A tiny GPT-2 with its BPE tokenizer and a small corpus file."""
    from resstream.data import train_bpe

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    return _tiny_gpt2(len(tokenizer)), tokenizer, corpus


def run_neurons(tiny, **kwargs):
    model, tokenizer, corpus = tiny
    options = {"layer": 1, "dataset": str(corpus), "num_seqs": 4, "seq_len": 16, "progress": False}
    return resstream.neurons(model, tokenizer=tokenizer, **{**options, **kwargs})


def test_top_contexts_point_at_their_recomputed_activation(tiny) -> None:
    """Each context's window (the whole prefix: window >= seq_len) run through the model gives,
    at its last position, the reported coefficient, recomputed from the MLP's weights."""
    model, _, _ = tiny
    result = run_neurons(tiny, top=3, contexts=4, window=16)
    view = view_of(model)
    block = view.blocks[1]
    w = block.mlp_weights()
    maxima = [n.max_activation for n in result.neurons]
    assert maxima == sorted(maxima, reverse=True)
    for report in result.neurons:
        assert len(report.contexts) == 4 and report.max_activation == report.contexts[0].activation
        for context in report.contexts:
            assert len(context.window) == context.position + 1
            with record([block.mlp], inputs=True) as seen, torch.no_grad():
                model(torch.tensor([context.window]))
                x = seen["0"][0][0, -1]
                m = w.act(x @ w.W_in + w.b_in)[report.neuron]
            assert float(m) == pytest.approx(context.activation, rel=1e-5, abs=1e-6)


def test_top_neurons_are_the_layer_maxima(tiny) -> None:
    model, tokenizer, corpus = tiny
    result = run_neurons(tiny, top=5, contexts=1)
    view = view_of(model)
    from resstream.api.inputs import CorpusRequest, sample_corpus

    sample, _ = sample_corpus(CorpusRequest(str(corpus), 4, 16, 0, None), tokenizer, len(tokenizer))
    all_m = torch.cat([m for _, m in layer_coefficients(view, 1, sample, 8, False, "test")])
    maxima = all_m.flatten(0, 1).amax(0)
    assert [n.neuron for n in result.neurons] == maxima.argsort(descending=True)[:5].tolist()
    assert [n.max_activation for n in result.neurons] == pytest.approx(
        maxima.sort(descending=True).values[:5].tolist()
    )
    assert result.num_positions == 4 * 16 and result.num_seqs == 4


def test_result_value_side_and_dict(tiny) -> None:
    model, tokenizer, _ = tiny
    result = run_neurons(tiny, neurons=[7, 3, 7], value_tokens=5, contexts=2)
    assert [n.neuron for n in result.neurons] == [7, 3]  # repeats dropped
    expected = promoted_tokens(
        decoder_of(view_of(model)), view_of(model).blocks[1].mlp_weights().W_out[[7, 3]], 5
    )
    assert [tuple(t for t, _ in n.promoted) for n in result.neurons] == list(expected.promoted_ids)
    data = result.to_dict()
    assert data["layer"] == 1 and data["d_ff"] == 128 and data["selection"] == "the neurons given"
    first = data["neurons"][0]
    assert first["promoted"][0]["token"] == tokenizer.decode([first["promoted"][0]["token_id"]])
    assert first["contexts"][0]["window"][-1] == first["contexts"][0]["token"]
    assert "layer 1" in repr(result)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layer": 2, "top": 1}, r"`layer` 2 is out of range; allowed: 0..1"),
        ({"layer": -1, "top": 1}, r"`layer` -1 is out of range; allowed: 0..1"),
        ({"neurons": [128]}, r"`neurons` 128 is out of range for layer 1; allowed: 0..127"),
        ({"top": 129}, r"`top` 129 is more than layer 1's 128 neurons; allowed: 1..128"),
        ({"top": 0}, r"`top` 0 must be >= 1"),
        ({}, r"give exactly one of `neurons`"),
        ({"neurons": [1], "top": 2}, r"give exactly one of `neurons`"),
        ({"top": 1, "contexts": 0}, r"`contexts` 0 must be >= 1"),
        ({"top": 1, "value_tokens": 0}, r"`value_tokens` 0 must be >= 1"),
        ({"top": 1, "value_tokens": 301}, r"`value_tokens` 301 is outside \[1, 300\]"),
        ({"top": 1, "dataset": "no-such-corpus"}, r"no-such-corpus"),
    ],
)
def test_bad_requests(tiny, kwargs, message) -> None:
    with pytest.raises(UsageError, match=message):
        run_neurons(tiny, **kwargs)


@pytest.mark.parametrize("case", ["gemma2", "resstream_post", "gpt2"])
def test_added_values_point_where_the_write_reaches_the_final_norm(case: str) -> None:
    """A neuron's component of h_L (the exact decomposition, every later norm frozen) is a
    positive multiple of `added_values` — with the norms' gains randomised so they matter."""
    import copy

    from resstream.analysis.attribution.decomposition import decompose
    from resstream.analysis.memories.neurons import added_values
    from resstream.capture import block_internals

    model = copy.deepcopy(tiny_model(case))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "ln" in name:
                param.add_(0.5 * torch.randn_like(param))
    view = view_of(model)
    rec = block_internals(view, tiny_ids(batch=1))
    parts = decompose(view, rec, [5], neurons=True)
    for layer in range(view.n_layers):
        mask = (parts.layers == layer) & (parts.neurons >= 0)
        written = parts.vectors[mask][:, 0].double()  # (d_ff, d)
        m = rec.blocks[layer].coefficients[0, 5].double()
        expected = added_values(view, layer).double() * m.unsqueeze(1)
        cos = torch.nn.functional.cosine_similarity(written, expected, dim=1)
        big = m.abs() > 1e-3
        assert bool((cos[big] > 1 - 1e-5).all()), cos[big].min()


def test_a_list_of_models_is_refused_not_cut_to_its_first() -> None:
    """`neurons` analyses one model: a list (which `shift` takes) is refused before anything
    loads, as `attribute_corpus` refuses it (it analysed the first model and ignored the rest)."""
    with pytest.raises(UsageError, match=r"holds a list; allowed: a model spec"):
        resstream.neurons(["reference", "reference"], layer=0, top=2)
