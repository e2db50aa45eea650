"""The exact rank engine (resstream.analysis.decoding.ranks): the fast screened scheme against the fp64
reference at GPT-2 scale and on near ties, its error bound entry by entry, and exact top-k
lists against a brute-force sort."""

from __future__ import annotations

import math
import time

import pytest
import torch

from resstream.analysis.decoding.ranks import (
    DEFAULT_CHUNK_BYTES,
    RankScreen,
    exact_ranks,
    fast_ranks,
    resolve_chunk_bytes,
    resolve_sync_free,  # the function itself: `rank_scheme` patches the module's name
)
from tests.rank_schemes import rank_scheme  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("rank_scheme")


def gpt2_like(n=256, vocab=50257, d=768, seed=0):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(vocab, d, generator=g) * 0.02
    x = torch.nn.functional.layer_norm(torch.randn(n, d, generator=g) * 2 + torch.randn(d, generator=g), (d,))
    ids = torch.randint(0, vocab, (n,), generator=g)
    ids[: n // 4] = (x[: n // 4] @ W.T).argmax(1)  # some targets at the top: members
    return x, W, ids


@pytest.fixture(scope="module")
def gpt2_case():
    x, W, ids = gpt2_like()
    t = time.perf_counter()
    ref = exact_ranks(x, W, None, ids)
    print(f"\nexact_ranks 256 x 50257 x 768 (fp64): {time.perf_counter() - t:.2f}s")
    return x, W, ids, ref


@pytest.mark.parametrize("low_precision", [None, torch.bfloat16])
@pytest.mark.parametrize("limit", [5, None])
def test_fast_ranks_equal_exact_at_gpt2_scale(gpt2_case, low_precision, limit):
    x, W, ids, ref = gpt2_case
    if low_precision is torch.bfloat16 and limit is None:
        x, ids, ref = (
            x[40:88],
            ids[40:88],
            ref[40:88],
        )  # wide bf16 bands (heavy rows): keep short
    screen = RankScreen(W, None, low_precision=low_precision)
    t = time.perf_counter()
    got = screen.ranks(x, ids[:, None], limit)[0][:, 0]
    elapsed = time.perf_counter() - t
    want = ref if limit is None else ref.clamp_max(limit)
    assert torch.equal(got, want)
    st = screen.stats
    print(
        f"\nfast_ranks screen={low_precision} limit={limit}: {elapsed:.2f}s for {len(ids)} rows; "
        f"band entries {st.band_entries} ({st.band_entries / max(1, st.rows):.0f}/row), "
        f"re-scored rows {st.rescored_rows}, entries {st.rescored_entries}, heavy rows {st.heavy_rows}"
    )


def near_tie_case(seed=3):
    """A vocabulary whose top is a cluster of rows that score within ~1 fp32 ulp of each other:
    copies of one row with single components moved by ±1 ulp, exact duplicates, and the
    whole row scaled by (1 ± 2^-23)."""
    g = torch.Generator().manual_seed(seed)
    d, base_vocab = 64, 3000
    hot = torch.randn(d, generator=g)
    rows = [torch.randn(base_vocab, d, generator=g) * 0.1]
    variants = [hot.clone(), hot.clone(), hot * (1 + 2.0**-23), hot * (1 - 2.0**-23)]
    for k in range(24):
        for direction in (math.inf, -math.inf):
            v = hot.clone()
            v[k] = torch.nextafter(v[k], torch.tensor(direction))
            variants.append(v)
    rows.append(torch.stack(variants))
    W = torch.cat(rows)
    n = 96
    x = hot / hot.norm() + 0.02 * torch.randn(n, d, generator=g)
    x[:8] = hot / hot.norm()  # several identical positions
    ids = torch.randint(base_vocab, W.shape[0], (n,), generator=g)
    return x, W, ids


@pytest.mark.parametrize("low_precision", [None, torch.bfloat16])
def test_fast_ranks_equal_exact_on_near_ties(low_precision):
    x, W, ids = near_tie_case()
    ref = exact_ranks(x, W, None, ids)
    scores = (x.double() @ W.double().T)[:, 3000:]
    gaps = (scores[:, :, None] - scores[:, None, :]).abs()
    assert (gaps[gaps > 0] < 1e-5 * scores.abs().amax()).any()  # there are ~ulp-level gaps
    assert len(set(ref.tolist())) > 10  # the ties really spread the ranks
    assert torch.equal(fast_ranks(x, W, None, ids, low_precision=low_precision), ref)
    for k in (1, 2, 5, 17, 40):
        got = fast_ranks(x, W, None, ids, limit=k, low_precision=low_precision)
        assert torch.equal(got, ref.clamp_max(k))


@pytest.mark.parametrize("low_precision", [None, torch.bfloat16])
def test_fast_ranks_with_bias_and_bf16_weights(low_precision):
    g = torch.Generator().manual_seed(4)
    W = torch.randn(700, 32, generator=g)
    b = torch.randn(700, generator=g) * 3
    x = torch.randn(50, 32, generator=g)
    ids = torch.randint(0, 700, (50,), generator=g)
    for mat, xx in ((W, x), (W.bfloat16(), x.bfloat16())):
        ref = exact_ranks(xx, mat, b, ids)
        assert torch.equal(fast_ranks(xx, mat, b, ids, low_precision=low_precision), ref)
        assert torch.equal(
            fast_ranks(xx, mat, b, ids, limit=3, low_precision=low_precision),
            ref.clamp_max(3),
        )
    # a limit above the top-k path and the whole vocabulary
    ref = exact_ranks(x, W, b, ids)
    assert torch.equal(
        fast_ranks(x, W, b, ids, limit=300, low_precision=low_precision),
        ref.clamp_max(300),
    )
    assert torch.equal(fast_ranks(x, W, b, ids, limit=700, low_precision=low_precision), ref)


@pytest.mark.parametrize("low_precision", [None, torch.bfloat16])
def test_screen_error_bound_holds_entrywise(low_precision):
    """|z − s| ≤ c·|z| + E for every entry: the bound the thresholds rely on."""
    g = torch.Generator().manual_seed(5)
    W = torch.randn(4000, 256, generator=g) * torch.rand(4000, 1, generator=g)
    b = torch.randn(4000, generator=g)
    x = torch.randn(64, 256, generator=g) * 5
    screen = RankScreen(W, b, low_precision=low_precision)
    xs = screen._screen_inputs(x)
    z = screen._screen_scores(xs).double()
    s = x.double() @ W.double().T + b.double()
    u = 2.0**-8 if low_precision is torch.bfloat16 else 2.0**-24
    bound = u / (1 - u) * z.abs() + screen._bound(x.double(), xs)[:, None]
    assert ((z - s).abs() <= bound).all()
    print(f"\nscreen {low_precision}: max |z − s| / bound = {((z - s).abs() / bound).max():.3f}")


def test_matmul_precision_setting_is_overridden_and_restored():
    x, W, ids = near_tie_case()
    ref = exact_ranks(x, W, None, ids)
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        assert torch.equal(fast_ranks(x, W, None, ids, low_precision=None), ref)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(saved)


def brute_top_k(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, k: int) -> torch.Tensor:
    """Top-k ids by exact fp64 score, ties by the lower id, from every score (the definition)."""
    scores = (x.double()[:, None, :] * W.double()[None]).sum(-1)
    if b is not None:
        scores = scores + b.double()
    return torch.tensor(
        [sorted(range(W.shape[0]), key=lambda j, row=row: (-row[j].item(), j))[:k] for row in scores]
    )


@pytest.mark.parametrize("low_precision", [None, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_top_k_lists_are_exact_with_ties(low_precision, with_bias):
    g = torch.Generator().manual_seed(6)
    for trial in range(12):
        vocab, d = 20 + 23 * trial, 3 + 3 * trial
        W = torch.randn(vocab, d, generator=g)
        W[1] = W[0]  # an exact tie
        W[3] = W[2] * (1 + 2.0**-23)  # a near tie, one fp32 ulp apart
        W[7:10] = W[5]  # a tie of four
        b = torch.randn(vocab, generator=g) if with_bias else None
        if b is not None:
            b[1], b[7:10] = b[0], b[5]
        x = torch.randn(11, d, generator=g)
        x[4] = 0.0  # every score equal (to the bias): the whole vocabulary ties
        k = 1 + trial % 7
        screen = RankScreen(W, b, low_precision=low_precision)
        ids, scores = screen.top_k(x, k)
        assert torch.equal(ids, brute_top_k(x, W, b, k)), trial
        assert (scores[:, :-1] >= scores[:, 1:]).all()
        ranks, _ = screen.ranks(x, ids)
        assert (ranks <= torch.arange(k)).all()  # a listed token has at most its position's rank


def test_top_k_at_gpt2_scale_re_scores_few_entries(gpt2_case):
    x, W, _, _ = gpt2_case
    screen = RankScreen(W, None, low_precision=None)
    top, _ = screen.top_k(x[:64], 5)
    assert torch.equal(top, (x[:64].double() @ W.double().T).topk(5).indices)
    assert screen.stats.rescored_entries < 64 * 20 and screen.stats.heavy_rows == 0


def test_top_k_refuses_bad_input():
    screen = RankScreen(torch.randn(10, 4), None)
    with pytest.raises(ValueError, match="k = 0"):
        screen.top_k(torch.randn(2, 4), 0)
    with pytest.raises(ValueError, match="non-finite"):
        screen.top_k(torch.full((2, 4), math.nan), 1)


def test_top_k_over_several_blocks_and_no_rows():
    g = torch.Generator().manual_seed(7)
    W, x = torch.randn(300, 16, generator=g), torch.randn(40, 16, generator=g)
    small = RankScreen(W, None, low_precision=None, chunk_bytes=300 * 4 * 3)  # 3 rows per block
    assert small.chunk_rows() == 3
    ids, _ = small.top_k(x, 4)
    assert torch.equal(ids, RankScreen(W, None, low_precision=None).top_k(x, 4)[0])
    assert torch.equal(ids, brute_top_k(x, W, None, 4))
    empty_ids, empty_scores = small.top_k(torch.zeros(0, 16), 4)
    assert empty_ids.shape == (0, 4) and empty_scores.dtype == torch.float64


# --------------------------------------------------------------------------- sync-free scheme


@pytest.fixture
def tiny_buffers(monkeypatch):
    """Band buffers of one entry and one gathered row per block: nearly every ambiguous query
    of the sync-free scheme overflows, so its unsure rows and their settling are exercised."""
    from resstream.analysis.decoding import ranks_sync_free

    monkeypatch.setattr(ranks_sync_free, "BAND_CAP", 1)
    monkeypatch.setattr(ranks_sync_free, "ROWS_FRACTION", 10**9)


@pytest.mark.parametrize("low_precision", [None, torch.bfloat16])
def test_sync_free_overflow_is_settled_exactly(tiny_buffers, low_precision):
    for x, W, ids in (near_tie_case(), gpt2_like(n=48, vocab=4000, d=64)):
        ref = exact_ranks(x, W, None, ids)
        for limit in (1, 5, 40, None):
            screen = RankScreen(W, None, low_precision=low_precision, sync_free=True)
            got = screen.ranks(x, ids[:, None], limit)[0][:, 0]
            assert torch.equal(got, ref if limit is None else ref.clamp_max(limit))
            if limit is None:
                assert screen.stats.unsure_rows > 0  # the overflow path really ran


def test_deferred_block_settles_at_its_end(tiny_buffers):
    x, W, ids = near_tie_case()
    ref = exact_ranks(x, W, None, ids)
    screen = RankScreen(W, None, low_precision=torch.bfloat16, sync_free=True)
    with screen.deferred():
        assert screen.deferring
        first = screen.ranks(x, ids[:, None])[0]
        second = screen.ranks(x[:10], ids[:10, None], 3)[0]
        assert screen.stats.unsure_rows == 0  # nothing settled inside the block
    assert not screen.deferring
    assert screen.stats.unsure_rows > 0
    assert torch.equal(first[:, 0], ref) and torch.equal(second[:, 0], ref[:10].clamp_max(3))


@pytest.mark.parametrize("sync_free", [False, True])
def test_deferred_block_names_the_first_non_finite_call(sync_free):
    from resstream.analysis.decoding.ranks import NonFiniteCall

    x, W, ids = gpt2_like(n=8, vocab=500, d=16)
    bad = x.clone()
    bad[3, 2] = math.nan
    screen = RankScreen(W, None, low_precision=None, sync_free=sync_free)

    def three_calls():
        with screen.deferred():
            screen.ranks(x, ids[:, None], 5)
            screen.ranks(bad, ids[:, None], 5)
            screen.ranks(bad * math.inf, ids[:, None])

    with pytest.raises(NonFiniteCall) as found:
        three_calls()
    assert found.value.call == 1
    assert not screen.deferring  # a failed block leaves the screen usable
    with pytest.raises(RuntimeError, match="do not nest"), screen.deferred(), screen.deferred():
        pass


def test_scheme_settings_are_checked():
    cpu = torch.device("cpu")
    assert resolve_sync_free("auto", cpu) is False and resolve_sync_free(True, cpu) is True
    assert resolve_sync_free("auto", torch.device("cuda", 0)) is True  # no device needed to decide
    assert resolve_chunk_bytes(None, cpu) == DEFAULT_CHUNK_BYTES and resolve_chunk_bytes(4096, cpu) == 4096
    for bad in ("yes", 1):
        with pytest.raises(ValueError, match="sync_free"):
            resolve_sync_free(bad, cpu)
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="chunk_bytes"):
            resolve_chunk_bytes(bad, cpu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("low_precision", ["auto", None])
def test_ranks_on_cuda_equal_the_cpu_reference(sync_free, low_precision):
    """Both schemes on the device, bf16 ("auto") and fp32 screens, near ties and GPT-2 scale,
    against fp64 brute force on the CPU; ranks inside one deferred block as `shift` makes them."""
    cuda = torch.device("cuda")
    for x, W, ids in (near_tie_case(), gpt2_like(n=128)):
        ref = exact_ranks(x, W, None, ids)
        screen = RankScreen(W.to(cuda), None, low_precision=low_precision, sync_free=sync_free)
        with screen.deferred():
            full = screen.ranks(x.to(cuda), ids[:, None].to(cuda))[0]
            top5 = screen.ranks(x.to(cuda), ids[:, None].to(cuda), 5)[0]
        assert torch.equal(full[:, 0].cpu(), ref)
        assert torch.equal(top5[:, 0].cpu(), ref.clamp_max(5))


@pytest.mark.parametrize("low_precision", [None, torch.bfloat16])
def test_a_target_never_counts_against_itself(monkeypatch, low_precision):
    """A target re-scored inside a band may come out one ulp above its own exact score (another
    block shape, another reduction order on a GPU): it must not count as scoring above itself."""
    x, W, ids = gpt2_like(n=64, vocab=3000, d=32)
    ref = exact_ranks(x, W, None, ids)
    original = RankScreen._pair_scores

    def one_ulp_higher(self, x64, rows, cols, **how):
        out = original(self, x64, rows, cols, **how)
        return torch.nextafter(out, torch.full_like(out, math.inf))

    def exact(self, x64, targets):
        n, m = targets.shape
        rows = torch.arange(n).repeat_interleave(m)
        return original(self, x64, rows, targets.reshape(-1)).reshape(n, m)

    monkeypatch.setattr(RankScreen, "_pair_scores", one_ulp_higher)
    monkeypatch.setattr(RankScreen, "exact_scores", exact)
    for limit in (5, None):
        got = RankScreen(W, None, low_precision=low_precision).ranks(x, ids[:, None], limit)[0][:, 0]
        assert torch.equal(got, ref if limit is None else ref.clamp_max(limit))


@pytest.mark.parametrize("with_bias", [False, True])
def test_decode_equals_the_separate_queries_with_ties(with_bias):
    """`RankScreen.decode` (one screen for lists, ranks and the normaliser) gives the exact
    top-k lists and ranks of the reference, and the softmax probabilities of an fp64 softmax."""
    g = torch.Generator().manual_seed(7)
    for trial in range(10):
        vocab, d = 30 + 29 * trial, 4 + 3 * trial
        W = torch.randn(vocab, d, generator=g)
        W[1] = W[0]
        W[3] = W[2] * (1 + 2.0**-23)
        W[7:10] = W[5]
        b = torch.randn(vocab, generator=g) if with_bias else None
        x = torch.randn(13, d, generator=g)
        x[4] = 0.0  # the whole vocabulary ties
        x[5] = W[2] / W[2].norm()  # near-tied targets at the top
        ids = torch.randint(0, vocab, (13, 2), generator=g)
        ids[5] = torch.tensor([2, 3])
        k = 1 + trial % 5
        decoded = RankScreen(W, b, low_precision=None, chunk_bytes=4 * vocab * (1 + trial % 3)).decode(
            x, ids, k
        )
        assert torch.equal(decoded.top_ids, brute_top_k(x, W, b, k)), trial
        for c in range(2):
            assert torch.equal(decoded.ranks[:, c], exact_ranks(x, W, b, ids[:, c])), trial
        scores = x.double() @ W.double().T + (0 if b is None else b.double())
        softmax = torch.softmax(scores, -1)
        expected = torch.cat([softmax.gather(1, decoded.top_ids), softmax.gather(1, ids)], 1)
        assert torch.allclose(decoded.probabilities().double(), expected, rtol=1e-5, atol=1e-12)


def test_decode_applies_soft_capping_to_probabilities_only():
    g = torch.Generator().manual_seed(8)
    W, x = torch.randn(200, 16, generator=g) * 3, torch.randn(9, 16, generator=g)
    ids = torch.randint(0, 200, (9, 2), generator=g)
    plain = RankScreen(W, None, low_precision=None).decode(x, ids, 3)
    capped = RankScreen(W, None, low_precision=None).decode(x, ids, 3, softcap=5.0)
    assert torch.equal(plain.top_ids, capped.top_ids) and torch.equal(plain.ranks, capped.ranks)
    scores = 5.0 * torch.tanh((x.double() @ W.double().T) / 5.0)
    expected = torch.softmax(scores, -1).gather(1, ids)
    assert torch.allclose(capped.probabilities()[:, 3:].double(), expected, rtol=1e-5)


def test_decode_at_gpt2_scale(gpt2_case):
    x, W, ids, ref = gpt2_case
    decoded = RankScreen(W, None, low_precision=None).decode(x[:64], ids[:64, None], 5)
    assert torch.equal(decoded.ranks[:, 0], ref[:64])
    assert torch.equal(decoded.top_ids, (x[:64].double() @ W.double().T).topk(5).indices)


def test_decode_refuses_a_bf16_screen_and_bad_ids():
    W = torch.randn(10, 4)
    with pytest.raises(ValueError, match="fp32 screen"):
        RankScreen(W, None, low_precision=torch.bfloat16).decode(
            torch.randn(2, 4), torch.zeros(2, 1).long(), 1
        )
    with pytest.raises(ValueError, match="must be"):
        RankScreen(W, None, low_precision=None).decode(torch.randn(2, 4), torch.zeros(2).long(), 1)
