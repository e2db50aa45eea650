"""The one decoder (resstream.analysis.decoding.decoder): what it says it applies, and its fast and exact
evaluations of the same scores."""

from __future__ import annotations

import math

import pytest
import torch

from resstream.analysis.decoding.decoder import Decoder, decoder_of
from resstream.errors import UsageError
from resstream.models import load_model
from tests.rank_schemes import rank_scheme  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("rank_scheme")


def test_description_says_what_is_applied() -> None:
    matrix = torch.zeros(3, 2)
    assert Decoder("logit-lens", matrix).description == "final norm, then W_U = W_E (tied)"
    assert Decoder("embedding", matrix, tied=False).description == "W_E · h (input embedding matrix, no norm)"
    untied = Decoder("logit-lens", matrix, bias=torch.zeros(3), softcap=30.0, tied=False)
    assert untied.description == (
        "final norm, then the model's own unembedding W_U (untied from W_E) + b_U; "
        "logit soft-capping ignored (monotone, ranks unchanged)"
    )


def test_reference_model_decoders() -> None:
    view = load_model(None, device="cpu").view
    lens, embedding = decoder_of(view), decoder_of(view, "embedding")
    assert lens.kind == "logit-lens" and lens.norm is view.final_norm and lens.tied
    assert torch.equal(lens.matrix, view.W_U) and not lens.matrix.requires_grad
    assert embedding.norm is None and embedding.bias is None and torch.equal(embedding.matrix, view.W_E)
    with pytest.raises(UsageError, match="unknown decoder 'tuning'"):
        decoder_of(view, "tuning")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a lens"):
        decoder_of(view, "tuned")
    with pytest.raises(ValueError, match="a tuned decoder needs its lens"):
        Decoder("tuned", view.W_E)


def test_logits_apply_norm_bias_and_soft_capping_by_hand() -> None:
    # scores of h = (1, 2): W·h = (1, 2, -3) + b = (1.5, 2, -3); capped at 2: 2·tanh(s / 2)
    matrix = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    decoder = Decoder("logit-lens", matrix, bias=torch.tensor([0.5, 0.0, 0.0]), norm=lambda h: h, softcap=2.0)
    got = decoder.logits(torch.tensor([[1.0, 2.0]]))
    want = torch.tensor([[2 * math.tanh(0.75), 2 * math.tanh(1.0), 2 * math.tanh(-1.5)]])
    assert torch.allclose(got, want, atol=1e-7)


def test_exact_scores_ranks_and_top_k_ignore_soft_capping() -> None:
    g = torch.Generator().manual_seed(0)
    matrix, h = torch.randn(50, 8, generator=g), torch.randn(6, 8, generator=g)
    capped = Decoder("logit-lens", matrix, norm=lambda x: x, softcap=0.01).exact()
    plain = Decoder("logit-lens", matrix, norm=lambda x: x).exact()
    ids = torch.randint(0, 50, (6, 2), generator=g)
    assert torch.equal(capped.ranks(h, ids)[0], plain.ranks(h, ids)[0])
    assert torch.equal(capped.top_k(h, 4)[0], (h.double() @ matrix.double().T).topk(4).indices)
    fp64 = (h.double() @ matrix.double().T).gather(1, ids)  # another summation order: ulps apart
    assert torch.allclose(capped.scores(h, ids), fp64, rtol=0, atol=1e-12)
