"""Head composition scores (issue 11, item 6): hand cases, the fast form against the naive d×d
products for every family, invariances, the random baseline, the result object and the API."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn

import resstream
from resstream.analysis.memories.composition import (
    KINDS,
    composition,
    pair_scores,
    random_baseline,
    squeezed_read,
    squeezed_write,
)
from resstream.analysis.norms import norm_form
from resstream.errors import UsageError
from resstream.models.adapters import AttentionWeights, BlockView, ModelView, view_of
from tests.test_models_adapters import ALL_CASES, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def naive_score(M_A: torch.Tensor, R: torch.Tensor) -> float:
    """‖M_A R‖_F / (‖M_A‖_F ‖R‖_F) from the d×d matrices themselves."""
    return float(torch.linalg.norm(M_A @ R) / (torch.linalg.norm(M_A) * torch.linalg.norm(R)))


def fast_score(V, W, P, S) -> float:
    """The same score through the squeezed d_head-wide factors (one pair)."""
    return float(pair_scores(squeezed_write(V, W)[None], squeezed_read(P, S)[None])[0, 0])


def unit(d: int, *entries: tuple[int, float]) -> torch.Tensor:
    """A column (d, 1) with the given entries."""
    column = torch.zeros(d, 1, dtype=torch.float64)
    for index, value in entries:
        column[index, 0] = value
    return column


# ---- hand cases (d = 3, rank 1) ---------------------------------------------------------


def test_orthogonal_write_and_read_compose_to_zero():
    """Head a writes along e1 (W = e1ᵀ); head b reads along e2 (P = e2): M_A R = V (W·P) Sᵀ = 0."""
    V, W = unit(3, (2, 1.0)), unit(3, (0, 2.0)).T
    P, S = unit(3, (1, 1.0)), unit(3, (0, 1.0), (2, 1.0))
    assert naive_score(V @ W, P @ S.T) == 0.0
    assert fast_score(V, W, P, S) == 0.0


def test_identical_rank_one_write_and_read_compose_to_one():
    """W = P = e1: ‖V (W·P) Sᵀ‖ = ‖V‖‖S‖ = ‖V W‖ ‖P Sᵀ‖, score 1 (whatever V and S are)."""
    V, W = unit(3, (0, 3.0), (1, 4.0)), unit(3, (0, 1.0)).T
    P, S = unit(3, (0, 1.0)), unit(3, (1, -2.0), (2, 0.5))
    assert naive_score(V @ W, P @ S.T) == pytest.approx(1.0)
    assert fast_score(V, W, P, S) == pytest.approx(1.0)


@pytest.mark.parametrize("angle", [0.3, 1.0, 2.5])
def test_rank_one_score_is_the_cosine_between_write_and_read_directions(angle):
    """W = e1ᵀ, P = cos θ e1 + sin θ e2: score |cos θ|."""
    V, W = unit(3, (2, 1.0)), unit(3, (0, 1.0)).T
    P, S = unit(3, (0, math.cos(angle)), (1, math.sin(angle))), unit(3, (1, 1.0))
    assert fast_score(V, W, P, S) == pytest.approx(abs(math.cos(angle)))
    assert naive_score(V @ W, P @ S.T) == pytest.approx(abs(math.cos(angle)))


def test_a_zero_matrix_scores_zero():
    V, W = unit(3), unit(3, (0, 1.0)).T
    P, S = unit(3, (0, 1.0)), unit(3, (0, 1.0))
    assert fast_score(V, W, P, S) == 0.0


def test_fast_form_equals_naive_on_random_full_width_factors():
    generator = torch.Generator().manual_seed(3)
    d, h = 12, 5
    V, P, S = (torch.randn(d, h, generator=generator, dtype=torch.float64) for _ in range(3))
    W = torch.randn(h, d, generator=generator, dtype=torch.float64)
    assert fast_score(V, W, P, S) == pytest.approx(naive_score(V @ W, P @ S.T), rel=1e-12)


# ---- orientation on a hand-built model ----------------------------------------------------


def hand_view(blocks: list[dict[str, torch.Tensor]], d: int) -> ModelView:
    """A ModelView of blocks given by their per-head W_Q, W_K, W_V (H, d, h) and W_O (H, h, d);
    no norms (gain 1), nothing else used."""

    def block(weights: dict[str, torch.Tensor]) -> BlockView:
        return BlockView(
            module=nn.Identity(),
            ln1=None,
            attn=nn.Identity(),
            ln2=None,
            mlp=nn.Identity(),
            W_O=weights["W_O"],
            attention_weights=lambda: AttentionWeights(weights["W_Q"], weights["W_K"], weights["W_V"]),
        )

    H = blocks[0]["W_O"].shape[0]
    return ModelView(
        family="hand",
        model=nn.Identity(),
        embed=lambda ids: ids,
        blocks=tuple(block(weights) for weights in blocks),
        final_norm=nn.Identity(),
        W_U=torch.zeros(4, d),
        W_E=torch.zeros(4, d),
        tied=True,
        n_heads=H,
        d_model=d,
        max_positions=None,
    )


def e(d: int, i: int) -> torch.Tensor:
    out = torch.zeros(d)
    out[i] = 1.0
    return out


def test_query_side_key_side_and_value_are_told_apart():
    """d = 4, one head per layer, d_head = 1. Layer 0 reads e0 and writes e1. Layer 1's query
    reads e1, its key reads e2 and its value reads e3: only Q-composition is 1, K and V 0.
    Swapping the later head's query and key swaps Q and K; reading e1 with the value gives V."""
    d = 4
    first = {
        "W_Q": e(d, 0)[None, :, None],
        "W_K": e(d, 0)[None, :, None],
        "W_V": e(d, 0)[None, :, None],
        "W_O": e(d, 1)[None, None, :],
    }

    def later(q: int, k: int, v: int) -> dict[str, torch.Tensor]:
        return {
            "W_Q": e(d, q)[None, :, None],
            "W_K": e(d, k)[None, :, None],
            "W_V": e(d, v)[None, :, None],
            "W_O": e(d, 0)[None, None, :],
        }

    scores = composition(hand_view([first, later(1, 2, 3)], d), model="hand", samples=4)
    assert [float(scores.scores(kind)[0, 0, 1, 0]) for kind in KINDS] == [1.0, 0.0, 0.0]
    swapped = composition(hand_view([first, later(2, 1, 3)], d), model="hand", samples=4)
    assert [float(swapped.scores(kind)[0, 0, 1, 0]) for kind in KINDS] == [0.0, 1.0, 0.0]
    value = composition(hand_view([first, later(2, 3, 1)], d), model="hand", samples=4)
    assert [float(value.scores(kind)[0, 0, 1, 0]) for kind in KINDS] == [0.0, 0.0, 1.0]
    assert scores.q[1, 0, 0, 0].isnan() and scores.q[0, 0, 0, 0].isnan()  # l2 <= l1 is NaN


def random_hand_view(layers: int = 3, heads: int = 2, d: int = 4) -> ModelView:
    """A hand view of `layers` blocks of `heads` random rank-1 heads."""
    generator = torch.Generator().manual_seed(0)
    blocks = [
        {
            name: torch.randn(heads, d, 1, generator=generator)
            if name != "W_O"
            else torch.randn(heads, 1, d, generator=generator)
            for name in ("W_Q", "W_K", "W_V", "W_O")
        }
        for _ in range(layers)
    ]
    return hand_view(blocks, d)


def test_top_ranks_pairs_and_refuses_zero():
    heads = 2
    result = composition(random_hand_view(heads=heads), model="hand", samples=4)
    for kind in KINDS:
        top = result.top(kind, 100)
        assert len(top) == heads * heads * 3  # pairs of layers (0,1), (0,2), (1,2)
        assert [p.score for p in top] == sorted((p.score for p in top), reverse=True)
        best = top[0]
        assert best.layer_a < best.layer_b
        assert best.score == float(result.scores(kind)[best.layer_a, best.head_a, best.layer_b, best.head_b])
        assert len(result.top(kind, 2)) == 2
    with pytest.raises(UsageError, match=r"`top` 0 is not allowed; allowed: an integer >= 1"):
        result.top("q", 0)


# ---- every family: the fast form against the naive d×d products ---------------------------


def norm_matrix(module, d: int) -> torch.Tensor:
    """A norm as it acts on a direction, as a d×d matrix N (u ↦ u·N): C·G, C the centring
    (LayerNorm; I for RMSNorm), G = diag(gain); its scale 1/s left out."""
    form = norm_form(module)
    centring = torch.eye(d) - (1.0 / d if form.centre else 0.0)
    gain = torch.ones(d) if form.gain is None else form.gain.detach().float().expand(d)  # a scalar: Granite
    return centring @ torch.diag(gain)


def centring_of(module, d: int) -> torch.Tensor:
    """C where `module` is a LayerNorm, I otherwise."""
    return torch.eye(d) - (1.0 / d if norm_form(module).centre else 0.0)


def qk_reading(view: ModelView, block, which: str, h: int) -> torch.Tensor:
    """Head h's W_Q or W_K (d × d_head) followed by the block's QK-norm as it acts on a
    direction, from the definition: per head, W[h]·C·diag(gain) (a 2-D gain: head h's row of
    it, its key/value head's for keys); over all heads joined, the d × (heads·d_head) matrix
    of the distinct heads times the norm's (heads·d_head)² matrix, head h's columns of it."""
    weights = block.attention_weights()
    W = (weights.W_Q if which == "q" else weights.W_K).detach().float()
    module = block.q_norm if which == "q" else block.k_norm
    if module is None:
        return W[h]
    d_head, n_heads = view.d_head, view.n_heads
    gain = norm_form(module).gain.detach().float()
    if block.qk_norm_span == "all":
        distinct = gain.numel() // d_head
        group = n_heads // distinct
        joined = torch.cat([W[j * group] for j in range(distinct)], dim=1)
        own = (h // group) * d_head
        return (joined @ norm_matrix(module, gain.numel()))[:, own : own + d_head]
    if gain.ndim == 2:
        gain = gain[h // (n_heads // gain.shape[0])]
    return W[h] @ centring_of(module, d_head) @ torch.diag(gain)


def naive_matrices(
    view: ModelView, l1: int, h1: int, l2: int, h2: int, convention: str = "resstream"
) -> tuple[torch.Tensor, dict]:
    """M_A and R_Q, R_K, R_V as d×d matrices, straight from the definitions (module docstring of
    `resstream.analysis.memories.composition`)."""
    d = view.d_model
    a, b = view.blocks[l1], view.blocks[l2]

    def reading(block) -> torch.Tensor:  # the head's own ln1 (post-norm: none)
        return torch.eye(d) if block.norm_position == "post" else norm_matrix(block.ln1, d)

    def ov(block, h: int) -> torch.Tensor:
        W_O = block.W_O[h].detach().float()
        if convention == "resstream" and block.post_attn_norm is not None:
            W_O = W_O @ norm_matrix(block.post_attn_norm, d)
        if block.norm_position == "pre":  # as the stream's norms see it
            W_O = W_O @ centring_of(block.ln1, d)
        return reading(block) @ block.attention_weights().W_V[h].float() @ W_O

    M_A = ov(a, h1)
    if b.norm_position == "post":  # the norms between the two heads act on the write
        for block in view.blocks[l1:l2]:
            for norm in (block.ln1, block.ln2):
                M_A = M_A @ norm_matrix(norm, d)
    R_Q = reading(b) @ qk_reading(view, b, "q", h2) @ (reading(b) @ qk_reading(view, b, "k", h2)).T
    return M_A, {"q": R_Q, "k": R_Q.T, "v": ov(b, h2)}


@pytest.mark.parametrize("case", ALL_CASES)
def test_fast_scores_equal_the_naive_products_for_every_family(case):
    view = view_of(tiny_model(case))
    result = composition(view, model=case, samples=8)
    L, H = view.n_layers, view.n_heads
    assert result.q.shape == (L, H, L, H) and (result.n_layers, result.n_heads) == (L, H)
    with torch.no_grad():
        for l1, h1, l2, h2 in result.pairs():
            M_A, reads = naive_matrices(view, l1, h1, l2, h2)
            for kind in KINDS:
                expected = naive_score(M_A.double(), reads[kind].double())
                assert float(result.scores(kind)[l1, h1, l2, h2]) == pytest.approx(expected, rel=1e-4), (
                    kind,
                    (l1, h1, l2, h2),
                )
    for kind in KINDS:
        valid = ~result.scores(kind).isnan()
        assert int(valid.sum()) == H * H * L * (L - 1) // 2
        assert bool(((result.scores(kind)[valid] >= 0) & (result.scores(kind)[valid] <= 1 + 1e-6)).all())


def test_the_later_ln1_gain_is_folded_into_the_reading_matrices():
    """Scaling one coordinate of block 1's ln1 gain changes Q/K/V-scores (it is folded in);
    scaling the whole gain by a constant does not (the score is scale-free)."""
    model = copy.deepcopy(tiny_model("resstream"))
    view = view_of(model)
    before = composition(view, model="m", samples=4)
    with torch.no_grad():
        view.blocks[1].ln1.weight.mul_(3.0)
    assert torch.allclose(composition(view, model="m", samples=4).q, before.q, equal_nan=True, rtol=1e-5)
    with torch.no_grad():
        view.blocks[1].ln1.weight[:4].mul_(10.0)
    changed = composition(view, model="m", samples=4)
    for kind in KINDS:
        assert not torch.allclose(changed.scores(kind), before.scores(kind), equal_nan=True, rtol=1e-3)


@pytest.mark.parametrize("case", ["resstream", "llama", "gemma2"])
def test_scaling_a_heads_W_O_changes_no_score(case):
    """Head 1 of layer 0 and of layer 1 write 7× more: each score divides that factor out."""
    model = copy.deepcopy(tiny_model(case))
    view = view_of(model)
    before = composition(view, model=case, samples=4)
    written = view.blocks[0].W_O[1].clone()
    d_head = view.d_head
    with torch.no_grad():
        for block in view.blocks:
            block.out_proj.weight[:, d_head : 2 * d_head].mul_(7.0)
    changed = view_of(model)
    torch.testing.assert_close(changed.blocks[0].W_O[1], 7.0 * written)
    after = composition(changed, model=case, samples=4)
    for kind in KINDS:
        torch.testing.assert_close(
            after.scores(kind), before.scores(kind), rtol=1e-4, atol=1e-6, equal_nan=True
        )


def test_a_one_layer_model_has_no_pairs():
    from resstream.training.config import ModelConfig
    from resstream.training.model import GPT

    view = view_of(GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=8, vocab_size=32)))
    with pytest.raises(UsageError, match=r"model 'one' has 1 layer; head composition needs heads in two"):
        composition(view, model="one")


# ---- the random baseline ------------------------------------------------------------------


@pytest.mark.parametrize(("d", "h"), [(32, 8), (64, 16), (48, 1)])
def test_the_baseline_mean_square_is_one_over_d_within_sampling_error(d, h):
    baseline = random_baseline(d, h, samples=400, seed=1)
    assert baseline.rms_analytic == pytest.approx(1 / math.sqrt(d))
    assert abs(baseline.mean_square - 1 / d) <= 4 * baseline.mean_square_stderr
    assert baseline.mean <= baseline.rms  # Jensen
    assert baseline.samples == 400 and baseline.seed == 1


def test_a_rank_one_baseline_is_the_mean_absolute_cosine():
    """d_head = 1: the score is |cos| of two random directions, E|cos| = Γ(d/2)/(√π Γ((d+1)/2))."""
    d = 20
    baseline = random_baseline(d, 1, samples=2000, seed=2)
    expected = math.exp(math.lgamma(d / 2) - math.lgamma((d + 1) / 2)) / math.sqrt(math.pi)
    assert abs(baseline.mean - expected) <= 4 * baseline.stderr


def test_the_baseline_is_seeded():
    assert random_baseline(16, 4, samples=20, seed=5) == random_baseline(16, 4, samples=20, seed=5)
    assert random_baseline(16, 4, samples=20, seed=5) != random_baseline(16, 4, samples=20, seed=6)


# ---- the result and the API ---------------------------------------------------------------


def test_to_dict_is_strict_json_with_every_pair():
    result = composition(view_of(tiny_model("gpt2")), model="gpt2", samples=8)
    data = json.loads(json.dumps(result.to_dict(top=3), allow_nan=False))
    assert data["model"] == "gpt2" and (data["n_layers"], data["n_heads"]) == (2, 4)
    assert len(data["pairs"]) == 16 and set(data["pairs"][0]) == {
        "layer_a",
        "head_a",
        "layer_b",
        "head_b",
        "q",
        "k",
        "v",
    }
    assert all(len(data["top"][kind]) == 3 for kind in KINDS)
    assert data["top"]["v"][0]["score"] == max(pair["v"] for pair in data["pairs"])
    assert data["baseline"]["rms_analytic"] == pytest.approx(1 / math.sqrt(32))


def test_the_api_takes_a_model_object_without_a_tokenizer_and_a_spec():
    result = resstream.composition(tiny_model("llama"), samples=8)
    assert result.n_layers == 2 and result.d_head == 8
    reference = resstream.composition(samples=8, device="cpu", progress=False)
    assert reference.model == "reference" and reference.q.shape == (6, 4, 6, 4)
    with pytest.raises(UsageError, match="`dtype` applies to models loaded from a spec"):
        resstream.composition(tiny_model("llama"), dtype="float32")


def test_the_heatmap_puts_later_heads_in_rows_and_earlier_heads_in_columns(tmp_path):
    from resstream.reporting.composition import composition_csv, heatmap_matrix, plot_composition

    result = composition(random_hand_view(layers=4, heads=2), model="hand", samples=4)
    L, H = result.n_layers, result.n_heads
    for kind in KINDS:
        matrix = heatmap_matrix(result, kind)
        assert matrix.shape == ((L - 1) * H, (L - 1) * H)
        for l1 in range(L - 1):
            for l2 in range(1, L):
                for h1 in range(H):
                    for h2 in range(H):
                        cell = matrix[(l2 - 1) * H + h2, l1 * H + h1]
                        if l2 <= l1:
                            assert math.isnan(cell)
                        else:
                            assert cell == float(result.scores(kind)[l1, h1, l2, h2])
    assert plot_composition(result, "v", tmp_path / "v.png").read_bytes().startswith(b"\x89PNG")
    rows = composition_csv(result).splitlines()
    header = "kind,writer_layer,writer_head,reader_layer,reader_head,score,baseline"
    assert rows[0] == header and len(rows) == 1 + 3 * H * H * 6


@pytest.mark.parametrize(
    ("layers", "heads", "every_head", "first_columns", "first_rows"),
    [
        (
            6,
            4,
            True,
            ["L0.H0", "L0.H1", "L0.H2", "L0.H3", "L1.H0"],
            ["L1.H0", "L1.H1", "L1.H2", "L1.H3", "L2.H0"],
        ),
        (12, 12, False, ["L0.H0", "L1.H0", "L2.H0"], ["L1.H0", "L2.H0", "L3.H0"]),
    ],
)
def test_the_heatmap_labels_heads_by_their_component_names(
    layers, heads, every_head, first_columns, first_rows
):
    """The reference model's 6 × 4 heads are each labelled; a 12 × 12 model's cells are too
    small, so each layer's first head is, with a minor tick for every head."""
    from resstream.reporting.composition import head_ticks, heatmap_size

    cells = (layers - 1) * heads
    ticks = head_ticks(layers, heads, heatmap_size(cells))
    assert ticks.every_head is every_head
    assert (
        ticks.columns[: len(first_columns)] == first_columns and ticks.rows[: len(first_rows)] == first_rows
    )
    for position, column, row in zip(ticks.positions, ticks.columns, ticks.rows, strict=True):
        layer, head = divmod(position, heads)
        assert column == f"L{layer}.H{head}" and row == f"L{layer + 1}.H{head}"
    if every_head:
        assert len(ticks.positions) == cells and ticks.minor == []
    else:
        assert len(ticks.positions) == layers - 1 and ticks.minor == list(range(cells))
