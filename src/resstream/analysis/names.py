"""The one spelling of every component, in every output: the intervention grammar's names.

`resstream.analysis.interventions.components` parses these names (docs/causal.md,
"Components"); every result, table, figure, page and printed line writes them with the
functions here, so a name read anywhere can be given back to `ablate` or `patch` as it is:

=============  ==========================================================================
``emb``        the embedding output h_0
``L3.attn``    block 3's attention output (``L4.mlp``: block 4's MLP output)
``L3.H2``      head 2 of block 3
``L3.H2.S7``   head 2 of block 3 reading source position 7
``L5.N1031``   neuron 1031 of block 5's MLP (``L5.E3``: expert 3 of its mixture of experts)
``L2.resid@5`` the residual state at the input of block 2 at position 5
=============  ==========================================================================

A pair of components (a writer and the reader it feeds) is ``L2.H1 -> L5.H2``. An edge of a
circuit's graph joins a writer to one input of a reader: ``L0.H3->L2.H1.q`` (head 1's query
input; ``.k``, ``.v`` its key and value inputs), ``emb->L1.mlp``, ``L3.mlp->logits``. The terms of an
exact decomposition that no intervention acts on alone, the output biases and a post-norm's
bias, are named in the same style: ``L3.attn_bias``, ``L4.mlp_bias``, ``L4.norm_bias``.
Indices are 0-based.
"""

from __future__ import annotations

__all__ = [
    "EMBEDDING",
    "bias_name",
    "component_name",
    "edge_name",
    "expert_name",
    "head_name",
    "input_name",
    "neuron_name",
    "pair_name",
    "residual_name",
    "source_name",
    "sublayer_name",
]

#: The embedding output h_0.
EMBEDDING = "emb"


def sublayer_name(layer: int, part: str) -> str:
    """Block `layer`'s attention (`part` "attn") or MLP ("mlp") output: L3.attn, L4.mlp."""
    return f"L{layer}.{part}"


def head_name(layer: int, head: int) -> str:
    """Head `head` of block `layer`: L3.H2."""
    return f"L{layer}.H{head}"


def source_name(layer: int, head: int, source: int) -> str:
    """What head `head` of block `layer` reads from source position `source`: L3.H2.S7."""
    return f"{head_name(layer, head)}.S{source}"


def neuron_name(layer: int, neuron: int) -> str:
    """Neuron `neuron` of block `layer`'s MLP (a mixture of experts: the flat index): L5.N1031."""
    return f"L{layer}.N{neuron}"


def expert_name(layer: int, expert: int) -> str:
    """Expert `expert` of block `layer`'s mixture of experts: L5.E3."""
    return f"L{layer}.E{expert}"


def residual_name(layer: int, position: int) -> str:
    """The residual state at the input of block `layer` (h_layer; `layer` = n_layers is the
    final state h_L) at `position`: L2.resid@5."""
    return f"L{layer}.resid@{position}"


def bias_name(layer: int, kind: str) -> str:
    """A bias term of block `layer` in a decomposition (`kind` attn_bias, mlp_bias or
    norm_bias): L3.attn_bias."""
    return f"L{layer}.{kind}"


def pair_name(writer: str, reader: str) -> str:
    """A writer and the later component that reads it: L2.H1 -> L5.H2."""
    return f"{writer} -> {reader}"


def input_name(layer: int, kind: str, head: int = -1) -> str:
    """One input of a component that reads the stream: head `head`'s query, key or value
    input (`kind` "q", "k", "v"), L5.H3.q, or block `layer`'s MLP input ("mlp"), L5.mlp."""
    return sublayer_name(layer, "mlp") if kind == "mlp" else f"{head_name(layer, head)}.{kind}"


def edge_name(writer: str, reader: str) -> str:
    """An edge of a circuit's graph: a writer and one reader input, L0.H3->L2.H1.q."""
    return f"{writer}->{reader}"


def component_name(layer: int, kind: str, index: int = -1, source: int = -1, position: int = -1) -> str:
    """The name of a component given by its parts, as `Component` holds them: `kind` emb,
    attn, mlp, head, neuron, expert, source or resid; `index` the head, neuron or expert;
    `source` a head's source position; `position` a residual state's position."""
    if kind == "emb":
        return EMBEDDING
    if kind in ("attn", "mlp"):
        return sublayer_name(layer, kind)
    if kind == "head":
        return head_name(layer, index)
    if kind == "source":
        return source_name(layer, index, source)
    if kind == "neuron":
        return neuron_name(layer, index)
    if kind == "expert":
        return expert_name(layer, index)
    if kind == "resid":
        return residual_name(layer, position)
    raise ValueError(f"no component kind {kind!r}")
