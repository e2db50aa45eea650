"""The edge graph of issue 41: MIB's edge count, the name grammar and its one-line refusals."""

from __future__ import annotations

import pytest
import torch

from resstream.analysis.circuits.graph import Graph
from resstream.analysis.norms import NormForm
from resstream.errors import UsageError


def test_gpt2_small_has_mibs_edge_count() -> None:
    graph = Graph(12, 12, 12, [False] * 12)
    assert graph.n_edges == 32491
    assert graph.edge_names[0] == "emb->L0.H0.q" and graph.edge_names[-1] == "L11.mlp->logits"


def test_parallel_blocks_have_no_same_block_head_to_mlp_edges() -> None:
    graph = Graph(2, 4, 2, [True, True])
    names = set(graph.edge_names)
    assert "L0.H1->L0.mlp" not in names and "emb->L0.mlp" in names and "L0.H1->L1.H1.k" in names
    assert "L0.H1->L1.H3.k" not in names  # two key/value heads


def test_wildcards_expand_to_the_edges_they_spell() -> None:
    graph = Graph(12, 12, 12, [False] * 12)
    assert int(graph.parse_edges(["L*.H*->logits"]).sum()) == 144
    assert int(graph.parse_edges(["emb->L0.H1.*"]).sum()) == 3


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("foo", "is not an edge name"),
        ("L99.H1->logits", "layer 99 is out of range"),
        ("L1.H99->logits", "head 99 is out of range"),
        ("L1.H1->L0.mlp", "does not write below"),
        ("L" + "9" * 5000 + ".H1->logits", "is too long"),
    ],
)
def test_bad_edge_names_are_one_line(name: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        Graph(12, 12, 12, [False] * 12).parse_edges([name])
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400


@pytest.mark.parametrize("centre", [True, False])
def test_norm_vjp_is_the_jacobians_transpose(centre: bool) -> None:
    torch.manual_seed(0)
    form = NormForm(centre, 1e-5, torch.randn(8, dtype=torch.float64), None)
    u = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 8, dtype=torch.float64)
    (expected,) = torch.autograd.grad(form(u), u, r)
    torch.testing.assert_close(form.vjp(u.detach(), r), expected)
