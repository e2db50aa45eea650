"""Norm formulas: every norm module of every family is read as centre(u)·g/s(u) + b, and the
frozen (linearised) norm splits a sum exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from resstream.analysis.norms import NormForm, norm_form
from resstream.models.adapters import view_of
from tests.test_models_adapters import ALL_CASES, tiny_model


def _norms(view) -> list[nn.Module]:
    found = [view.final_norm]
    for block in view.blocks:
        found += [
            m for m in (block.ln1, block.ln2, block.post_attn_norm, block.post_mlp_norm) if m is not None
        ]
    return found


@pytest.mark.parametrize("case", ALL_CASES)
def test_every_norm_of_every_family_is_read_exactly(case: str) -> None:
    view = view_of(tiny_model(case))
    u = torch.randn(4, 7, view.d_model, generator=torch.Generator().manual_seed(5)) * 3
    for module in _norms(view):
        form = norm_form(module)
        with torch.no_grad():
            torch.testing.assert_close(form(u), module(u), rtol=1e-5, atol=1e-6)


def test_gemma_gain_is_one_plus_weight() -> None:
    view = view_of(tiny_model("gemma"))
    form = norm_form(view.final_norm)
    assert torch.equal(form.gain, 1.0 + view.final_norm.weight)
    assert not form.centre and form.bias is None


def test_frozen_norm_splits_a_sum_exactly() -> None:
    layer = nn.LayerNorm(6)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(1.0, 7.0))
        layer.bias.copy_(torch.full((6,), 0.5))
    parts = torch.randn(3, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    u = parts.sum(0)
    form = norm_form(layer)
    frozen = form.freeze(u)
    summed = frozen.apply(parts).sum(0) + form.offset(u)
    torch.testing.assert_close(summed, layer.double()(u), rtol=1e-12, atol=1e-12)


def test_hand_computed_rms_norm() -> None:
    form = NormForm(centre=False, eps=0.0, gain=torch.tensor([2.0, 1.0]))
    # u = (3, 4): rms = sqrt((9 + 16) / 2) = 5/sqrt(2); norm = u·g/rms = (6, 4)·sqrt(2)/5
    out = form(torch.tensor([3.0, 4.0]))
    torch.testing.assert_close(out, torch.tensor([6.0, 4.0]) * 2**0.5 / 5)


def test_identity_and_unknown_norms() -> None:
    assert norm_form(nn.Identity()).identity
    assert torch.equal(norm_form(None)(torch.ones(3)), torch.ones(3))

    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))
            self.eps = 1e-6

        def forward(self, x):
            return x * 2

    with pytest.raises(ValueError, match="matches neither"):
        norm_form(Odd())
    with pytest.raises(ValueError, match="cannot read"):
        norm_form(nn.ReLU())


@pytest.mark.parametrize(
    ("dtype", "eps"),
    [
        (torch.float32, torch.finfo(torch.float32).eps),
        (torch.float64, torch.finfo(torch.float64).eps),
        # torch adds the eps of the type it computes in: float32 for half-precision inputs
        (torch.bfloat16, torch.finfo(torch.float32).eps),
        (torch.float16, torch.finfo(torch.float32).eps),
    ],
)
def test_rms_norm_without_eps_reads_the_eps_torch_uses(dtype: torch.dtype, eps: float) -> None:
    layer = nn.RMSNorm(4).to(dtype)
    assert layer.eps is None
    form = norm_form(layer)
    assert form.eps == eps and not form.centre
    # u tiny enough that eps matters: mean(u²) = 5e-9, torch.finfo(float32).eps ≈ 1.19e-7
    u = torch.tensor([1e-4, -1e-4, 0.0, 0.0], dtype=torch.float64)
    expected = u / (5e-9 + eps) ** 0.5
    torch.testing.assert_close(form.to(torch.float64)(u), expected, rtol=1e-12, atol=0.0)
    with torch.no_grad():
        actual = layer(u.to(dtype)).double()
    torch.testing.assert_close(actual, expected, rtol=1e-2, atol=0.0)


def test_layer_norm_without_affine_has_no_gain_or_bias() -> None:
    layer = nn.LayerNorm(3, elementwise_affine=False, eps=0.0)
    form = norm_form(layer)
    assert form.centre and form.gain is None and form.bias is None
    # u = (1, 2, 6): mean 3, centred (-2, -1, 3), variance 14/3
    u = torch.tensor([1.0, 2.0, 6.0], dtype=torch.float64)
    expected = torch.tensor([-2.0, -1.0, 3.0], dtype=torch.float64) / (14 / 3) ** 0.5
    torch.testing.assert_close(form(u), expected)


def test_rms_norm_without_affine_has_no_gain() -> None:
    layer = nn.RMSNorm(2, elementwise_affine=False, eps=0.0)
    form = norm_form(layer)
    assert not form.centre and form.gain is None and form.bias is None
    # u = (3, 4): rms = 5/sqrt(2)
    torch.testing.assert_close(form(torch.tensor([3.0, 4.0])), torch.tensor([3.0, 4.0]) * 2**0.5 / 5)


def test_a_norm_over_more_than_the_last_dim_is_refused() -> None:
    with pytest.raises(ValueError, match="normalises over 2 dims"):
        norm_form(nn.LayerNorm((2, 3)))
