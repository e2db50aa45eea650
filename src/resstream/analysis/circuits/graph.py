"""The graph circuits are found in: writers, reader inputs, and the edges between them.

*Writers* (nodes) are what add to the residual stream: the input embedding ``emb``, every
attention head ``L3.H2`` and every MLP ``L3.mlp`` (a mixture of experts' MLP node is the whole
block). *Readers* are the inputs that read the stream: each head's query, key and value input
``L3.H2.q`` / ``.k`` / ``.v``, each MLP's input ``L3.mlp`` and the ``logits`` (the final norm's
input). In a grouped-query model a key/value head is read by several query heads at once, so
its key and value inputs are one reader each, named by the key/value head's index
(``L3.H1.k`` with 1 < n_kv_heads). An *edge* ``writer->reader`` exists where the writer adds to
the stream below the reader's input: an earlier block, or the same block's attention for the
MLP of a block whose MLP reads the attention's output (not a parallel block). This is the
graph of EAP-IG and MIB, so counts compare: GPT-2 small has 32,491 edges.

Writers are numbered bottom-up (``emb``, L0's heads, L0's MLP, L1's heads, ...), so the writers
below a reader are always a prefix of that order (`Graph.upstream`). Readers are numbered block
by block (each head's q, then each key/value head's k, then v, then the MLP), ``logits`` last.
Edges are numbered reader by reader, each reader's writers in order.

Edge names (`parse_edges`): ``L0.H3->L2.H1.q``, ``emb->L1.mlp``, ``L3.mlp->logits``; ``*``
stands for every index where a number goes (``L*.H*->L2.H1.q``) and, as a whole side, for
every writer or reader (``*->logits``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch
from torch import Tensor

from resstream.analysis.names import EMBEDDING, edge_name, head_name, input_name, sublayer_name
from resstream.errors import UsageError
from resstream.models.adapters.base import ModelView

WriterKind = Literal["emb", "head", "mlp"]
ReaderKind = Literal["q", "k", "v", "mlp", "logits"]
LOGITS = "logits"
#: The spelling of an edge, for error messages.
EDGE_GRAMMAR = (
    "<writer>-><reader>, writer emb | L<l>.H<h> | L<l>.mlp, reader L<l>.H<h>.q | L<l>.H<h>.k | "
    "L<l>.H<h>.v | L<l>.mlp | logits (0-based; * for every index, or for a whole side)"
)
#: The longest index a name may spell (longer ones are refused before they are read as numbers).
_MAX_DIGITS = 9
_INDEX = r"(?:\d+|\*)"
_WRITER = re.compile(rf"^(?:emb|\*|L{_INDEX}\.(?:H{_INDEX}|mlp))$")
_READER = re.compile(rf"^(?:logits|\*|L{_INDEX}\.(?:H{_INDEX}\.(?:[qkv]|\*)|mlp))$")


@dataclass(frozen=True)
class Writer:
    """One node that adds to the stream (module docstring); `layer` −1 for the embedding."""

    kind: WriterKind
    layer: int = -1
    head: int = -1

    @property
    def name(self) -> str:
        if self.kind == "emb":
            return EMBEDDING
        return head_name(self.layer, self.head) if self.kind == "head" else sublayer_name(self.layer, "mlp")


@dataclass(frozen=True)
class Reader:
    """One input that reads the stream (module docstring); `layer` n_layers for the logits,
    `head` the query head (q) or key/value head (k, v)."""

    kind: ReaderKind
    layer: int
    head: int = -1

    @property
    def name(self) -> str:
        return LOGITS if self.kind == "logits" else input_name(self.layer, self.kind, self.head)


@dataclass(frozen=True)
class ReaderGroup:
    """The readers that read one residual point: block `layer`'s attention inputs ("attn"),
    its MLP's input ("mlp"), or the logits. `readers` is their index range, `upstream` how many
    writers (a prefix) are below them."""

    part: Literal["attn", "mlp", "logits"]
    layer: int
    readers: range
    upstream: int


class Graph:
    """The writers, readers and edges of one model (module docstring)."""

    def __init__(self, n_layers: int, n_heads: int, n_kv_heads: int, parallel: Sequence[bool]) -> None:
        self.n_layers, self.n_heads, self.n_kv_heads = n_layers, n_heads, n_kv_heads
        self.parallel = tuple(parallel)
        writers: list[Writer] = [Writer("emb")]
        readers: list[Reader] = []
        groups: list[ReaderGroup] = []
        for layer in range(n_layers):
            below = len(writers)
            start = len(readers)
            readers += [Reader("q", layer, h) for h in range(n_heads)]
            readers += [Reader(kind, layer, g) for kind in ("k", "v") for g in range(n_kv_heads)]
            groups.append(ReaderGroup("attn", layer, range(start, len(readers)), below))
            writers += [Writer("head", layer, h) for h in range(n_heads)]
            mlp_below = below if self.parallel[layer] else len(writers)
            groups.append(ReaderGroup("mlp", layer, range(len(readers), len(readers) + 1), mlp_below))
            readers.append(Reader("mlp", layer))
            writers.append(Writer("mlp", layer))
        groups.append(ReaderGroup("logits", n_layers, range(len(readers), len(readers) + 1), len(writers)))
        readers.append(Reader("logits", n_layers))
        self.writers, self.readers, self.groups = tuple(writers), tuple(readers), tuple(groups)

    @classmethod
    def of(cls, view: ModelView) -> Graph:
        """The graph of a model's view; UsageError for a model whose stream is not a sum of
        its writers' outputs (resstream's post-norm blocks)."""
        post = [i for i, b in enumerate(view.blocks) if b.norm_position == "post"]
        if post:
            raise UsageError(
                f"this model's blocks {post[:3]} normalise the residual stream itself (post-norm), so the "
                "stream is not a sum of what its heads and MLPs write and edges are not defined; allowed: "
                "pre-norm models"
            )
        return cls(view.n_layers, view.n_heads, kv_heads(view), [b.parallel for b in view.blocks])

    @cached_property
    def upstream(self) -> Tensor:
        """How many writers (a prefix) are below each reader (n_readers,)."""
        out = torch.zeros(len(self.readers), dtype=torch.long)
        for group in self.groups:
            out[group.readers.start : group.readers.stop] = group.upstream
        return out

    @cached_property
    def edges(self) -> Tensor:
        """(n_edges, 2) writer and reader index of every edge, reader by reader."""
        reader = torch.repeat_interleave(torch.arange(len(self.readers)), self.upstream)
        starts = torch.cumsum(self.upstream, 0) - self.upstream
        writer = torch.arange(len(reader)) - torch.repeat_interleave(starts, self.upstream)
        return torch.stack([writer, reader], dim=1)

    @property
    def n_edges(self) -> int:
        return int(self.upstream.sum())

    @cached_property
    def edge_offsets(self) -> Tensor:
        """The index of each reader's first edge (n_readers,)."""
        return torch.cumsum(self.upstream, 0) - self.upstream

    def edge_index(self, writer: int, reader: int) -> int:
        """The index of edge writer -> reader (ValueError if the writer is not below it)."""
        if not 0 <= writer < int(self.upstream[reader]):
            raise ValueError(f"{self.writers[writer].name} is not below {self.readers[reader].name}")
        return int(self.edge_offsets[reader]) + writer

    @cached_property
    def edge_names(self) -> tuple[str, ...]:
        w, r = self.edges[:, 0].tolist(), self.edges[:, 1].tolist()
        return tuple(edge_name(self.writers[i].name, self.readers[j].name) for i, j in zip(w, r, strict=True))

    @cached_property
    def _by_name(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.edge_names)}

    @cached_property
    def reader_node(self) -> Tensor:
        """The writer index of the node each reader belongs to (n_readers,): a head's q/k/v
        inputs belong to the head (a grouped key/value head's to its first query head), an
        MLP's input to the MLP; −1 for the logits."""
        out = torch.full((len(self.readers),), -1, dtype=torch.long)
        index = {w: i for i, w in enumerate(self.writers)}
        group = self.n_heads // self.n_kv_heads
        for r, reader in enumerate(self.readers):
            if reader.kind == "mlp":
                out[r] = index[Writer("mlp", reader.layer)]
            elif reader.kind == "q":
                out[r] = index[Writer("head", reader.layer, reader.head)]
            elif reader.kind in ("k", "v"):
                out[r] = index[Writer("head", reader.layer, reader.head * group)]
        return out

    @cached_property
    def reader_heads(self) -> tuple[tuple[int, ...], ...]:
        """The writers (query heads) each reader feeds: one for q and the MLP, every head of a
        key/value group for k and v, none for the logits."""
        group = self.n_heads // self.n_kv_heads
        out = []
        for r, reader in enumerate(self.readers):
            first = int(self.reader_node[r])
            width = group if reader.kind in ("k", "v") else 1
            out.append(() if first < 0 else tuple(range(first, first + width)))
        return tuple(out)

    def parse_edges(self, names: Sequence[str], what: str = "`edges`") -> Tensor:
        """A boolean mask (n_edges,) of the edges `names` spell (module docstring); UsageError
        naming the grammar for a name it does not spell, the range for an index outside it,
        and for a name that matches no edge (a writer that is not below its reader)."""
        mask = torch.zeros(self.n_edges, dtype=torch.bool)
        for raw in names:
            name = raw.strip()
            if not name:
                continue
            if "*" not in name:
                mask[self._one(name, what)] = True
                continue
            found = self._matching(name, what)
            if not found.any():
                raise UsageError(
                    f"{what} {_shown(name)} matches no edge of this model's graph; allowed: {EDGE_GRAMMAR}"
                )
            mask |= found
        return mask

    def _one(self, name: str, what: str) -> int:
        writer, reader = self._sides(name, what)
        key = edge_name(writer, reader)
        if key in self._by_name:
            return self._by_name[key]
        raise UsageError(
            f"{what} {_shown(name)} is not an edge of this model's graph: {writer} does not write below "
            f"{reader}; a writer must be in an earlier block (or the same block's attention, for the MLP "
            "of a block that is not parallel)"
        )

    def _matching(self, name: str, what: str) -> Tensor:
        writer, reader = self._sides(name, what)
        pattern = re.compile(f"^{_side_regex(writer)}->{_side_regex(reader)}$")
        return torch.tensor([bool(pattern.match(n)) for n in self.edge_names], dtype=torch.bool)

    def _sides(self, name: str, what: str) -> tuple[str, str]:
        """The writer and reader spellings of an edge name, checked against the grammar and
        the model's sizes."""
        parts = [p.strip() for p in name.split("->")]
        if len(parts) != 2 or not _WRITER.match(parts[0]) or not _READER.match(parts[1]):
            raise UsageError(f"{what} {_shown(name)} is not an edge name; allowed: {EDGE_GRAMMAR}")
        for side in parts:
            self._check_indices(side, name, what)
        return parts[0], parts[1]

    def _check_indices(self, side: str, name: str, what: str) -> None:
        for field, digits in re.findall(r"([LH])(\d+)", side):
            if len(digits) > _MAX_DIGITS:
                raise UsageError(f"{what} {_shown(name)}: index {digits[:12]}... is too long")
            value = int(digits)
            count = self.n_layers if field == "L" else self._head_count(side)
            if value >= count:
                what_index = "layer" if field == "L" else "head"
                raise UsageError(
                    f"{what} {_shown(name)}: {what_index} {value} is out of range; "
                    f"allowed: 0..{count - 1} (0-based)"
                )

    def _head_count(self, side: str) -> int:
        return self.n_kv_heads if side.endswith((".k", ".v")) else self.n_heads


def kv_heads(view: ModelView) -> int:
    """How many key/value heads each block has (the query heads' count without grouping)."""
    block = view.blocks[0]
    if block.qkv_columns is None:
        raise UsageError(
            f"the {view.family} adapter does not say where each head's query, key and value are, so a head's "
            "inputs cannot be told apart; allowed: a family whose adapter gives them"
        )
    columns = {tuple(block.qkv_columns("k", h)[1].tolist()) for h in range(view.n_heads)}
    return len(columns)


def _side_regex(side: str) -> str:
    """The regular expression of one side of an edge pattern (module docstring)."""
    if side == "*":
        return "[^-]+"
    text, tail = re.escape(side), ""
    if side.endswith(".*") and ".H" in side:  # L2.H1.*: the query, key and value inputs
        text, tail = text[:-2], "[qkv]"
    return text.replace(r"\*", r"\d+") + tail


def _shown(name: str) -> str:
    """A name for a message, cut short when it is long."""
    return repr(name if len(name) <= 60 else name[:57] + "...")


__all__ = [
    "EDGE_GRAMMAR",
    "LOGITS",
    "Graph",
    "Reader",
    "ReaderGroup",
    "ReaderKind",
    "Writer",
    "WriterKind",
    "kv_heads",
]
