"""Tests of the alignment metrics (resstream.analysis.shift.alignment) and their CI helpers.

The toy model at the top is small enough to check every number by hand; the invariants
compare the streamed metrics with the textbook definition (tests/test_ranks.py holds the
rank engine's own tests).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from resstream.analysis.decoding.decoder import Decoder, decoder_of
from resstream.analysis.decoding.ranks import exact_ranks, fast_ranks
from resstream.analysis.shift.alignment import AlignmentAccumulator, AlignmentResult, shift_layer_from_rates
from resstream.analysis.stats import cluster_ratio_ci, t_quantile
from tests.rank_schemes import rank_scheme  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("rank_scheme")

S2, S3, S5 = math.sqrt(2), math.sqrt(3), math.sqrt(5)

# --------------------------------------------------------------------------- hand-made toy
# vocab 5, d 3: W_E rows ±unit vectors, W_U = 2·W_E, b_U = (0, 0, 0, 0, 0.5), top-2,
# identity final norm. Scores of h = (h1, h2, h3): (2h1, 2h2, 2h3, −2h1, −2h2 + 0.5).
# Sequences A = [0, 1, 2], B = [1, 1, 3]; scored positions A0 (0→1), A1 (1→2), B0 (1→1),
# B1 (1→3). The last position holds NaN: it must never be read.
W_E_TOY = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [-1, 0, 0], [0, -1, 0]], dtype=torch.float32)
W_U_TOY = 2 * W_E_TOY
B_U_TOY = torch.tensor([0, 0, 0, 0, 0.5])
TOKENS_TOY = torch.tensor([[0, 1, 2], [1, 1, 3]])
NAN3 = [math.nan] * 3
STATES_TOY = torch.tensor(
    [
        # layer 0: h_0 = W_E[t_i]
        [[[1, 0, 0], [0, 1, 0], NAN3], [[0, 1, 0], [0, 1, 0], NAN3]],
        # layer 1
        [[[1, -1, 1], [0, 1, 2], NAN3], [[0, 1, 0], [-1, 1, 0], NAN3]],
        # layer 2
        [[[-1, 2, 0], [0, 0, 1], NAN3], [[0, 1, 0], [-1, 0, 0], NAN3]],
    ],
    dtype=torch.float32,
)


def toy_result(low_precision=None, batches=1) -> AlignmentResult:
    decoder = Decoder("logit-lens", W_U_TOY, B_U_TOY, lambda h: h)
    acc = AlignmentAccumulator(
        num_layers=2,
        top_k=2,
        decoder=decoder,
        W_E=W_E_TOY,
        W_U=W_U_TOY,
        low_precision=low_precision,
    )
    if batches == 1:
        acc.update(STATES_TOY, TOKENS_TOY)
    else:
        for b in range(2):
            acc.update(STATES_TOY[:, b : b + 1], TOKENS_TOY[b : b + 1])
    return acc.result("toy")


def test_toy_match_rates_by_hand():
    r = toy_result()
    # layer 0: A0 s=[2,0,0,-2,.5]: t0 rank 0 (in), t1 rank 2 (out miss);
    #          A1 s=[0,2,0,0,-1.5]: t1 rank 0, t2 rank 1 (the tied 0s do not count);
    #          B0: both rank 0; B1 s=[0,2,0,0,-1.5]: t3 rank 1.
    # layer 1: A0 s=[2,-2,2,-2,2.5]: t0 rank 1 (bias makes s4 = 2.5), t1 rank 3 (miss);
    #          A1 s=[0,2,4,0,-1.5]: t1 rank 1, t2 rank 0; B0 both 0; B1 s=[-2,2,0,2,-1.5]: 0, 0.
    # layer 2: A0 s=[-2,4,0,2,-3.5]: t0 rank 3 (miss), t1 rank 0; A1 s=[0,0,2,0,.5]: t1 rank 2
    #          (miss), t2 0; B0 both 0; B1 s=[-2,0,0,2,.5]: t1 rank 2 (miss), t3 rank 0.
    assert r.layers == (0, 1, 2)
    assert r.in_match == (1.0, 1.0, 0.25)
    assert r.out_match == (0.75, 0.75, 1.0)
    assert r.num_tokens == 4 and r.num_sequences == 2 and r.top_k == 2
    assert r.decoder == "logit-lens" and r.num_layers == 2
    # out − in = (−0.25, −0.25, 0.75): crosses zero between layers 1 and 2 at 1 + 0.25/1.0
    assert r.shift_layer == 1.25


def test_toy_shift_depths_by_hand():
    r = toy_result()
    # score(t_{i+1}) > score(t_i): A0 first at layer 2 (layer 1: −2 vs 2); A1 at layer 1
    # (4 > 2); B0 never (same token); B1 at layer 2 (layer 1 is a tie 2 = 2, not a shift).
    assert r.shift_depths == (0, 1, 2)
    assert r.never_shifted == 1
    assert sum(r.shift_depths) + r.never_shifted == r.num_tokens


def test_toy_cosines_by_hand():
    r = toy_result()

    def approx(v):
        return pytest.approx(v, rel=1e-12, abs=1e-15)

    assert r.cos_in[0] == 1.0  # h_0 = W_E[t_i] exactly
    assert r.cos_out == (
        approx(0.25),
        approx((-1 / S3 + 2 / S5 + 1 + 1 / S2) / 4),
        approx((2 / S5 + 3) / 4),
    )
    assert r.cos_in[1:] == (
        approx((1 / S3 + 1 / S5 + 1 + 1 / S2) / 4),
        approx((1 - 1 / S5) / 4),
    )


def test_toy_projection_by_hand():
    r = toy_result()
    # B0 (t_i = t_{i+1}) is skipped: three positions count. ĥ = h/‖h‖ since ‖W_E[t]‖ = 1.
    # layer 1: A0 (1 − √3)/5, A1 (1 + 3/√5)/5, B1 (1 + 1/√2)/5; layer 2: (1 + √5)/5, 3/5, 3/5.
    assert r.num_projection_tokens == 3
    assert r.projection[0] == 0.0
    assert r.projection[1] == pytest.approx(((1 - S3) + (1 + 3 / S5) + (1 + 1 / S2)) / 15, rel=1e-12)
    assert r.projection[2] == pytest.approx((7 + S5) / 15, rel=1e-12)


def test_toy_confidence_intervals():
    r = toy_result()
    # per-sequence rates, in: layer 0 (1, 1), layer 1 (1, 1), layer 2 (0, 1/2);
    # out: (1/2, 1), (1/2, 1), (1, 1). Equal rates give zero width; otherwise
    # mean ± t(0.975, 1)·sd/√2 = 12.7·0.25, clipped to [0, 1].
    assert r.in_match_ci == ((1.0, 1.0), (1.0, 1.0), (0.0, 1.0))
    assert r.out_match_ci == ((0.0, 1.0), (0.0, 1.0), (1.0, 1.0))
    single = toy_result(batches=2)
    assert single.in_match == r.in_match and single.projection == r.projection


def test_toy_single_sequence_ci_is_nan_and_json_has_null():
    decoder = Decoder("logit-lens", W_U_TOY, B_U_TOY, lambda h: h)
    acc = AlignmentAccumulator(num_layers=2, top_k=2, decoder=decoder, W_E=W_E_TOY, W_U=W_U_TOY)
    acc.update(STATES_TOY[:, :1], TOKENS_TOY[:1])
    r = acc.result("one")
    assert all(math.isnan(lo) and math.isnan(hi) for lo, hi in r.in_match_ci)
    d = r.to_dict()
    assert d["in_match_ci"][0] == [None, None]
    assert d["model"] == "one" and d["layers"] == [0, 1, 2] and d["in_match"] == [1.0, 1.0, 0.0]
    import json

    json.dumps(d, allow_nan=False)


@pytest.mark.parametrize("low_precision", [None, torch.bfloat16, "auto"])
def test_toy_same_for_every_screen_precision(low_precision):
    assert toy_result(low_precision) == toy_result(None)


# --------------------------------------------------------------------------- statistics


def test_cluster_ci_by_hand():
    # rates .3 .5 .8 .6 over 10 positions each: mean .55, sd = sqrt(.13/3), SE = sd/2,
    # t(0.975, 3) = 3.182446305284263
    lo, hi = cluster_ratio_ci([3, 5, 8, 6], [10, 10, 10, 10])
    half = 3.182446305284263 * math.sqrt(0.13 / 3) / 2
    assert lo == pytest.approx(0.55 - half, rel=1e-9) and hi == pytest.approx(0.55 + half, rel=1e-9)
    # unequal sizes: R = 6/10, residuals y − R·n = (1 − .6·2, 2 − .6·3, 3 − .6·5) = (−.2, .2, 0)
    lo, hi = cluster_ratio_ci([1, 2, 3], [2, 3, 5])
    se = math.sqrt(3 / 2 * 0.08) / 10
    assert (lo, hi) == pytest.approx((0.6 - 4.302652729911275 * se, 0.6 + 4.302652729911275 * se), rel=1e-9)
    assert cluster_ratio_ci([2, 4], [4, 8]) == (0.5, 0.5)  # equal rates: zero width
    assert all(math.isnan(v) for v in cluster_ratio_ci([2], [4]))  # one sequence


@pytest.mark.parametrize(
    ("df", "value"),
    [
        (1, 12.706204736174698),
        (2, 4.302652729911275),
        (3, 3.182446305284263),
        (10, 2.2281388519649385),
        (30, 2.0422724563012373),
        (1000, 1.9623390808264078),
    ],
)
def test_t_quantile_known_values(df, value):
    assert t_quantile(0.975, df) == pytest.approx(value, rel=1e-7)


def test_t_quantile_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 17, 150, 200, 201, 5000):
        for p in (0.9, 0.975, 0.995):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-7)


def test_shift_layer_interpolation():
    assert shift_layer_from_rates([0.2, 0.5], [0.3, 0.1]) == 0.0
    # differences (−0.8, −0.2, 0.6): zero crossing at 1 + 0.2 / 0.8
    assert shift_layer_from_rates([0.9, 0.6, 0.2], [0.1, 0.4, 0.8]) == pytest.approx(1.25)
    assert shift_layer_from_rates([1, 1], [0, 1]) is None  # never positive (0 is not)


# --------------------------------------------------------------------------- invariants


def random_setup(seed=0, vocab=40, d=16, layers=3, batch=6, length=9, tied=False):
    g = torch.Generator().manual_seed(seed)
    W_E = torch.randn(vocab, d, generator=g)
    W_U = W_E if tied else torch.randn(vocab, d, generator=g)
    tokens = torch.randint(0, vocab, (batch, length), generator=g)
    tokens[0, 3] = tokens[0, 2]  # a repeated token: projection skip
    states = torch.randn(layers + 1, batch, length, d, generator=g)
    states[0] = W_E[tokens]
    for layer in range(1, layers + 1):
        states[layer] = states[layer - 1] + 0.7 * states[layer]
    return W_E, W_U, tokens, states


def run(decoder, W_E, W_U, tokens, states, top_k=3, splits=(None,), low_precision=None):
    acc = AlignmentAccumulator(
        num_layers=states.shape[0] - 1,
        top_k=top_k,
        decoder=decoder,
        W_E=W_E,
        W_U=W_U,
        low_precision=low_precision,
    )
    bounds = [0, *[s for s in splits if s is not None], tokens.shape[0]]
    for lo, hi in itertools.pairwise(bounds):
        acc.update(states[:, lo:hi], tokens[lo:hi])
    return acc.result("random")


def naive_rates(decoder, tokens, states, top_k):
    """Per-layer match rates from full fp64 score matrices (the textbook definition)."""
    inp, out = tokens[:, :-1].reshape(-1), tokens[:, 1:].reshape(-1)
    ins, outs = [], []
    for h in states[:, :, :-1]:
        x = decoder.inputs(h).reshape(len(inp), -1).double()
        scores = x @ decoder.matrix.double().T
        if decoder.bias is not None:
            scores += decoder.bias.double()
        for ids, rates in ((inp, ins), (out, outs)):
            rank = (scores > scores.gather(1, ids[:, None])).sum(1)
            rates.append((rank < top_k).double().mean().item())
    return tuple(ins), tuple(outs)


def test_input_embedding_state_gives_cos_one_and_projection_zero():
    W_E, W_U, tokens, states = random_setup()
    r = run(Decoder("embedding", W_E), W_E, W_U, tokens, states)
    assert r.cos_in[0] == 1.0
    assert r.projection[0] == 0.0
    assert r.num_projection_tokens == r.num_tokens - 1


def test_results_do_not_depend_on_batch_size():
    W_E, W_U, tokens, states = random_setup()
    norm = torch.nn.LayerNorm(16)
    decoder = Decoder("logit-lens", W_U, torch.randn(40), norm)
    one = run(decoder, W_E, W_U, tokens, states)
    three = run(decoder, W_E, W_U, tokens, states, splits=(2, 4))
    assert one == three
    assert run(decoder, W_E, W_U, tokens, states, low_precision=torch.bfloat16) == one


@pytest.mark.parametrize("kind", ["embedding", "logit-lens"])
def test_decoders_match_naive_definition(kind):
    W_E, W_U, tokens, states = random_setup(seed=1)
    norm = torch.nn.LayerNorm(16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    decoder = (
        Decoder("embedding", W_E)
        if kind == "embedding"
        else Decoder("logit-lens", W_U, torch.randn(40), norm)
    )
    r = run(decoder, W_E, W_U, tokens, states, top_k=3)
    with torch.no_grad():
        assert (r.in_match, r.out_match) == naive_rates(decoder, tokens, states, 3)
    assert r.decoder == kind


def test_embedding_and_logit_lens_differ_and_use_their_matrix():
    W_E, W_U, tokens, states = random_setup(seed=2)
    emb = run(Decoder("embedding", W_E), W_E, W_U, tokens, states)
    lens = run(
        Decoder("logit-lens", W_U, None, torch.nn.LayerNorm(16)),
        W_E,
        W_U,
        tokens,
        states,
    )
    assert emb.in_match != lens.in_match
    assert emb.cos_in == lens.cos_in  # geometry does not depend on the decoder


def test_top_k_equal_to_vocab_gives_rate_one():
    W_E, W_U, tokens, states = random_setup()
    r = run(Decoder("embedding", W_E), W_E, W_U, tokens, states, top_k=40)
    assert set(r.in_match) == {1.0} and set(r.out_match) == {1.0}
    assert r.in_match_ci[0] == (1.0, 1.0)


def test_decoder_from_view():
    class View:
        final_norm = torch.nn.Identity()
        W_U = torch.randn(7, 4)
        b_U = None
        W_E = torch.randn(7, 4)
        logit_softcap = None
        tied = False

    lens = decoder_of(View, "logit-lens")
    assert torch.equal(lens.matrix, View.W_U) and not lens.matrix.requires_grad
    assert lens.norm is View.final_norm and lens.kind == "logit-lens"
    emb = decoder_of(View, "embedding")
    assert torch.equal(emb.matrix, View.W_E) and emb.norm is None and emb.bias is None
    View.W_U = torch.nn.Parameter(torch.randn(7, 4))  # model weights: detached for analysis
    assert not decoder_of(View, "logit-lens").matrix.requires_grad


# --------------------------------------------------------------------------- bad input


def test_bad_top_k():
    W = torch.randn(10, 4)
    dec = Decoder("embedding", W)
    for k in (0, -1, 11, 2.5):
        with pytest.raises(ValueError, match="top_k"):
            AlignmentAccumulator(num_layers=1, top_k=k, decoder=dec, W_E=W, W_U=W)
    with pytest.raises(ValueError, match="limit"):
        fast_ranks(torch.randn(3, 4), W, None, torch.zeros(3, dtype=torch.long), limit=0)


def test_mismatched_shapes():
    W = torch.randn(10, 4)
    dec = Decoder("embedding", W)
    acc = AlignmentAccumulator(num_layers=2, top_k=2, decoder=dec, W_E=W, W_U=W)
    tokens = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"expected \(3, 2, 5, 4\)"):
        acc.update(torch.randn(2, 2, 5, 4), tokens)  # one layer short
    with pytest.raises(ValueError, match="d_model 4"):
        acc.update(torch.randn(3, 2, 5, 6), tokens)
    with pytest.raises(ValueError, match=r"\(L\+1, batch, positions, d_model\)"):
        acc.update(torch.randn(3, 5, 4), tokens)
    with pytest.raises(ValueError, match="at least 2"):
        acc.update(torch.randn(3, 2, 1, 4), tokens[:, :1])
    with pytest.raises(ValueError, match="allowed: 0 to 9"):
        acc.update(torch.randn(3, 2, 5, 4), tokens + 10)
    with pytest.raises(ValueError, match="integer"):
        acc.update(torch.randn(3, 2, 5, 4), tokens.float())
    with pytest.raises(ValueError, match="no batches"):
        acc.result("m")
    with pytest.raises(ValueError, match="W_U has shape"):
        AlignmentAccumulator(num_layers=1, top_k=2, decoder=dec, W_E=W, W_U=torch.randn(10, 5))
    with pytest.raises(ValueError, match="decoder kind"):
        Decoder("tuned-lens", W)
    with pytest.raises(ValueError, match="bias has shape"):
        Decoder("logit-lens", W, torch.randn(9))
    with pytest.raises(ValueError, match=r"expected \(n, 4\)"):
        exact_ranks(torch.randn(3, 5), W, None, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token_ids has shape"):
        fast_ranks(torch.randn(3, 4), W, None, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="low_precision"):
        fast_ranks(
            torch.randn(3, 4),
            W,
            None,
            torch.zeros(3, dtype=torch.long),
            low_precision=torch.float16,
        )


def test_non_finite_states_are_rejected():
    W = torch.randn(10, 4)
    acc = AlignmentAccumulator(num_layers=1, top_k=2, decoder=Decoder("embedding", W), W_E=W, W_U=W)
    states = torch.randn(2, 1, 3, 4)
    states[1, 0, 0, 0] = math.inf
    with pytest.raises(ValueError, match="layer 1"):
        acc.update(states, torch.zeros(1, 3, dtype=torch.long))
