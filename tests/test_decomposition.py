"""Decomposition: the components sum back to the captured state at every residual point, for
every family, at every level of detail."""

from __future__ import annotations

import pytest
import torch

from resstream.analysis.attribution.decomposition import KINDS, decompose, point_count, point_name
from resstream.capture import block_internals, record
from resstream.models.adapters import view_of
from tests.test_models_adapters import ALL_CASES, SEQ, tiny_ids, tiny_model

TOLERANCE = 1e-5  # max |Σ − h| ≤ 1e-5·‖h‖


def _internals(case: str):
    view = view_of(tiny_model(case))
    return view, block_internals(view, tiny_ids(), attention=True)


@pytest.mark.parametrize("case", ALL_CASES)
@pytest.mark.parametrize(
    "level",
    [
        {"heads": False},
        {"heads": True},
        {"sources": True},
        {"neurons": True},
        {"sources": True, "neurons": True},
    ],
)
def test_components_sum_to_the_state_at_every_point(case: str, level: dict) -> None:
    view, rec = _internals(case)
    positions = [0, 5, SEQ - 1]
    for point in range(point_count(view.n_layers)):
        parts = decompose(view, rec, positions, point=point, sequence=1, **level)
        _, relative = parts.residual()
        assert relative <= TOLERANCE, f"{case} {point_name(point)} {level}: {relative:.2e}"


@pytest.mark.parametrize("case", ALL_CASES)
def test_outputs_states_are_the_captured_block_outputs(case: str) -> None:
    view, rec = _internals(case)
    for layer in range(view.n_layers):
        parts = decompose(view, rec, list(range(SEQ)), point=2 * layer + 2)
        assert torch.equal(parts.state, rec.blocks[layer].block_output[0])
    assert torch.equal(decompose(view, rec, [3], point=0).vectors[0, 0], rec.embedding[0, 3])


@pytest.mark.parametrize("case", ALL_CASES)
def test_head_outputs_equal_what_the_attention_module_computes(case: str) -> None:
    """Σ_h z_h W_O[h] + b_O is the attention module's own (hooked) output to 1e-5 — the raw
    output, before any post-attention norm — for every family; and where nothing rescales
    the heads' writes (no post norm, gate or post-norm block) the decomposition's head parts
    are exactly these."""
    view, rec = _internals(case)
    ids = tiny_ids()
    with torch.no_grad(), record([b.attn for b in view.blocks]) as seen:
        view.model(ids)
    for layer, block in enumerate(view.blocks):
        hooked = seen[str(layer)][0]
        heads = torch.einsum("bthd,hdm->btm", rec.blocks[layer].z, block.W_O.detach())
        if block.b_O is not None:
            heads = heads + block.b_O.detach()
        torch.testing.assert_close(heads, hooked, rtol=1e-5, atol=1e-5)
        rescaled = block.post_attn_norm is not None or block.norm_position == "post"
        if rescaled or rec.blocks[layer].identity_scale is not None:
            continue
        parts = decompose(view, rec, list(range(SEQ)), point=2 * layer + 1)
        attention_kinds = torch.tensor([KINDS.index("head"), KINDS.index("attn_bias")])
        mask = (parts.layers == layer) & torch.isin(parts.kinds, attention_kinds)
        torch.testing.assert_close(parts.vectors[mask].sum(0), hooked[0], rtol=1e-5, atol=1e-5)


def test_labels_and_counts() -> None:
    view, rec = _internals("gpt2")
    parts = decompose(view, rec, [4], sources=True, neurons=True)
    labels = [parts.label(i) for i in range(len(parts))]
    d_ff = view.blocks[0].mlp_weights().d_ff
    # embed + per layer: heads x SEQ sources, attn bias, d_ff neurons, mlp bias
    assert len(parts) == 1 + view.n_layers * (view.n_heads * SEQ + 1 + d_ff + 1)
    assert labels[0] == "emb" and "L0.H2.S3" in labels and "L1.N7" in labels and "L1.mlp_bias" in labels
    # sources after the position get exactly zero weight (causal mask)
    future = parts.sources > 4
    assert torch.count_nonzero(parts.vectors[future]) == 0


def test_post_norm_adds_norm_bias_components() -> None:
    view, rec = _internals("resstream_post")
    parts = decompose(view, rec, [2])
    assert "L0.norm_bias" in [parts.label(i) for i in range(len(parts))]


def test_bad_points_and_positions() -> None:
    view, rec = _internals("gpt2")
    with pytest.raises(ValueError, match=r"outside 0\.\.4"):
        decompose(view, rec, [0], point=5)
    with pytest.raises(ValueError, match=r"positions must lie in 0\.\.11"):
        decompose(view, rec, [12])
    no_probs = block_internals(view, tiny_ids())
    with pytest.raises(ValueError, match="attention=True"):
        decompose(view, no_probs, [1], sources=True)


def test_sources_from_recorded_query_rows_equal_those_from_full_maps() -> None:
    """`block_internals(attention=[positions])` keeps only those query rows (L·H·N·T floats
    instead of L·H·T²); the sources they give are the same, other rows are refused."""
    view = view_of(tiny_model("llama"))
    full = block_internals(view, tiny_ids(), attention=True)
    rows = block_internals(view, tiny_ids(), attention=[3, 9])
    assert rows.blocks[0].probs.shape == (2, view.n_heads, 2, SEQ)
    a = decompose(view, full, [9], sequence=1, sources=True)
    b = decompose(view, rows, [9], sequence=1, sources=True)
    torch.testing.assert_close(a.vectors, b.vectors, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"recorded for query positions \[3, 9\], not \[5\]"):
        decompose(view, rows, [5], sources=True)
