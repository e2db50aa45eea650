"""Capture: residual states from block hooks (h_0 = input of block 0, h_l = block outputs)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from resstream.capture import record, residual_states
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from resstream.models.adapters.base import InlineScale
from tests.test_models_adapters import HF_FAMILIES, SEQ, VOCAB, tiny_ids, tiny_model


def _hook_counts(view) -> list[tuple[int, int]]:
    """(forward hooks, pre-hooks) per block: Hugging Face 5.x installs its own output hooks."""
    return [(len(b.module._forward_hooks), len(b.module._forward_pre_hooks)) for b in view.blocks]


@pytest.mark.parametrize("case", HF_FAMILIES)
def test_states_are_block_outputs_not_hf_post_norm_hidden_states(case: str) -> None:
    model = tiny_model(case)
    view = view_of(model)
    ids = tiny_ids()
    before = _hook_counts(view)
    states = residual_states(view, ids)
    assert _hook_counts(view) == before
    assert states.shape == (view.n_layers + 1, 2, SEQ, view.d_model)
    assert states.dtype == torch.float32 and not states.is_inference()
    with torch.no_grad():
        hf = model(ids, output_hidden_states=True, use_cache=False).hidden_states  # the capture's path
    assert len(hf) == view.n_layers + 1
    for layer in range(view.n_layers):  # HF's entries agree before the last one ...
        torch.testing.assert_close(states[layer], hf[layer], rtol=0, atol=0)
    # ... whose last entry has the final norm applied: h_L is the raw last block output.
    assert not torch.allclose(states[-1], hf[-1], atol=1e-3)
    final_norm = view.final_norm  # without a logit scale the view carries (Cohere, Granite: `InlineScale`)
    final_norm = final_norm.inner if isinstance(final_norm, InlineScale) else final_norm
    torch.testing.assert_close(final_norm(states[-1]).detach(), hf[-1], rtol=1e-6, atol=1e-6)


def test_resstream_states_match_its_own_hidden_states() -> None:
    model = tiny_model("resstream_learned")
    view = view_of(model)
    ids = tiny_ids(seq=16)
    states = residual_states(view, ids)
    with torch.no_grad():
        expected = torch.stack(model.hidden_states(ids))
    assert torch.equal(states, expected)


def test_hooks_are_removed_when_the_forward_raises() -> None:
    view = view_of(tiny_model("llama"))
    before = _hook_counts(view)
    bad_ids = torch.full((1, 4), VOCAB + 5)  # out of the vocabulary: the embedding raises
    with pytest.raises(IndexError):
        residual_states(view, bad_ids)
    assert _hook_counts(view) == before

    def boom(input_ids, attention_mask=None):
        view.model.model(input_ids=input_ids)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        residual_states(dataclasses.replace(view, forward=boom), tiny_ids())
    assert _hook_counts(view) == before


def test_states_support_autograd_downstream() -> None:
    view = view_of(tiny_model("gpt2"))
    states = residual_states(view, tiny_ids())
    weight = torch.ones(view.d_model, requires_grad=True)
    (states[-1] @ weight).sum().backward()
    assert weight.grad is not None


def test_bad_shapes_and_too_long_sequences() -> None:
    view = view_of(tiny_model("gpt2"))
    with pytest.raises(ValueError, match="batch, seq"):
        residual_states(view, torch.tensor([1, 2, 3]))
    with pytest.raises(UsageError, match=r"sequence length 65 is over the model's context of 64"):
        residual_states(view, torch.ones(1, 65, dtype=torch.long))


def test_attention_mask_is_passed_and_batching_does_not_change_states() -> None:
    view = view_of(tiny_model("qwen2"))
    ids = tiny_ids(batch=3)
    together = residual_states(view, ids)
    alone = residual_states(view, ids[1:2])
    torch.testing.assert_close(together[:, 1:2], alone, rtol=1e-5, atol=1e-5)
    # Right padding: the real positions of a padded row equal the unpadded run.
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0
    padded = residual_states(view, ids, attention_mask=mask)
    short = residual_states(view, ids[:1, :8])
    torch.testing.assert_close(padded[:, :1, :8], short, rtol=1e-5, atol=1e-5)


def test_resstream_rejects_padding() -> None:
    view = view_of(tiny_model("resstream"))
    ids = tiny_ids(seq=8)
    mask = torch.ones_like(ids)
    residual_states(view, ids, attention_mask=mask)  # all ones is fine
    mask[0, -1] = 0
    with pytest.raises(ValueError, match="no padding"):
        residual_states(view, ids, attention_mask=mask)


def test_record_outputs_and_inputs() -> None:
    model = tiny_model("gpt2")
    view = view_of(model)
    ids = tiny_ids()
    mlps = {f"mlp{i}": b.mlp for i, b in enumerate(view.blocks)}
    counts = [len(m._forward_hooks) for m in mlps.values()]
    with record(mlps) as outs, torch.no_grad():
        model(ids)
    assert [len(v) for v in outs.values()] == [1, 1]
    assert outs["mlp0"][0].shape == (2, SEQ, view.d_model)
    with record([b.out_proj for b in view.blocks], inputs=True) as zs, torch.no_grad():
        model(ids)
    z = zs["0"][0]  # the concatenated per-head outputs that W_O reads
    assert z.shape == (2, SEQ, view.n_heads * view.d_head)
    assert [len(m._forward_hooks) for m in mlps.values()] == counts
    assert all(not b.out_proj._forward_pre_hooks for b in view.blocks)
