"""Direct logit attribution: the parts plus the bias term add up to the model's own logit."""

from __future__ import annotations

import pytest
import torch

from resstream.analysis.attribution.decomposition import KINDS, decompose
from resstream.analysis.attribution.readouts import readouts
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.norms import norm_form
from resstream.capture import block_internals
from resstream.models.adapters import view_of
from tests.test_models_adapters import ALL_CASES, SEQ, tiny_ids, tiny_model


def _logit(view, decoder, h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The target's logit before soft-capping, from the model's own final norm."""
    with torch.no_grad():
        scores = view.final_norm(h).double() @ decoder.matrix.double().T
    if decoder.bias is not None:
        scores = scores + decoder.bias.double()
    return scores.gather(-1, target.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("case", ALL_CASES)
@pytest.mark.parametrize("with_foil", [False, True])
def test_dla_sums_to_the_logit(case: str, with_foil: bool) -> None:
    view = view_of(tiny_model(case))
    decoder = decoder_of(view)
    rec = block_internals(view, tiny_ids())
    positions = torch.arange(SEQ)
    target = torch.randint(0, 128, (SEQ,), generator=torch.Generator().manual_seed(2))
    foil = (target + 1) % 128 if with_foil else None
    r = readouts(view, rec, decoder, positions, target, foil)
    total = (rec.embedding[0].double() * r.embed).sum(-1) + r.constant
    for layer, block in enumerate(rec.blocks):
        total += (block.attn_raw[0].double() * r.attn[layer]).sum(-1)
        total += (block.mlp_raw[0].double() * r.mlp[layer]).sum(-1)
    h_L = rec.blocks[-1].block_output[0]
    expected = _logit(view, decoder, h_L, target)
    if foil is not None:
        expected = expected - _logit(view, decoder, h_L, foil)
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["gpt2", "gemma2", "resstream_post", "resstream_learned", "gpt_neox"])
def test_readouts_agree_with_the_frozen_final_norm_of_each_component(case: str) -> None:
    """⟨component of h_L, frozen final norm⟩·W_U[w] for the materialised decomposition equals
    the read-out DLA of the same write, head by head."""
    view = view_of(tiny_model(case))
    decoder = decoder_of(view)
    rec = block_internals(view, tiny_ids())
    position = torch.tensor([7])
    target = torch.tensor([19])
    parts = decompose(view, rec, position)
    frozen = norm_form(view.final_norm).to(torch.float64).freeze(parts.state.double())
    direct = frozen.apply(parts.vectors.double()) @ decoder.matrix[19].double()  # (C, 1)
    r = readouts(view, rec, decoder, position, target)
    for layer, block in enumerate(view.blocks):
        heads = (parts.layers == layer) & (parts.kinds == KINDS.index("head"))
        z = rec.blocks[layer].z[0, 7].double()
        raw = torch.einsum("hd,hdm->hm", z, block.W_O.detach().double())
        ours = raw @ r.attn[layer][0]
        torch.testing.assert_close(ours, direct[heads, 0], rtol=1e-6, atol=1e-7)
