"""Routes (issue 27): proximity importances on every family, each one against a hand
computation from the decomposition's hooked subvalues, the graph of a hand-built model that
copies the previous token, and the graph, traffic and corpus counts on hand-made importances
checked against a brute-force walk over every path."""

from __future__ import annotations

import math
from functools import cache

import pytest
import torch

from resstream.analysis.attribution.decomposition import (
    KINDS,
    attention_base,
    residual_points,
    sublayer_writes,
)
from resstream.analysis.routes import (
    DEFAULT_THRESHOLD,
    CorpusTally,
    Edges,
    FlowImportances,
    attention_terms,
    check_threshold,
    flow_importances,
    head_traffic,
    mlp_traffic,
    propagate,
    proximity,
    route_edges,
    sequence_counts,
)
from resstream.capture import block_internals
from resstream.errors import UsageError
from resstream.models.adapters import ModelView, view_of
from resstream.models.adapters.base import Internals
from tests.test_models_adapters import ALL_CASES, SEQ, tiny_ids, tiny_model

SEQUENCE = 1  # the second sequence of `tiny_ids()`, so `sequence` is honoured
PARALLEL_CASES = ("gpt_neox", "falcon", "falcon_new", "cohere", "phi")
HAND_TOLERANCE = 1e-6  # float32 implementation against a float64 hand computation


@cache
def _recorded(case: str) -> tuple[ModelView, Internals, FlowImportances]:
    view = view_of(tiny_model(case))
    internals = block_internals(view, tiny_ids(), attention=True)
    return view, internals, flow_importances(view, internals, sequence=SEQUENCE)


# --------------------------------------------------------------------------------------------
# 1. every family: importances are shares, and the attention terms are the stream's sum


@pytest.mark.parametrize("case", ALL_CASES)
def test_importances_of_every_node_sum_to_one(case: str) -> None:
    view, _, imp = _recorded(case)
    n_layers, n_heads = view.n_layers, view.n_heads
    assert imp.heads.shape == (n_layers, SEQ, n_heads, SEQ)
    for name in ("attn_residual", "attn_bias", "mlp", "mlp_residual"):
        assert getattr(imp, name).shape == (n_layers, SEQ), name
    ones = torch.ones(n_layers, SEQ)
    attention = imp.heads.sum((2, 3)) + imp.attn_residual + imp.attn_bias
    torch.testing.assert_close(attention, ones, rtol=0, atol=1e-5)
    torch.testing.assert_close(imp.mlp + imp.mlp_residual, ones, rtol=0, atol=1e-5)
    for name in ("heads", "attn_residual", "attn_bias", "mlp", "mlp_residual"):
        values = getattr(imp, name)
        assert float(values.min()) >= 0.0 and float(values.max()) <= 1.0, name
    future = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)  # (i, j) with j > i
    assert torch.count_nonzero(imp.heads.permute(0, 2, 1, 3)[:, :, future]) == 0
    assert imp.parallel == (case in PARALLEL_CASES,) * n_layers


@pytest.mark.parametrize("case", ALL_CASES)
def test_attention_terms_add_up_to_the_actual_stream(case: str) -> None:
    """residual + bias + Σ weights·vectors is the sum it names, and that sum is the model's
    L_res (after the stream norm in a post-norm block); a subset of queries gives the same rows."""
    view, internals, _ = _recorded(case)
    states = residual_points(view, internals, list(range(SEQ)), sequence=SEQUENCE).double()
    for layer, (block, rec) in enumerate(zip(view.blocks, internals.blocks, strict=True)):
        total, residual, bias, weights, vectors = attention_terms(block, rec, SEQUENCE, torch.arange(SEQ))
        assert weights.shape == (view.n_heads, SEQ, SEQ) and vectors.shape[:2] == (view.n_heads, SEQ)
        rebuilt = residual.double() + bias.double() + torch.einsum("hnk,hkd->nd", weights, vectors).double()
        scale = float(total.double().norm(dim=-1).max())
        assert float((rebuilt - total.double()).abs().max()) <= 1e-5 * scale, f"{case} L{layer}"
        future = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
        assert torch.count_nonzero(weights[:, future]) == 0
        with torch.no_grad():
            state = total if block.norm_position == "pre" else block.ln1(total)
        assert float((state.double() - states[2 * layer + 1]).abs().max()) <= 1e-5 * scale
        rows = torch.tensor([3, 7])
        some = attention_terms(block, rec, SEQUENCE, rows)
        expected = (total[rows], residual[rows], bias[rows], weights[:, rows, :8], vectors[:, :8])
        for part, full in zip(some, expected, strict=True):
            torch.testing.assert_close(part, full, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------
# 2. every importance is the hand-computed proximity share of the hooked subvalues


def _hand_proximity(terms: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """max(0, ‖y‖₁ − ‖y − c‖₁), float64, straight from the definition."""
    terms, total = terms.double(), total.double()
    return (total.abs().sum(-1) - (total - terms).abs().sum(-1)).clamp_min(0.0)


def _assert_attention_shares_by_hand(view: ModelView, internals: Internals, imp: FlowImportances) -> int:
    """Terms from `sublayer_writes(sources=True)` (every head's every source as added, plus
    the biases) and the residual α·L_in; proximity and normalisation by hand in float64,
    compared with `imp`. Returns how many (term, node) pairs overshoot |y| somewhere."""
    positions = list(range(SEQ))
    at = (SEQUENCE, torch.arange(SEQ))
    overshoots = 0
    for layer in range(view.n_layers):
        writes = sublayer_writes(view, internals, layer, "attn", positions, sequence=SEQUENCE, sources=True)
        residual = attention_base(internals.blocks[layer], at).double()  # (T, d)
        parts = writes.vectors.double()  # (C, T, d)
        total = residual + parts.sum(0)
        torch.testing.assert_close(total, residual + writes.state.double(), rtol=1e-5, atol=1e-5)
        p_residual, p_parts = _hand_proximity(residual, total), _hand_proximity(parts, total)
        norm = p_residual + p_parts.sum(0)
        source = writes.kinds == KINDS.index("source")
        assert set(writes.kinds[~source].tolist()) <= {KINDS.index("attn_bias"), KINDS.index("norm_bias")}
        order = writes.heads[source] * SEQ + writes.sources[source]
        assert torch.equal(order, torch.arange(view.n_heads * SEQ))  # component h·T + j
        heads = (p_parts[source] / norm).reshape(view.n_heads, SEQ, SEQ).permute(2, 0, 1)  # (i, h, j)
        expected = {
            "heads": heads,
            "attn_residual": p_residual / norm,
            "attn_bias": p_parts[~source].sum(0) / norm,
        }
        for name, value in expected.items():
            got = getattr(imp, name)[layer].double()
            torch.testing.assert_close(got, value, rtol=0, atol=HAND_TOLERANCE, msg=f"L{layer} {name}")
        signs = torch.where(total >= 0, 1.0, -1.0).double()
        overshoots += int(((signs * parts - total.abs()) > 0).any(-1).sum())
    return overshoots


@pytest.mark.parametrize("case", ALL_CASES)
def test_attention_importances_are_the_hand_computed_shares(case: str) -> None:
    view, internals, imp = _recorded(case)
    overshoots = _assert_attention_shares_by_hand(view, internals, imp)
    assert overshoots > 0  # some term exceeds |y| at a coordinate: the correction is exercised


@pytest.mark.parametrize("family", ["olmo2", "granite"])
def test_attention_bias_through_a_post_attention_norm_by_hand(family: str) -> None:
    """An output bias that passes through a post-attention norm (OLMo-2's RMSNorm, Granite's
    residual multiplier) is scaled as the sources are: no tiny family above has both."""
    import transformers as tf

    config = dict(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        vocab_size=128,
        max_position_embeddings=64,
        attention_bias=True,
    )
    if family == "olmo2":
        hf_config = tf.Olmo2Config(**config)
    else:
        hf_config = tf.GraniteConfig(**config, residual_multiplier=0.5, embedding_multiplier=3.0)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    view = view_of(model.eval())
    assert all(b.b_O is not None and b.post_attn_norm is not None for b in view.blocks)
    internals = block_internals(view, tiny_ids(), attention=True)
    imp = flow_importances(view, internals, sequence=SEQUENCE)
    _assert_attention_shares_by_hand(view, internals, imp)
    assert float(imp.attn_bias.max()) > 1e-4  # the bias term is a real share here


@pytest.mark.parametrize("case", ALL_CASES)
def test_mlp_importances_are_the_hand_computed_shares(case: str) -> None:
    """Terms L_res (the decomposition's residual point 2l+1; a parallel block's is L_in +
    attention output) and the MLP's output as added."""
    view, internals, imp = _recorded(case)
    positions = list(range(SEQ))
    states = residual_points(view, internals, positions, sequence=SEQUENCE)
    for layer in range(view.n_layers):
        base = states[2 * layer + 1].double()
        written = sublayer_writes(view, internals, layer, "mlp", positions, sequence=SEQUENCE).state.double()
        total = base + written
        p_base, p_mlp = _hand_proximity(base, total), _hand_proximity(written, total)
        torch.testing.assert_close(
            imp.mlp[layer].double(), p_mlp / (p_base + p_mlp), rtol=0, atol=HAND_TOLERANCE
        )
        torch.testing.assert_close(
            imp.mlp_residual[layer].double(), p_base / (p_base + p_mlp), rtol=0, atol=HAND_TOLERANCE
        )
        block = view.blocks[layer]
        with torch.no_grad():  # the sum is L_out (after the stream norm in a post-norm block)
            state = total if block.norm_position == "pre" else block.ln2(total.float()).double()
        out = internals.blocks[layer].block_output[SEQUENCE].double()
        torch.testing.assert_close(state, out, rtol=1e-5, atol=1e-5)


def test_proximity_is_the_definition() -> None:
    """The coordinate-wise `proximity` equals max(0, ‖y‖₁ − ‖y − c‖₁), with terms that
    overshoot the sum, point against it, are zero, and sums with zero coordinates."""
    generator = torch.Generator().manual_seed(3)
    total = torch.randn(5, 16, generator=generator, dtype=torch.float64)
    total[:, :3] = 0.0
    terms = torch.randn(7, 5, 16, generator=generator, dtype=torch.float64) * torch.tensor(
        [0.1, 0.5, 1.0, 3.0, 10.0, 0.0, -1.0]
    ).reshape(7, 1, 1)
    terms[6] = -total  # pointing exactly against the sum: 0
    got = proximity(terms, total)
    expected = _hand_proximity(terms, total)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(got[5]) == 0 and torch.count_nonzero(got[6]) == 0
    torch.testing.assert_close(proximity(total, total), total.abs().sum(-1))  # the sum itself: ‖y‖₁


# --------------------------------------------------------------------------------------------
# 3. a hand-built 2-layer model whose second layer copies the previous token

COPY_TOKENS = (3, 1, 4, 1, 5, 2)  # token 1 twice: the edge follows the position, not the token
SHARP = 480.0  # query scale: logit gap 480/√16 = 120, so every softmax is one-hot in float32
SELF_GAIN, COPY_GAIN = 1.0, 6.0  # block 0 writes its own token ×1, block 1 the previous one ×6


@cache
def _copy_model() -> ModelView:
    """resstream GPT, no norms, no biases, d = 32 = token one-hots (0..7) + position one-hots
    (8..15) + block 1's write (16..23) + block 0's write (24..31). Head 0 of block l attends
    from i to the source j with i = j + l (block 0: itself; block 1: the previous position,
    position 0 itself) and writes the source's token one-hot × gain; head 1 and both MLPs
    write nothing."""
    from resstream.training.config import ModelConfig
    from resstream.training.model import GPT

    config = ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=8, vocab_size=8, norm="none", bias=False)
    model = GPT(config)
    eye = torch.eye(8)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.wte.weight[:, 0:8] = eye
        model.wpe.weight[:, 8:16] = eye
        for layer, (out, gain) in enumerate(((24, SELF_GAIN), (16, COPY_GAIN))):
            attn = model.blocks[layer].attn
            qkv = attn.c_attn.weight  # (3d, d): q rows 0..31, k 32..63, v 64..95; head 0 first 16
            for position in range(8):
                qkv[position, 8 + position] = SHARP  # q_i = SHARP·e_i
                qkv[32 + position + layer, 8 + position] = 1.0  # k_j = e_{j + layer}
            qkv[64:72, 0:8] = eye  # v_j = token one-hot of j
            attn.c_proj.weight[out : out + 8, 0:8] = gain * eye
    return view_of(model.eval())


@cache
def _copy_internals() -> Internals:
    return block_internals(_copy_model(), torch.tensor([COPY_TOKENS]), attention=True)


@cache
def _copy_importances() -> FlowImportances:
    return flow_importances(_copy_model(), _copy_internals())


def _edge_list(edges: Edges) -> list[tuple]:
    """Each edge as (kind, layer, head, source, target, from_point, to_point), in order."""
    return [
        (
            edges.kind(k),
            int(edges.layers[k]),
            int(edges.heads[k]),
            int(edges.sources[k]),
            int(edges.targets[k]),
            int(edges.from_points[k]),
            int(edges.to_points[k]),
        )
        for k in range(len(edges))
    ]


def _edge_set(edges: Edges) -> set[tuple]:
    return set(_edge_list(edges))


def test_copy_model_attends_as_built() -> None:
    """The construction: head 0 of block 0 one-hot on the diagonal, of block 1 one-hot on the
    previous position; nothing else writes."""
    internals = _copy_internals()
    seq = len(COPY_TOKENS)
    previous = torch.zeros(seq, seq)
    previous[torch.arange(seq), (torch.arange(seq) - 1).clamp_min(0)] = 1.0
    assert torch.equal(internals.blocks[0].probs[0, 0], torch.eye(seq))
    assert torch.equal(internals.blocks[1].probs[0, 0], previous)
    for rec in internals.blocks:
        assert torch.count_nonzero(rec.mlp_output) == 0
        assert torch.count_nonzero(rec.z[0, :, 1]) == 0  # head 1 writes nothing
    copied = internals.blocks[1].attn_output[0, :, 16:24].argmax(-1)
    assert copied.tolist() == [COPY_TOKENS[0], *COPY_TOKENS[:-1]]


def test_copy_model_importances_are_the_designed_shares() -> None:
    """Block 0: residual ‖tok + pos‖₁ = 2 against the self-copy 1 (2/3, 1/3); block 1:
    residual 3 against the copy 6 (1/3, 2/3); MLPs write nothing (residual 1)."""
    imp = _copy_importances()
    seq = len(COPY_TOKENS)
    source = (torch.arange(seq) - 1).clamp_min(0)
    expected_heads = torch.zeros(2, seq, 2, seq)
    expected_heads[0, torch.arange(seq), 0, torch.arange(seq)] = 1 / 3
    expected_heads[1, torch.arange(seq), 0, source] = 2 / 3
    torch.testing.assert_close(imp.heads, expected_heads, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        imp.attn_residual, torch.tensor([[2 / 3] * seq, [1 / 3] * seq]), rtol=0, atol=1e-6
    )
    assert torch.count_nonzero(imp.attn_bias) == 0 and torch.count_nonzero(imp.mlp) == 0
    assert torch.equal(imp.mlp_residual, torch.ones(2, seq))
    assert imp.degenerate == 0 and imp.parallel == (False, False)


def _copy_route(target: int, threshold: float) -> set[tuple]:
    """The expected route of the prediction at `target`: block 1's copy edge from the previous
    position s, and at τ ≤ 1/3 also the residual edges at the target and block 0's self-copy
    edges at both positions."""
    s = max(target - 1, 0)
    edges = {("residual", 1, -1, target, target, 3, 4), ("head", 1, 0, s, target, 2, 3)}
    below = {s}
    if threshold <= 1 / 3:
        edges.add(("residual", 1, -1, target, target, 2, 3))
        below.add(target)
    for p in below:
        edges |= {("residual", 0, -1, p, p, 1, 2), ("residual", 0, -1, p, p, 0, 1)}
        if threshold <= 1 / 3:
            edges.add(("head", 0, 0, p, p, 0, 1))
    return edges


@pytest.mark.parametrize("threshold", [DEFAULT_THRESHOLD, 0.5])
@pytest.mark.parametrize("target", range(len(COPY_TOKENS)))
def test_copy_model_route_has_exactly_the_expected_edges(target: int, threshold: float) -> None:
    imp = _copy_importances()
    edges = route_edges(imp, target, threshold)
    assert _edge_set(edges) == _copy_route(target, threshold)
    assert len(edges) == len(_copy_route(target, threshold))  # no duplicates
    expected = {("head", 1): 2 / 3, ("head", 0): 1 / 3, ("residual", 1): 1 / 3, ("residual", 0): 2 / 3}
    for k in range(len(edges)):
        key = (edges.kind(k), int(edges.layers[k]))
        if int(edges.to_points[k]) % 2 == 0:  # into an MLP node: the residual carries all
            assert edges.kind(k) == "residual" and float(edges.importances[k]) == 1.0
        else:
            assert float(edges.importances[k]) == pytest.approx(expected[key], abs=1e-6)
    assert [int(x) for x in edges.layers] == sorted((int(x) for x in edges.layers), reverse=True)


def test_copy_model_flow_through_the_heads() -> None:
    """Without a threshold: 2/3 of the prediction flows through the copy head, and block 0's
    self head carries 1/3 of each position's state: 1/3·1/3 + 2/3·1/3 = 1/3."""
    imp = _copy_importances()
    targets = torch.arange(len(COPY_TOKENS))
    flow = propagate(imp, targets, None)
    heads = head_traffic(imp, flow, None)
    expected = torch.zeros(len(targets), 2, 2)
    expected[:, 0, 0], expected[:, 1, 0] = 1 / 3, 2 / 3
    torch.testing.assert_close(heads, expected, rtol=0, atol=1e-6)
    assert torch.count_nonzero(mlp_traffic(imp, flow, None)) == 0
    torch.testing.assert_close(flow[0].sum(-1), torch.ones(len(targets)), rtol=0, atol=1e-6)  # no bias


def test_a_sum_whose_terms_cancel_is_degenerate() -> None:
    """One block, one head attending to itself and writing −x: every L_res is exactly 0, so
    no term of any node has a positive proximity; each node gives its residual importance 1
    and is counted in `degenerate` (T attention + T MLP nodes)."""
    from resstream.training.config import ModelConfig
    from resstream.training.model import GPT

    config = ModelConfig(n_layer=1, n_head=1, d_model=32, block_size=8, vocab_size=8, norm="none", bias=False)
    model = GPT(config)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.wte.weight[:, 0:8] = torch.eye(8)
        model.wpe.weight[:, 8:16] = torch.eye(8)
        qkv = model.blocks[0].attn.c_attn.weight
        for position in range(8):
            qkv[position, 8 + position] = 2 * SHARP  # head_dim 32: logit gap 960/√32 ≈ 170
            qkv[32 + position, 8 + position] = 1.0
        qkv[64:96] = torch.eye(32)
        model.blocks[0].attn.c_proj.weight.copy_(-torch.eye(32))
    view = view_of(model.eval())
    internals = block_internals(view, torch.tensor([COPY_TOKENS]), attention=True)
    seq = len(COPY_TOKENS)
    assert torch.count_nonzero(residual_points(view, internals, list(range(seq)))[1:]) == 0
    imp = flow_importances(view, internals)
    assert imp.degenerate == 2 * seq
    assert torch.equal(imp.attn_residual, torch.ones(1, seq)) and torch.equal(
        imp.mlp_residual, torch.ones(1, seq)
    )
    assert torch.count_nonzero(imp.heads) == 0 and torch.count_nonzero(imp.mlp) == 0
    assert torch.count_nonzero(imp.attn_bias) == 0


# --------------------------------------------------------------------------------------------
# 4. the graph on hand-made importances (2 layers, 3 positions, 2 heads), against brute force

TAU = 2 / 16  # exactly representable: importances of exactly 2/16 sit on the boundary

# sixteenths, per node summing to 16; heads[layer][query i][head h][source j]
HEADS16 = (
    (((2, 0, 0), (1, 0, 0)), ((0, 3, 0), (5, 0, 0)), ((0, 2, 4), (0, 0, 0))),
    (((4, 0, 0), (0, 0, 0)), ((2, 1, 0), (0, 4, 0)), ((1, 6, 0), (2, 0, 1))),
)
ATTN_RESIDUAL16 = ((13, 8, 9), (12, 8, 5))
ATTN_BIAS16 = ((0, 0, 1), (0, 1, 1))
MLP16 = ((0, 6, 2), (4, 8, 6))
MLP_RESIDUAL16 = ((16, 10, 14), (12, 8, 10))


def _hand_importances(parallel: tuple[bool, bool] = (False, False)) -> FlowImportances:
    def sixteenths(values: tuple) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32) / 16

    return FlowImportances(
        heads=sixteenths(HEADS16),
        attn_residual=sixteenths(ATTN_RESIDUAL16),
        attn_bias=sixteenths(ATTN_BIAS16),
        mlp=sixteenths(MLP16),
        mlp_residual=sixteenths(MLP_RESIDUAL16),
        parallel=parallel,
        degenerate=0,
    )


def _random_importances(
    seed: int, parallel: tuple[bool, ...], seq: int = 4, n_heads: int = 2
) -> FlowImportances:
    """Random per-node shares (causal heads), for the brute-force comparisons."""
    generator = torch.Generator().manual_seed(seed)
    n_layers = len(parallel)
    raw = torch.rand(n_layers, seq, n_heads, seq, generator=generator) ** 3  # many small entries
    raw = raw * torch.ones(seq, seq).tril()[None, :, None, :]
    residual, bias = torch.rand(2, n_layers, seq, generator=generator)
    norm = raw.sum((2, 3)) + residual + 0.1 * bias
    mlp = torch.rand(n_layers, seq, generator=generator)
    return FlowImportances(
        heads=raw / norm[..., None, None],
        attn_residual=residual / norm,
        attn_bias=0.1 * bias / norm,
        mlp=mlp,
        mlp_residual=1 - mlp,
        parallel=parallel,
        degenerate=0,
    )


def _all_edges(imp: FlowImportances) -> list[tuple]:
    """Every edge of the full graph by plain loops: (kind, layer, head, source, target,
    from_point, to_point, importance)."""
    edges = []
    for layer in range(imp.n_layers):
        low, mid, top = 2 * layer, 2 * layer + 1, 2 * layer + 2
        for i in range(imp.seq_len):
            edges.append(("residual", layer, -1, i, i, mid, top, float(imp.mlp_residual[layer, i])))
            mlp_from = low if imp.parallel[layer] else mid
            edges.append(("mlp", layer, -1, i, i, mlp_from, top, float(imp.mlp[layer, i])))
            edges.append(("residual", layer, -1, i, i, low, mid, float(imp.attn_residual[layer, i])))
            for h in range(imp.n_heads):
                for j in range(i + 1):
                    edges.append(("head", layer, h, j, i, low, mid, float(imp.heads[layer, i, h, j])))
    return edges


def _brute_force(imp: FlowImportances, target: int, threshold: float):
    """Every node's flow (Σ over paths from the prediction's node of Π importances) and
    whether it is on the route (some path of edges ≥ threshold), by recursion over paths;
    and the kept edges."""
    edges = _all_edges(imp)
    start = (2 * imp.n_layers, target)

    def flow(node: tuple[int, int]) -> float:
        if node == start:
            return 1.0
        return sum(e[7] * flow((e[6], e[4])) for e in edges if (e[5], e[3]) == node)

    def on(node: tuple[int, int]) -> bool:
        if node == start:
            return True
        return any(e[7] >= threshold and on((e[6], e[4])) for e in edges if (e[5], e[3]) == node)

    nodes = [(p, i) for p in range(2 * imp.n_layers + 1) for i in range(imp.seq_len)]
    flows = {node: flow(node) for node in nodes}
    reach = {node: on(node) for node in nodes}
    kept = [e for e in edges if e[7] >= threshold and reach[(e[6], e[4])]]
    return flows, reach, kept, edges


def _check_against_brute_force(imp: FlowImportances, threshold: float) -> None:
    targets = torch.arange(imp.seq_len)
    reach_points = propagate(imp, targets, threshold)
    flow_points = propagate(imp, targets, None)
    traffic = head_traffic(imp, reach_points, threshold)
    head_flow = head_traffic(imp, flow_points, None)
    mlps, mlp_flow = mlp_traffic(imp, reach_points, threshold), mlp_traffic(imp, flow_points, None)
    for t in range(imp.seq_len):
        flows, reach, kept, edges = _brute_force(imp, t, threshold)
        for (point, i), value in flows.items():
            assert float(flow_points[point][t, i]) == pytest.approx(value, abs=1e-6), (t, point, i)
            assert float(reach_points[point][t, i]) == float(reach[(point, i)]), (t, point, i)
        got = route_edges(imp, t, threshold)
        assert _edge_set(got) == {e[:7] for e in kept} and len(got) == len(kept)
        importances = {key: float(got.importances[k]) for k, key in enumerate(_edge_list(got))}
        assert importances == {e[:7]: e[7] for e in kept}
        for layer in range(imp.n_layers):
            for h in range(imp.n_heads):
                mine = [e for e in edges if e[0] == "head" and e[1] == layer and e[2] == h]
                count = sum(1 for e in kept if e[0] == "head" and e[1] == layer and e[2] == h)
                assert float(traffic[t, layer, h]) == count
                through = sum(e[7] * flows[(e[6], e[4])] for e in mine)
                assert float(head_flow[t, layer, h]) == pytest.approx(through, abs=1e-6)
            mlp_edges = [e for e in edges if e[0] == "mlp" and e[1] == layer]
            assert float(mlps[t, layer]) == sum(1 for e in kept if e[0] == "mlp" and e[1] == layer)
            through = sum(e[7] * flows[(e[6], e[4])] for e in mlp_edges)
            assert float(mlp_flow[t, layer]) == pytest.approx(through, abs=1e-6)


def test_route_of_hand_made_importances_is_the_hand_traced_one() -> None:
    """Target 2 at τ = 2/16, traced by hand: every edge of exactly 2/16 is kept (L1.H1 0→2,
    L0.H0 0→0, L0.H0 1→2, L0's MLP at 2), every one below it dropped."""
    imp = _hand_importances()
    expected = {
        ("residual", 1, -1, 2, 2, 3, 4),
        ("mlp", 1, -1, 2, 2, 3, 4),
        ("residual", 1, -1, 2, 2, 2, 3),
        ("head", 1, 0, 1, 2, 2, 3),
        ("head", 1, 1, 0, 2, 2, 3),
        *(("residual", 0, -1, i, i, 1, 2) for i in range(3)),
        *(("mlp", 0, -1, i, i, 1, 2) for i in (1, 2)),
        *(("residual", 0, -1, i, i, 0, 1) for i in range(3)),
        ("head", 0, 0, 0, 0, 0, 1),
        ("head", 0, 0, 1, 1, 0, 1),
        ("head", 0, 1, 0, 1, 0, 1),
        ("head", 0, 0, 1, 2, 0, 1),
        ("head", 0, 0, 2, 2, 0, 1),
    }
    edges = route_edges(imp, 2, TAU)
    assert _edge_set(edges) == expected and len(edges) == len(expected)
    assert float(edges.importances.min()) == TAU
    # τ = 1/2: only the MLP node's residual (10/16) survives, and the route stops at L_res_1
    assert _edge_set(route_edges(imp, 2, 0.5)) == {("residual", 1, -1, 2, 2, 3, 4)}
    points = propagate(imp, torch.tensor([2]), 0.5)
    assert [p[0].tolist() for p in points] == [[0, 0, 0]] * 3 + [[0, 0, 1]] * 2


def test_flows_of_hand_made_importances() -> None:
    """Target 2, no threshold: L_res_1 has flow 1 (its MLP node's terms sum to 1); L_in_1 gets
    head sources 3/16 (j=0), 6/16 (j=1) and residual + head 6/16 (j=2), 15/16 in all (the
    bias takes 1/16); L_in_0 gets 15/16 − 6/16·1/16 = 234/256. Head L1.H0's flow is 7/16,
    the MLPs' 6/16 and 6/16·6/16 + 6/16·2/16 = 3/16."""
    imp = _hand_importances()
    points = propagate(imp, torch.tensor([2]), None)
    torch.testing.assert_close(points[3][0], torch.tensor([0.0, 0.0, 1.0]))
    torch.testing.assert_close(points[2][0], torch.tensor([3 / 16, 6 / 16, 6 / 16]))
    assert float(points[0][0].sum()) == pytest.approx(234 / 256, abs=1e-6)
    heads = head_traffic(imp, points, None)
    assert float(heads[0, 1, 0]) == pytest.approx(7 / 16, abs=1e-7)
    assert float(heads[0, 1, 1]) == pytest.approx(3 / 16, abs=1e-7)
    torch.testing.assert_close(mlp_traffic(imp, points, None)[0], torch.tensor([3 / 16, 6 / 16]))


def test_parallel_block_mlp_edge_starts_at_the_block_input() -> None:
    """Block 1 parallel: its MLP edge runs (2, i) → (4, i), and at τ = 6/16 it alone puts
    (2, 2) on the route (the residual 5/16 into L_res_1 is below τ)."""
    serial, parallel = _hand_importances(), _hand_importances((False, True))
    assert ("mlp", 1, -1, 2, 2, 2, 4) in _edge_set(route_edges(parallel, 2, TAU))
    assert ("mlp", 1, -1, 2, 2, 3, 4) not in _edge_set(route_edges(parallel, 2, TAU))
    tau = 6 / 16
    assert propagate(serial, torch.tensor([2]), tau)[2][0].tolist() == [0, 1, 0]
    assert propagate(parallel, torch.tensor([2]), tau)[2][0].tolist() == [0, 1, 1]
    # flow: L_res_1 gets only the residual 10/16, L_in_1 at 2 the MLP's 6/16 directly
    flow = propagate(parallel, torch.tensor([2]), None)
    torch.testing.assert_close(flow[3][0], torch.tensor([0.0, 0.0, 10 / 16]))
    assert float(flow[2][0, 2]) == pytest.approx(6 / 16 + 10 / 16 * 6 / 16, abs=1e-7)
    first = _hand_importances((True, False))
    assert {e for e in _edge_set(route_edges(first, 2, TAU)) if e[0] == "mlp" and e[1] == 0} == {
        ("mlp", 0, -1, 1, 1, 0, 2),
        ("mlp", 0, -1, 2, 2, 0, 2),
    }


def test_threshold_boundary_is_kept() -> None:
    """An importance of exactly τ is kept; the next float32 below it is not."""
    below = torch.nextafter(torch.tensor(TAU), torch.tensor(0.0))
    imp = _hand_importances()
    heads = imp.heads.clone()
    heads[1, 2, 1, 0] = below  # L1.H1 0→2 was exactly τ
    lowered = FlowImportances(
        heads, imp.attn_residual, imp.attn_bias, imp.mlp, imp.mlp_residual, imp.parallel, imp.degenerate
    )
    assert ("head", 1, 1, 0, 2, 2, 3) in _edge_set(route_edges(imp, 2, TAU))
    assert ("head", 1, 1, 0, 2, 2, 3) not in _edge_set(route_edges(lowered, 2, TAU))
    assert float(head_traffic(imp, propagate(imp, torch.tensor([2]), TAU), TAU)[0, 1, 1]) == 1.0
    assert float(head_traffic(lowered, propagate(lowered, torch.tensor([2]), TAU), TAU)[0, 1, 1]) == 0.0


def test_route_edges_are_in_the_documented_order() -> None:
    """Block by block from the top; the MLP node's edges (residual, then MLP) before the
    attention node's (residual, then heads by target, head, source)."""
    edges = route_edges(_hand_importances(), 2, TAU)
    rank = {"residual": 0, "mlp": 1, "head": 1}
    keys = [
        (
            -int(edges.layers[k]),
            -int(edges.to_points[k]),
            rank[edges.kind(k)],
            int(edges.targets[k]),
            int(edges.heads[k]),
            int(edges.sources[k]),
        )
        for k in range(len(edges))
    ]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


@pytest.mark.parametrize("parallel", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("threshold", [TAU, 0.3])
def test_graph_of_hand_made_importances_matches_brute_force(
    parallel: tuple[bool, bool], threshold: float
) -> None:
    _check_against_brute_force(_hand_importances(parallel), threshold)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("threshold", [0.05, 0.2])
def test_graph_of_random_importances_matches_brute_force(seed: int, threshold: float) -> None:
    _check_against_brute_force(_random_importances(seed, (False, True, False)), threshold)


@pytest.mark.parametrize("threshold", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_check_threshold_refuses_outside_the_open_interval(threshold: float) -> None:
    with pytest.raises(UsageError, match="strictly between 0 and 1"):
        check_threshold(threshold)


def test_check_threshold_accepts_inside() -> None:
    assert check_threshold(DEFAULT_THRESHOLD) == DEFAULT_THRESHOLD == 0.04
    assert check_threshold(0.999) == 0.999


# --------------------------------------------------------------------------------------------
# 5. corpus counts on the hand-made importances


def test_sequence_counts_of_hand_made_importances() -> None:
    """Predictions at 0 and 1 (T = 3), τ = 2/16, traced by hand. Target 0: head edges L1.H0
    0→0 and L0.H0 0→0, L1's MLP. Target 1: L1.H0 0→1, L1.H1 1→1, L0.H0 0→0, L0.H0 1→1,
    L0.H1 0→1, both MLPs. Categories: first 2 + 3, previous 0 + 2, same 2 + 3, of 2 + 5."""
    imp = _hand_importances()
    counts = sequence_counts(imp, TAU)
    assert counts.positions == 2
    assert counts.head_on.tolist() == [[2, 1], [2, 1]]
    assert counts.mlp_on.tolist() == [1, 2]
    assert counts.attention_on.tolist() == [2, 2]
    assert counts.categories == {"first": 5, "previous": 2, "same": 5}
    assert counts.head_edges == 7
    # flows summed over the two predictions: L1.H0 4/16 + 3/16, L1.H1 0 + 4/16, L1's MLP 4/16 + 8/16
    assert float(counts.head_flow[1, 0]) == pytest.approx(7 / 16, abs=1e-6)
    assert float(counts.head_flow[1, 1]) == pytest.approx(4 / 16, abs=1e-6)
    assert float(counts.mlp_flow[1]) == pytest.approx(12 / 16, abs=1e-6)
    for layer in range(2):  # layer 0 against the brute-force walk
        for h in range(2):
            through = 0.0
            for t in (0, 1):
                flows, _, _, edges = _brute_force(imp, t, TAU)
                through += sum(
                    e[7] * flows[(e[6], e[4])] for e in edges if e[0] == "head" and e[1:3] == (layer, h)
                )
            assert float(counts.head_flow[layer, h]) == pytest.approx(through, abs=1e-6)


def test_sequence_counts_at_a_higher_threshold() -> None:
    """τ = 4/16. Target 0: L1.H0 0→0 (first, same), both L1 edges into L_out_1. Target 1:
    L1.H1 1→1 (same), L0.H1 0→1 (first, previous), L0's MLP (6/16)."""
    counts = sequence_counts(_hand_importances(), 4 / 16)
    assert counts.head_on.tolist() == [[0, 1], [1, 1]]
    assert counts.mlp_on.tolist() == [1, 2]
    assert counts.attention_on.tolist() == [1, 2]
    assert counts.categories == {"first": 2, "previous": 1, "same": 2}
    assert counts.head_edges == 3


def test_corpus_rates_pool_sequences_with_intervals() -> None:
    imp = _hand_importances()
    one = CorpusTally()
    one.add(sequence_counts(imp, TAU))
    rates = one.rates()
    single = rates["head_on_route"][1][1]
    assert single.value == 0.5 and math.isnan(single.low) and math.isnan(single.high)
    assert rates["edge_shares"]["first"].value == pytest.approx(5 / 7)
    assert math.isnan(rates["edge_shares"]["first"].low)
    assert rates["head_flow"][1][0] == pytest.approx(7 / 16 / 2, abs=1e-6)
    assert rates["mlp_flow"][1] == pytest.approx(12 / 16 / 2, abs=1e-6)

    two = CorpusTally()
    two.add(sequence_counts(imp, TAU))
    two.add(sequence_counts(imp, 4 / 16))
    assert two.positions == 4
    rates = two.rates()
    head = rates["head_on_route"]
    assert [[r.value for r in row] for row in head] == [[0.5, 0.5], [0.75, 0.5]]
    for row in head:
        for rate in row:
            assert math.isfinite(rate.low) and math.isfinite(rate.high)
            assert 0.0 <= rate.low <= rate.value <= rate.high <= 1.0
    assert [r.value for r in rates["mlp_on_route"]] == [0.5, 1.0]
    assert (rates["mlp_on_route"][1].low, rates["mlp_on_route"][1].high) == (1.0, 1.0)  # same in both
    assert [r.value for r in rates["attention_on_route"]] == [0.75, 1.0]
    # first: (5 + 2) / (7 + 3) = 0.7; residuals 5 − 4.9, 2 − 2.1; se = √(2·0.02)/10 = 0.02;
    # half width t(0.975, 1 dof) · se = 12.7062 · 0.02
    first = rates["edge_shares"]["first"]
    assert first.value == pytest.approx(0.7)
    assert first.low == pytest.approx(0.7 - 12.7062 * 0.02, abs=1e-4)
    assert first.high == pytest.approx(0.7 + 12.7062 * 0.02, abs=1e-4)
    assert rates["edge_shares"]["previous"].value == pytest.approx(0.3)
    assert rates["edge_shares"]["same"].value == pytest.approx(0.7)
    with pytest.raises(ValueError, match="no sequence"):
        CorpusTally().rates()


# --------------------------------------------------------------------------------------------
# 6. the memory budget changes the blocking, not the numbers


@pytest.mark.parametrize("case", ["gpt2", "gemma2", "gpt_neox"])
def test_memory_budget_gives_the_same_importances(case: str) -> None:
    view, internals, imp = _recorded(case)
    five_queries = view.n_heads * SEQ * 4 * 5  # blocks of 5, 5, 2 queries
    for budget in (1, five_queries):
        small = flow_importances(view, internals, sequence=SEQUENCE, memory_budget=budget)
        for name in ("heads", "attn_residual", "attn_bias", "mlp", "mlp_residual"):
            torch.testing.assert_close(getattr(small, name), getattr(imp, name), rtol=0, atol=1e-6)
        assert small.degenerate == imp.degenerate


@pytest.mark.parametrize("budget", [0, -1])
def test_memory_budget_must_be_positive(budget: int) -> None:
    view, internals, _ = _recorded("gpt2")
    with pytest.raises(ValueError, match="memory_budget must be positive"):
        flow_importances(view, internals, memory_budget=budget)


def test_a_corpus_rate_is_the_packages_one_interval_type() -> None:
    """`Rate` (routes_corpus's shares) is `Estimate`, as faithfulness's and the simulations'
    intervals are: one value-with-interval type, one `to_dict`."""
    from resstream.analysis.routes import Rate
    from resstream.simulation.intervals import Estimate

    assert Rate is Estimate
    assert Rate(0.5, 0.25, 0.75).to_dict() == {"value": 0.5, "low": 0.25, "high": 0.75}
