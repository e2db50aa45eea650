"""`resstream.decompose`: one state as named components that sum back to it."""

from __future__ import annotations

import pytest
import torch

import resstream
from resstream.errors import UsageError

TEXT = "The king said that the queen"
pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


def test_decompose_sums_to_the_state_with_every_level() -> None:
    result = resstream.decompose(
        TEXT, position=-2, point="L_res_3", sources=True, neurons=True, progress=False
    )
    assert result.position == 4 and result.point == "L_res_3"
    torch.testing.assert_close(result.vectors.double().sum(0), result.state.double(), rtol=0, atol=1e-5)
    assert result.relative <= 1e-5
    labels = set(result.labels)
    assert {"emb", "L0.H1.S2", "L2.N7", "L3.H0.S4"} <= labels
    assert not any(label.startswith("L3.N") for label in labels)  # L_res_3: layer 3's MLP comes later
    assert result.largest(3)[0][1] >= result.largest(3)[1][1]
    assert "components" in result.to_dict() and "L_res_3" in repr(result)


def test_decompose_defaults_and_point_names() -> None:
    last = resstream.decompose(TEXT, progress=False)
    assert last.point == "L_out_5" and last.position == 5
    assert "L5.mlp" in last.labels and "L0.H0" in last.labels
    assert resstream.decompose(TEXT, point="L_in_2", progress=False).point == "L_out_1"
    assert resstream.decompose(TEXT, point=0, progress=False).labels == ("emb",)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [({"point": "L_mid_2"}, "not a residual point"), ({"point": 13}, "0..12"), ({"position": 9}, "outside")],
)
def test_bad_points_and_positions(kwargs, pattern) -> None:
    with pytest.raises(UsageError, match=pattern):
        resstream.decompose(TEXT, progress=False, **kwargs)
