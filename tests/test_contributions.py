"""Contribution scores: each equals a direct computation through the model's own final norm,
unembedding and log-softmax."""

from __future__ import annotations

import math

import pytest
import torch

from resstream.analysis.attribution.contributions import log_probs_of
from resstream.analysis.decoding.decoder import Decoder, decoder_of
from resstream.models.adapters import view_of
from tests.test_models_adapters import ALL_CASES, tiny_model


def _direct(decoder: Decoder, h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        scores = decoder.logits(h).log_softmax(-1)
        return scores.gather(-1, target.expand(scores.shape[:-1]).unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("case", ALL_CASES)
def test_logits_and_added_vectors_match_the_decoder(case: str) -> None:
    view = view_of(tiny_model(case))
    decoder = decoder_of(view)
    lp = log_probs_of(decoder)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, view.d_model, generator=gen)
    vectors = torch.randn(5, 3, view.d_model, generator=gen)
    target = torch.tensor([3, 7, 11])
    with torch.no_grad():
        torch.testing.assert_close(lp.logits(x), decoder.logits(x), rtol=1e-5, atol=1e-5)
        ours = lp.added(x, vectors, target)
    direct = _direct(decoder, x + vectors, target) - _direct(decoder, x, target)
    torch.testing.assert_close(ours, direct, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["gpt2", "llama", "gemma2", "resstream_post"])
def test_neuron_scores_match_one_decode_per_neuron(case: str) -> None:
    view = view_of(tiny_model(case))
    decoder = decoder_of(view)
    lp = log_probs_of(decoder)
    gen = torch.Generator().manual_seed(5)
    values = view.blocks[0].mlp_weights().W_out.detach()
    x = torch.randn(2, view.d_model, generator=gen)
    m = torch.randn(2, values.shape[0], generator=gen)
    target = torch.tensor([5, 9])
    with torch.no_grad():
        ours = lp.neurons(x, m, values, target)
    vectors = m.T.unsqueeze(-1) * values.unsqueeze(1)
    direct = _direct(decoder, x + vectors, target) - _direct(decoder, x, target)
    torch.testing.assert_close(ours, direct, rtol=1e-4, atol=1e-5)


def test_hand_case_two_token_vocabulary() -> None:
    """No norm, W_U = I (2 tokens): log p(0 | h) = h0 − log(e^h0 + e^h1). x = (0, 0) gives
    log ½; adding v = (1, 0) gives 1 − log(e + 1); C = log 2 + 1 − log(e + 1)."""
    decoder = Decoder("logit-lens", torch.eye(2), norm=None)
    lp = log_probs_of(decoder)
    c = lp.added(torch.zeros(1, 2), torch.tensor([[[1.0, 0.0]]]), torch.tensor([0]))
    assert c.item() == pytest.approx(math.log(2) + 1 - math.log(math.e + 1), abs=1e-6)
    n = lp.neurons(torch.zeros(1, 2), torch.tensor([[2.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
    assert n.item() == pytest.approx(math.log(2) + 2 - math.log(math.e**2 + 1), abs=1e-6)


def test_embedding_decoder_is_refused() -> None:
    view = view_of(tiny_model("gpt2"))
    with pytest.raises(ValueError, match="logit lens"):
        log_probs_of(decoder_of(view, "embedding"))


@pytest.mark.parametrize("case", ["gpt2", "llama", "gemma2", "resstream_post"])
def test_low_rank_scores_match_one_decode_per_vector(case: str) -> None:
    view = view_of(tiny_model(case))
    decoder = decoder_of(view)
    lp = log_probs_of(decoder)
    gen = torch.Generator().manual_seed(6)
    bases = view.blocks[0].W_O.detach()  # (H, d_head, d)
    coefficients = torch.randn(bases.shape[0], 7, bases.shape[1], generator=gen)
    x = torch.randn(view.d_model, generator=gen)
    with torch.no_grad():
        ours = lp.low_rank_added(x, coefficients, bases, torch.tensor(9))
    vectors = torch.einsum("hnr,hrd->hnd", coefficients, bases)
    direct = _direct(decoder, x + vectors, torch.tensor(9)) - _direct(decoder, x, torch.tensor(9))
    torch.testing.assert_close(ours, direct, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["gpt2", "llama", "gemma2", "resstream_post"])
def test_gradient_matches_autograd(case: str) -> None:
    view = view_of(tiny_model(case))
    decoder = decoder_of(view)
    lp = log_probs_of(decoder)
    h = torch.randn(3, view.d_model, generator=torch.Generator().manual_seed(8)) * 2
    target = torch.tensor([4, 50, 99])
    with torch.no_grad():
        log_probs, ours = lp.log_prob_and_gradient(h, target)
        torch.testing.assert_close(log_probs, lp.of_states(h, target), rtol=0, atol=1e-6)
    leaf = h.clone().requires_grad_(True)
    scores = decoder.logits(leaf).log_softmax(-1)
    scores.gather(-1, target.unsqueeze(-1)).sum().backward()
    torch.testing.assert_close(ours, leaf.grad, rtol=1e-4, atol=1e-5)
