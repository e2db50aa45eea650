"""Attention probabilities from every family: causal rows that sum to one, equal to the math."""

from __future__ import annotations

import math

import pytest
import torch

from resstream.capture import attention_probs, residual_states
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from tests.test_models_adapters import ALL_CASES, HF_FAMILIES, SEQ, tiny_ids, tiny_model


@pytest.mark.parametrize("case", ALL_CASES)
def test_every_family_gives_causal_rows_that_sum_to_one(case: str) -> None:
    view = view_of(tiny_model(case))
    probs = attention_probs(view, tiny_ids())
    assert probs.shape == (view.n_layers, 2, view.n_heads, SEQ, SEQ)
    assert probs.dtype == torch.float32
    assert torch.all(probs.triu(1) == 0)
    if view.blocks[0].sinks is not None:  # attention sinks take mass: tests/test_models_experts.py
        return
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
    assert probs[..., 0, 0].eq(1).all()  # the first query sees only itself


@pytest.mark.parametrize("case", ["gpt2", "llama"])
def test_hugging_face_attention_implementation_is_restored(case: str) -> None:
    model = tiny_model(case)
    before = model.config._attn_implementation
    attention_probs(view_of(model), tiny_ids())
    assert model.config._attn_implementation == before


@pytest.mark.parametrize("case", ["resstream", "resstream_rotary_rms", "resstream_post"])
def test_resstream_probabilities_reproduce_the_fused_attention_output(case: str) -> None:
    model = tiny_model(case)
    ids = tiny_ids()
    outputs, inputs = [], []

    def keep(module, args, output) -> None:
        inputs.append(args[0])
        outputs.append(output)

    handles = [block.attn.register_forward_hook(keep) for block in model.blocks]
    with torch.no_grad():
        model.hidden_states(ids)
    for handle in handles:
        handle.remove()
    probs = attention_probs(view_of(model), ids)
    for layer, block in enumerate(model.blocks):
        _, _, v = block.attn._heads(inputs[layer])
        z = (probs[layer] @ v).transpose(1, 2).reshape(inputs[layer].shape)
        torch.testing.assert_close(block.attn.c_proj(z), outputs[layer], atol=1e-6, rtol=1e-5)


def test_gpt2_layer_0_by_hand() -> None:
    model = tiny_model("gpt2")
    view = view_of(model)
    ids = tiny_ids(batch=1)
    h0 = residual_states(view, ids)[0]
    attn = model.transformer.h[0].attn
    q, k, _ = attn.c_attn(model.transformer.h[0].ln_1(h0)).split(32, dim=2)
    q, k = (t.view(1, SEQ, 4, 8).transpose(1, 2) for t in (q, k))
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    expected = scores.masked_fill(torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    torch.testing.assert_close(attention_probs(view, ids)[0], expected.detach())


def test_sequence_over_the_context_is_refused() -> None:
    view = view_of(tiny_model("resstream"))  # block_size 16
    with pytest.raises(UsageError, match="sequence length 17 is over the model's context of 16"):
        attention_probs(view, tiny_ids(seq=17))


@pytest.mark.parametrize("case", [*HF_FAMILIES, "resstream"])
def test_hooked_maps_equal_the_models_own_attention_outputs_and_rows_are_cut(case: str) -> None:
    """The weights taken by hooks are the maps the model returns with output_attentions=True,
    and `attention_rows` keeps exactly the chosen query rows of each."""
    from resstream.capture.attention import attention_rows, eager_attention

    view = view_of(tiny_model(case))
    ids = tiny_ids()
    full = attention_probs(view, ids)
    if view.attention is None:
        with torch.no_grad(), eager_attention(view.model):
            # use_cache=False: the path the capture runs (a cache changes which kernels round)
            theirs = view.model(ids, output_attentions=True, use_cache=False).attentions
            theirs = torch.stack(theirs).float()
        torch.testing.assert_close(full, theirs, rtol=0, atol=0)
    rows = torch.tensor([0, 7, SEQ - 1])
    cut = attention_rows(view, ids, rows)
    assert len(cut) == view.n_layers
    for layer, probs in enumerate(cut):
        assert probs.shape == (2, view.n_heads, 3, SEQ)
        torch.testing.assert_close(probs, full[layer][:, :, rows], rtol=0, atol=0)
