"""Decoding trajectories on cases small enough to check by hand."""

from __future__ import annotations

import math

import pytest
import torch

from resstream.analysis.decoding.decoder import Decoder
from resstream.analysis.shift.lens import LayerRange, LensResult, merge_ranges, trajectories
from tests.rank_schemes import rank_scheme  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("rank_scheme")


def test_merge_ranges():
    assert merge_ranges([3, 3, 3, 5, 5, 3]) == (LayerRange(0, 2, 3), LayerRange(3, 4, 5), LayerRange(5, 5, 3))
    assert merge_ranges([7]) == (LayerRange(0, 0, 7),)
    assert LayerRange(0, 6, 1).label == "0–6" and LayerRange(4, 4, 1).label == "4"


def identity(vocab: int = 4):
    """d = vocab and W_E = I: the state itself is the score vector."""
    return Decoder("embedding", torch.eye(vocab)).exact()


def test_trajectories_by_hand():
    # vocab = d = 4; text = [0, 2, 3]; 2 layers (3 depths)
    e = torch.eye(4)
    states = torch.stack(
        [
            torch.stack([e[0], e[2], e[3]]),  # h_0: the input tokens
            torch.stack([e[0] + 2 * e[2], e[2], e[1]]),  # h_1
            torch.stack([e[2] + 0.5 * e[0], e[3], e[1]]),  # h_2
        ]
    )
    tokens = torch.tensor([0, 2, 3])
    result = trajectories(states, tokens, identity(), top_k=2)
    first, second, last = result.trajectories
    assert result.num_layers == 2
    assert first.top1 == (0, 2, 2) and first.input_id == 0 and first.next_id == 2
    assert first.top_ids[1] == (2, 0)
    assert first.top_ids[0] == (0, 1)  # scores (1, 0, 0, 0): the three tied at 0 give way to the lowest id
    # exact ranks = entries scoring strictly higher: h_0 (1, 0, 0, 0), h_1 (1, 0, 2, 0), h_2 (0.5, 0, 1, 0)
    assert first.input_ranks == (0, 1, 1) and first.next_ranks == (1, 0, 0)
    assert second.input_ranks == (0, 0, 1) and second.next_ranks == (1, 1, 0)
    assert last.next_ranks is None and last.input_ranks == (0, 1, 1)
    assert [r.label for r in first.ranges()] == ["0", "1–2"]
    assert first.first_layer_of(first.next_id) == 1
    assert second.top1 == (2, 2, 3) and second.first_layer_of(second.next_id) == 2
    assert last.next_id is None and last.first_layer_of(None) is None
    data = result.to_dict()  # no token_text given: ids in brackets
    assert data["positions"][0]["ranges"][1] == {
        "layers": "1–2",
        "token_id": 2,
        "token": "<2>",
        "is_input": False,
        "is_next": True,
    }


def test_position_range_and_bad_input():
    states = torch.randn(3, 5, 4)
    tokens = torch.tensor([0, 1, 2, 3, 0])
    result = trajectories(states, tokens, identity(), positions=range(2, 4))
    assert [t.position for t in result.trajectories] == [2, 3]
    with pytest.raises(ValueError, match="outside the text"):
        trajectories(states, tokens, identity(), positions=range(3, 9))
    with pytest.raises(ValueError, match="top_k 9"):
        trajectories(states, tokens, identity(), top_k=9)
    with pytest.raises(ValueError, match="must be"):
        trajectories(states[:, :4], tokens, identity())


def softmax(scores: list[float]) -> list[float]:
    """By hand: exp(s) / sum(exp(s))."""
    total = sum(math.exp(s) for s in scores)
    return [math.exp(s) / total for s in scores]


def test_probabilities_are_the_softmax_of_the_decoder_scores():
    # identity decoder: the scores are the states. Position 0, layer 1: h = (1, 0, 2, 0),
    # top-2 = (2, 0) with softmax e²/Z and e/Z, Z = e + e² + 2; t_i = 0, t_{i+1} = 2.
    e = torch.eye(4)
    states = torch.stack(
        [
            torch.stack([e[0], e[2], e[3]]),
            torch.stack([e[0] + 2 * e[2], e[2], e[1]]),
            torch.stack([e[2] + 0.5 * e[0], e[3], e[1]]),
        ]
    )
    result = trajectories(states, torch.tensor([0, 2, 3]), identity(), top_k=2)
    first, _, last = result.trajectories
    p = softmax([1.0, 0.0, 2.0, 0.0])
    assert first.top_probs[1] == pytest.approx((p[2], p[0]), rel=1e-6)
    assert first.input_probs[1] == pytest.approx(p[0], rel=1e-6)
    assert first.next_probs[1] == pytest.approx(p[2], rel=1e-6)
    q = softmax([1.0, 0.0, 0.0, 0.0])  # layer 0: (1, 0, 0, 0), top-2 = (0, 1)
    assert first.top_probs[0] == pytest.approx((q[0], q[1]), rel=1e-6)
    assert last.next_probs is None and len(last.input_probs) == 3
    data = result.to_dict()["positions"][0]
    assert data["top_probs"][1] == pytest.approx([p[2], p[0]], rel=1e-6)
    assert data["input_probs"][1] == pytest.approx(p[0], rel=1e-6)
    assert data["next_probs"][1] == pytest.approx(p[2], rel=1e-6)
    assert result.to_dict()["positions"][2]["next_probs"] is None


def test_probabilities_follow_norm_bias_and_soft_capping():
    # scores = 2·tanh((W·(2h) + b) / 2); h = (0.5, 0.25): 2h = (1, 0.5), W·2h = (1, 0.5, 1.5),
    # + b = (1, 1, 0.5), capped: (2·tanh(0.5), 2·tanh(0.5), 2·tanh(0.25))
    decoder = Decoder(
        "logit-lens",
        torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
        bias=torch.tensor([0.0, 0.5, -1.0]),
        norm=lambda h: 2 * h,
        softcap=2.0,
    )
    p = softmax([2 * math.tanh(0.5), 2 * math.tanh(0.5), 2 * math.tanh(0.25)])
    h = torch.tensor([[0.5, 0.25]])
    got = decoder.exact(low_precision=None).decode(h, torch.tensor([[0, 1, 2]]), 1).probabilities()
    assert got[0, 1:].tolist() == pytest.approx(p, rel=1e-6)
    states = h.reshape(1, 1, 2).expand(2, 1, 2)  # two depths of one position
    result = trajectories(states, torch.tensor([2]), decoder.exact(), top_k=3)
    assert result.trajectories[0].top_probs[1] == pytest.approx((p[0], p[1], p[2]), rel=1e-6)


def test_probabilities_do_not_depend_on_the_block_size():
    torch.manual_seed(0)
    decoder = Decoder("embedding", torch.randn(50, 8))
    h = torch.randn(7, 8)
    ids = torch.randint(0, 50, (7, 3))
    whole = decoder.exact(low_precision=None).decode(h, ids, 2)
    expected = torch.softmax(h.double() @ decoder.matrix.double().T, -1)
    got = whole.probabilities().double()
    assert torch.allclose(got[:, 2:], expected.gather(1, ids), rtol=1e-5)
    assert torch.allclose(got[:, :2], expected.gather(1, whole.top_ids), rtol=1e-5)
    one_row_at_a_time = decoder.exact(low_precision=None, chunk_bytes=1).decode(h, ids, 2)
    assert torch.equal(one_row_at_a_time.top_ids, whole.top_ids)
    assert torch.equal(one_row_at_a_time.ranks, whole.ranks)
    # float32 scores: BLAS may round apart between block shapes
    assert torch.allclose(one_row_at_a_time.probabilities(), whole.probabilities(), rtol=1e-5)


def test_repr_is_a_short_summary_with_the_last_layers_hits():
    states = torch.randn(3, 5, 4)
    tokens = torch.tensor([0, 1, 2, 3, 0])
    result = trajectories(states, tokens, identity(), positions=range(1, 4), model="toy")
    lines = repr(result).splitlines()
    assert lines[0] == "LensResult("
    assert lines[1] == "  model='toy', positions 1–3 (3), layers 0–2, decoder 'embedding', top_k=1"
    hits = sum(t.top1[-1] == t.next_id for t in result.trajectories)
    assert lines[2] == f"  layer 2 decodes the next token at {hits} of 3 positions" and lines[3] == ")"


def test_last_layer_logit_lens_probabilities_are_the_models_own():
    """At layer L the logit lens is the model's head: its probabilities are the model's softmax."""
    import resstream
    from resstream.models.loading import load_model

    loaded = load_model("reference", device="cpu", progress=False)
    text = "To be, or not to be"
    result = resstream.lens(text, model=loaded, top_k=3, progress=False)
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        logits, _ = loaded.view.model(ids)
    own = torch.softmax(logits[0].double(), -1)
    for t in result.trajectories:
        expected = own[t.position, list(t.top_ids[-1])].tolist()
        assert t.top_probs[-1] == pytest.approx(expected, rel=1e-4, abs=1e-7)
        if t.next_id is not None:
            assert t.next_probs[-1] == pytest.approx(float(own[t.position, t.next_id]), rel=1e-4, abs=1e-7)


def test_the_api_docstring_names_only_what_a_user_can_reach():
    """Every backticked name in `resstream.lens`'s docstring is one of its parameters, the
    result type or one of the result's public fields and methods, or the public API."""
    import dataclasses
    import inspect
    import re

    import resstream
    from resstream.analysis.shift.lens import LensResult, PositionTrajectory

    reachable = set(inspect.signature(resstream.lens).parameters) | {"LensResult"}
    for kind in (LensResult, PositionTrajectory):
        reachable |= {f.name for f in dataclasses.fields(kind)}
        reachable |= {name for name in vars(kind) if not name.startswith("_")}
    reachable |= {f"resstream.{name}" for name in resstream.__all__}
    named = {re.sub(r"\(.*\)$", "", name) for name in re.findall(r"`([^`]+)`", resstream.lens.__doc__)}
    assert named <= reachable, named - reachable


def test_ranks_and_probabilities_can_be_left_out():
    """Without ranks or probabilities the top-k lists are the same and the rest is empty, as
    in an old lens.json (which the renderers read)."""
    torch.manual_seed(3)
    decoder = Decoder("embedding", torch.randn(40, 6))
    states, tokens = torch.randn(4, 5, 6), torch.randint(0, 40, (5,))
    full = trajectories(states, tokens, decoder.exact(), top_k=3)
    bare = trajectories(states, tokens, decoder.exact(), top_k=3, ranks=False, probabilities=False)
    no_ranks = trajectories(states, tokens, decoder.exact(), top_k=3, ranks=False)
    for f, b, r in zip(full.trajectories, bare.trajectories, no_ranks.trajectories, strict=True):
        assert f.top_ids == b.top_ids == r.top_ids
        assert b.input_ranks == () and b.next_ranks is None and b.top_probs == () and b.input_probs == ()
        assert sum(r.top_probs, ()) == pytest.approx(sum(f.top_probs, ())) and r.input_probs == ()
    frame = bare.to_pandas()
    assert frame["input_rank"].isna().all() and frame["probability"].isna().all()
    assert LensResult.from_dict(bare.to_dict()).trajectories[0].top_ids == full.trajectories[0].top_ids
