"""Decoding trajectories on cases small enough to check by hand."""

from __future__ import annotations

import pytest
import torch

from resstream.analysis.decoding import Decoder
from resstream.analysis.lens import LayerRange, merge_ranges, trajectories


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
