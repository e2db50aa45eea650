"""Head composition through QK-norm (issue 26): the reading matrices carry the query/key norm
as it acts on a direction, and with the actual scales they give the model's own normalised
query and key (hooks on the QK-norm modules); unit gains are no norm for RMSNorm QK-norms; the
transformer-lens convention refuses such models."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from resstream.analysis.memories.composition import (
    KINDS,
    composition,
    read_through_ln1,
    read_through_qk_norm,
)
from resstream.analysis.norms import norm_form
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from tests.test_attribution_heads import QK_MODULES, centred, per_head, scale

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SEQ = 5  # random stream vectors fed as the embeddings (not the head count, so layouts are told apart)
#: RMSNorm QK-norms: with unit gains they act on a direction as the identity.
RMS_CASES = ("qwen3", "gemma3_text", "olmo2", "olmo3")


def qk_model(case: str) -> torch.nn.Module:
    """A copy of the tiny model with every bias zeroed (so the query is linear in the stream)."""
    from tests.test_models_adapters import tiny_model

    model = copy.deepcopy(tiny_model(case))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.zero_()
    return model


@pytest.mark.parametrize("case", list(QK_MODULES))
@pytest.mark.parametrize("which", ["q", "k"])
def test_the_reading_matrix_gives_the_models_normalised_query_at_the_actual_scales(case, which):
    """u · (N_ln1 W[h] N_qk) / (s_ln1(u) · s_qk(q)) is the model's q_norm(ln1(u) W)[h], for
    random stream vectors u fed as block 0's input (the embeddings)."""
    model = qk_model(case)
    view = view_of(model)
    block = view.blocks[0]
    weights = block.read_attention_weights()
    matrix = read_through_qk_norm(
        block, which, read_through_ln1(block, weights.W_Q if which == "q" else weights.W_K)
    ).double()  # (H, d, d_head)
    u = torch.randn(1, SEQ, view.d_model, generator=torch.Generator().manual_seed(7))
    layer = model.model.layers[0]
    norm = getattr(layer.self_attn, QK_MODULES[case][0 if which == "q" else 1])
    seen: dict[str, torch.Tensor] = {}
    handle = norm.register_forward_hook(lambda m, a, o: seen.update(i=a[0].detach(), o=o.detach()))
    with torch.no_grad():
        model(inputs_embeds=u)
    handle.remove()
    q_in = per_head(seen["i"], view.d_head, SEQ)[0].double()  # (SEQ, kv, d_head)
    q_out = per_head(seen["o"], view.d_head, SEQ)[0].double()
    ln1 = getattr(layer, "input_layernorm", None)
    joined = block.qk_norm_span == "all"
    for position in range(SEQ):
        x = u[0, position].double()
        s1 = 1.0 if ln1 is None else scale(x, ln1)
        for head in range(view.n_heads):
            kv = head // (view.n_heads // q_in.shape[1])
            s_q = scale(q_in[position].reshape(-1) if joined else q_in[position, kv], norm)
            ours = x @ matrix[head] / (s1 * s_q)
            torch.testing.assert_close(ours, q_out[position, kv], rtol=1e-4, atol=1e-5)


def unit_gains(model: torch.nn.Module, case: str) -> None:
    """Set every QK-norm's gain to 1 (Gemma's RMSNorm: weight 0, its gain being 1 + weight)."""
    with torch.no_grad():
        for layer in model.model.layers:
            for name in QK_MODULES[case]:
                module = getattr(layer.self_attn, name)
                module.weight.fill_(1.0)
                if bool((norm_form(module).gain != 1.0).any()):
                    module.weight.zero_()
                assert bool((norm_form(module).gain == 1.0).all())


@pytest.mark.parametrize("case", RMS_CASES)
def test_a_qk_norm_with_unit_gains_gives_the_scores_of_no_norm(case):
    model = qk_model(case)
    unit_gains(model, case)
    view = view_of(model)
    without = replace(view, blocks=tuple(replace(b, q_norm=None, k_norm=None) for b in view.blocks))
    ours, plain = composition(view, model=case, samples=4), composition(without, model=case, samples=4)
    for kind in KINDS:
        torch.testing.assert_close(
            ours.scores(kind), plain.scores(kind), rtol=1e-5, atol=1e-7, equal_nan=True
        )


def test_the_qk_norm_gain_moves_q_and_k_scores_but_not_v_and_its_size_moves_nothing():
    model = qk_model("qwen3")
    view = view_of(model)
    before = composition(view, model="q", samples=4)
    norm = view.blocks[1].q_norm
    with torch.no_grad():
        norm.weight.mul_(5.0)  # the whole gain: the scores are scale-free
    same = composition(view, model="q", samples=4)
    with torch.no_grad():
        norm.weight[:4].mul_(10.0)  # a few coordinates: a different direction
    moved = composition(view, model="q", samples=4)
    for kind in KINDS:
        torch.testing.assert_close(
            same.scores(kind), before.scores(kind), rtol=1e-5, atol=1e-7, equal_nan=True
        )
    for kind in ("q", "k"):
        assert not torch.allclose(moved.scores(kind), before.scores(kind), rtol=1e-3, equal_nan=True)
    torch.testing.assert_close(moved.v, before.v, equal_nan=True)


@pytest.mark.parametrize("case", list(QK_MODULES))
def test_qk_norm_scores_lie_in_zero_one(case):
    result = composition(view_of(qk_model(case)), model=case, samples=4)
    for kind in KINDS:
        values = result.scores(kind)[~result.scores(kind).isnan()]
        assert bool(((values >= 0) & (values <= 1 + 1e-6)).all())


def test_a_centring_qk_norm_centres_each_heads_reading_matrix():
    """Cohere's LayerNorm QK-norm, gains set to 1: each head's query reading matrix is
    N_ln1 W_Q[h] with every row centred over d_head."""
    model = qk_model("cohere")
    unit_gains(model, "cohere")
    block = view_of(model).blocks[0]
    reading = read_through_ln1(block, block.read_attention_weights().W_Q)
    ours = read_through_qk_norm(block, "q", reading)
    torch.testing.assert_close(ours, reading - reading.mean(-1, keepdim=True))
    assert torch.allclose(centred(ours[0, 0].double(), block.q_norm).float(), ours[0, 0], atol=1e-6)


def test_transformer_lens_refuses_a_qk_norm_model_in_one_line():
    with pytest.raises(
        UsageError, match=r"^`convention` 'transformer-lens' is not defined for 'q', which normalises"
    ):
        composition(view_of(qk_model("qwen3")), model="q", convention="transformer-lens", samples=4)


def test_a_per_head_gain_is_read_as_one_row_of_gains_per_head():
    """Cohere's QK-norm weight is (heads, d_head): `norm_form` reads it as a gain per row,
    each head's d_head centred and normalised alone, and reproduces the module."""
    module = view_of(qk_model("cohere")).blocks[0].k_norm
    form = norm_form(module)
    assert form.centre and form.gain.shape == module.weight.shape == (2, 8)
    u = torch.randn(3, 5, 2, 8, generator=torch.Generator().manual_seed(2)) * 3
    with torch.no_grad():
        torch.testing.assert_close(form(u), module(u), rtol=1e-5, atol=1e-6)
