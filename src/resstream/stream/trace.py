"""`trace(model, texts, names)`: the activations you name, from the model's own forward.

    trace = resstream.trace(model, ["The cat sat", "A dog ran"], names=["L3.resid", "L3.H2",
                            "L3.H2.pattern", "L5.N*", "L4.mlp", "logits"], tokenizer=tokenizer)
    trace["L3.resid"]        # (texts, positions, d_model): h_3 at every position

Only the sites named are recorded (`stream.sites`: one hook each, at the point the
intervention engine edits), and the forward stops after the last block they need (unless the
logits are asked); the texts run in batches of `batch_size`, padded on the right
(a causal model's states at the real positions do not see the padding), and every tensor is
(texts, positions, *width) with the padding's rows zero (`lengths` says how many are real),
or (texts, *width) for a name with ``@p``. A pattern is (texts, [heads,] query, key), read
from the eager attention, which runs while one is asked. `edits=[...]` reads them under
edits (`stream.edited`). Before the first forward, the records' size is checked against the
memory of the model's device (one line naming what to lower).
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from resstream.analysis.interventions.points import hook_point, point_of, split_heads, trailing_index
from resstream.capture.attention import hooked_attention
from resstream.capture.hooks import check_input_ids, right_padding_mask, run_forward
from resstream.data.tokenizer import token_text
from resstream.display import Displayable
from resstream.errors import UsageError
from resstream.models.adapters.base import ModelView
from resstream.models.loaded import LoadedModel
from resstream.reporting.notebook import register_result
from resstream.reporting.stream import trace_frame, trace_view
from resstream.reprs import summary
from resstream.resources import check_fits
from resstream.stream.edited import edited
from resstream.stream.edits import StreamEdit, site_width
from resstream.stream.sites import Site, parse_sites, space_of

#: Texts run together in one forward, at most.
DEFAULT_BATCH = 8
#: `Trace.to_pandas` refuses more values than this (one row each).
MAX_ROWS = 2_000_000

Texts = str | Sequence[str] | Tensor | Sequence[Sequence[int]]


@dataclass(frozen=True, eq=False)
class Trace(Displayable):
    """The activations `trace` recorded (module docstring): `activations` by name, each text's
    token ids (`input_ids`, (texts, positions) padded with 0), `lengths` (real positions per
    text) and `tokens` (each text's tokens as text, `data.tokenizer.token_text`, when a tokenizer
    was given)."""

    activations: dict[str, Tensor]
    input_ids: Tensor
    lengths: tuple[int, ...]
    tokens: tuple[tuple[str, ...], ...] | None = None
    sites: tuple[Site, ...] = field(default=(), repr=False)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self.activations:
            raise KeyError(f"{name!r} was not traced; traced: {', '.join(self.activations)}")
        return self.activations[name]

    def __contains__(self, name: object) -> bool:
        return name in self.activations

    def __iter__(self) -> Iterator[str]:
        return iter(self.activations)

    def __len__(self) -> int:
        return len(self.activations)

    @property
    def names(self) -> list[str]:
        """The names traced, in the order asked."""
        return list(self.activations)

    def to_pandas(self, names: Sequence[str] | None = None) -> Any:
        """One row per recorded value of `names` (default: all) at a real position: text,
        position (the query for a pattern), token, name, index (flat index into the site's
        width, −1 for a number) and value; UsageError beyond `MAX_ROWS` rows (trace fewer
        names, or one position with ``@p``)."""
        return trace_frame(self, list(names) if names is not None else self.names, MAX_ROWS)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in self.activations.items())
        texts = len(self.lengths)
        return summary(self, f"{texts} text{'s' * (texts != 1)}", shapes)


def trace(
    model: Any,
    texts: Texts,
    names: str | Sequence[str],
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    edits: StreamEdit | Sequence[StreamEdit] = (),
    batch_size: int = DEFAULT_BATCH,
    progress: bool = False,
) -> Trace:
    """The activations `names` of `texts` (module docstring).

    `model`: a Hugging Face causal LM or resstream GPT object (with its `tokenizer` to read
    text; token ids need none), a loaded model, or a spec string (run directory, Hugging Face
    directory or hub name; None: the built-in reference model). `texts`: a string, strings,
    or token ids ((texts, positions) tensor or lists of ids). `progress`: a bar over the
    texts."""
    loaded = _loaded(model, tokenizer)
    view = loaded.view
    sites = parse_sites(list(names) if not isinstance(names, str) else names, space_of(view))
    ids, lengths = _encoded(texts, loaded.tokenizer, view)
    _check_positions(sites, lengths)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise UsageError(f"`batch_size` {batch_size!r}; allowed: an int >= 1")
    _check_memory(view, sites, ids.shape[0], ids.shape[1], ids.device)
    records: dict[str, list[Tensor]] = defaultdict(list)
    bar = tqdm(total=ids.shape[0], desc="trace", unit="text", disable=not progress)
    with bar, torch.no_grad(), edited(view, edits):
        for start in range(0, ids.shape[0], batch_size):
            rows = slice(start, start + batch_size)
            _record_batch(view, sites, ids[rows], lengths[rows], records)
            bar.update(len(lengths[rows]))
    activations = {
        site.name: _zero_padding(_joined(records[site.name], site, ids.shape[1]), site, lengths)
        for site in sites
    }
    tokens = None
    if loaded.tokenizer is not None:
        reader = loaded.tokenizer
        tokens = tuple(
            tuple(token_text(reader, i) for i in row[:n].tolist())
            for row, n in zip(ids, lengths, strict=True)
        )
    return Trace(activations, ids.cpu(), tuple(lengths), tokens, tuple(sites))


def _loaded(model: Any, tokenizer: PreTrainedTokenizerBase | None) -> LoadedModel:
    from resstream.models.loaded import as_loaded

    if model is None or isinstance(model, (str,)) or hasattr(model, "__fspath__"):
        from resstream.models.loading import load_model

        loaded = load_model(model, progress=False)
        return (
            loaded if tokenizer is None else LoadedModel(loaded.view, tokenizer, loaded.name, loaded.source)
        )
    return as_loaded(model, tokenizer, needs_tokenizer=False)


def _encoded(
    texts: Texts, tokenizer: PreTrainedTokenizerBase | None, view: ModelView
) -> tuple[Tensor, list[int]]:
    """(texts, longest) ids padded on the right with 0, and each text's length; a tensor of
    ids is used as it is (every row a whole text)."""
    ids, lengths = _id_tensor(texts) if isinstance(texts, Tensor) else _padded(_rows(texts, tokenizer))
    if not lengths:
        raise UsageError("`texts` is empty; allowed: a string, strings, or token ids")
    if min(lengths) == 0:
        raise UsageError("`texts` holds an empty text (no tokens)")
    vocab = int(view.W_E.shape[0])
    low, high = int(ids.min()), int(ids.max())
    if high >= vocab or low < 0:
        bad = high if high >= vocab else low
        raise UsageError(f"`texts` holds token id {bad}; allowed: 0..{vocab - 1} (the model's vocabulary)")
    check_input_ids(view, ids)
    return ids.to(view.W_E.device if view.W_E.device.type != "meta" else "cpu"), lengths


def _id_tensor(texts: Tensor) -> tuple[Tensor, list[int]]:
    """Token ids given as a tensor (positions,) or (texts, positions), each row one text."""
    ids = texts.unsqueeze(0) if texts.ndim == 1 else texts
    if ids.ndim != 2 or ids.dtype not in (torch.int32, torch.int64):
        raise UsageError(
            f"`texts` as ids must be an integer tensor (texts, positions), got {tuple(texts.shape)}"
        )
    return ids.long(), [int(ids.shape[1])] * int(ids.shape[0])


def _rows(
    texts: str | Sequence[str] | Sequence[Sequence[int]], tokenizer: PreTrainedTokenizerBase | None
) -> list[list[int]]:
    """The ids of each text given as a string (read by `tokenizer`) or a list of ids."""
    listed = [texts] if isinstance(texts, str) else list(texts)
    if not listed:
        raise UsageError("`texts` is empty; allowed: a string, strings, or token ids")
    if all(isinstance(t, str) for t in listed):
        if tokenizer is None:
            raise UsageError("`texts` are strings: pass the model's `tokenizer` (or token ids)")
        return [tokenizer(t, add_special_tokens=True)["input_ids"] for t in listed]
    if all(isinstance(t, Sequence) and all(isinstance(i, int) for i in t) for t in listed):
        return [list(t) for t in listed]  # type: ignore[arg-type]
    raise UsageError("`texts` mixes strings and ids; allowed: strings, or token ids")


def _padded(rows: list[list[int]]) -> tuple[Tensor, list[int]]:
    """The rows as one tensor padded on the right with 0, and their lengths."""
    lengths = [len(row) for row in rows]
    ids = torch.zeros((len(rows), max(lengths)), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return ids, lengths


def _check_positions(sites: list[Site], lengths: list[int]) -> None:
    shortest = min(lengths)
    for site in sites:
        if site.position is not None and site.position >= shortest:
            raise UsageError(
                f"`names` {site.name}: position {site.position} is past the shortest text "
                f"({shortest} tokens); allowed: 0..{shortest - 1}"
            )


def _values_per_token(view: ModelView, site: Site, positions: int) -> int:
    """Numbers a site records per text and position (a pattern: per query position)."""
    if site.kind == "pattern":
        assert site.component is not None
        heads = view.n_heads if site.component.index < 0 else 1
        return heads * positions
    return math.prod(site_width(view, site))


def _check_memory(
    view: ModelView, sites: list[Site], texts: int, positions: int, device: torch.device
) -> None:
    """UsageError when the records would not fit the memory of the model's device."""
    size = view.W_U.element_size()
    values = sum(
        _values_per_token(view, s, positions) * (1 if s.position is not None else positions) for s in sites
    )
    need = texts * values * size
    check_fits(
        f"`names` ({len(sites)}) of {texts:,} text{'s' * (texts != 1)} × {positions:,} positions",
        need,
        device,
        purpose="for the traced activations",
        remedy="trace fewer names, one position (@p), or fewer or shorter texts",
    )


def _record_batch(
    view: ModelView, sites: list[Site], ids: Tensor, lengths: list[int], records: dict[str, list[Tensor]]
) -> None:
    """One forward of a batch with a reader at every site."""
    mask = right_padding_mask(view, lengths, ids.shape[1], ids.device)
    patterns = [s for s in sites if s.kind == "pattern"]
    logits = None
    with ExitStack() as stack:
        for site in sites:
            if site.kind == "activation":
                stack.enter_context(_reading(view, site, records[site.name]))
        found = stack.enter_context(_patterns(view, patterns, ids)) if patterns else None
        last = last_block(view, sites)
        if last is not None:  # hooked last, so every reader of that block has run first
            stack.enter_context(_stopping_after(view, last))
        with contextlib.suppress(_Enough):
            logits = _forward(view, ids, mask, any(s.kind == "logits" for s in sites))
    for site in sites:
        if site.kind == "logits" and logits is not None:
            records[site.name].append(_at(logits, site))
    if found is not None:  # after the readers are gone: a view's own `attention` runs a forward
        for site, probs in zip(patterns, found(), strict=True):
            records[site.name].append(probs)


class _Enough(Exception):
    """Raised by the hook after the last block a trace reads: the rest of the forward would
    compute nothing it records."""


def last_block(view: ModelView, sites: list[Site]) -> int | None:
    """The last block whose computation a trace reads, when the forward may stop after it;
    None when it must run to the end (logits, or a site in the last block)."""
    if any(site.kind == "logits" for site in sites):
        return None
    deepest = 0
    for site in sites:
        assert site.component is not None
        where, layer = point_of(site.component)
        deepest = max(deepest, max(layer - 1, 0) if where == "state" else layer)
    return deepest if deepest < view.n_layers - 1 else None


@contextmanager
def _stopping_after(view: ModelView, layer: int) -> Iterator[None]:
    """A hook on block `layer`'s output that ends the forward there (`_Enough`)."""

    def stop(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        raise _Enough

    handle = view.blocks[layer].module.register_forward_hook(stop)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def _reading(view: ModelView, site: Site, into: list[Tensor]) -> Iterator[None]:
    """A reader at a site's hook point, keeping its slice of every forward."""
    component = site.component
    assert component is not None
    where, layer = point_of(component)
    column = trailing_index(view, component)

    def read(x: Tensor) -> None:
        x = split_heads(view, where, layer, x)
        if column is not None:
            x = x[:, :, column]
        into.append(_at(x, site).detach().clone())

    handles = hook_point(view, where, layer, read)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _at(x: Tensor, site: Site) -> Tensor:
    """A (batch, seq, ...) record at the site's one position, or all of it."""
    return x if site.position is None else x[:, site.position]


@contextmanager
def _patterns(view: ModelView, sites: list[Site], ids: Tensor) -> Iterator[Callable[[], list[Tensor]]]:
    """The attention probabilities (fp32) of the heads `sites` name, from the eager attention
    of the forward that runs inside (`capture.attention.hooked_attention`; a view with its own
    `attention` computes them after it)."""
    layers = sorted({s.component.layer for s in sites if s.component is not None})

    def cut(found: Sequence[Tensor]) -> list[Tensor]:
        by_layer = dict(zip(layers, found, strict=True))
        return [_pattern(by_layer[s.component.layer], s) for s in sites if s.component is not None]

    own = view.attention
    if own is not None:

        def recomputed() -> list[Tensor]:
            every = own(ids)  # one forward gives every layer's
            return cut([every[layer].float() for layer in layers])

        yield recomputed
        return
    with hooked_attention(view, None, ids.device, layers) as found:
        yield lambda: cut(found())


def _pattern(probs: Tensor, site: Site) -> Tensor:
    """(batch, heads, query, key) cut to the site's head and query position."""
    assert site.component is not None
    if site.component.index >= 0:
        probs = probs[:, site.component.index]
        return probs if site.position is None else probs[:, site.position]
    return probs if site.position is None else probs[:, :, site.position]


def _forward(view: ModelView, ids: Tensor, mask: Tensor | None, logits: bool) -> Tensor | None:
    """Run the model once: its trunk, or the whole model when its logits are asked."""
    if not logits:
        run_forward(view, ids, mask)
        return None
    out = view.model(ids) if view.family == "resstream" else view.model(input_ids=ids, attention_mask=mask)
    return (out[0] if isinstance(out, tuple) else out.logits).detach()


def _joined(parts: list[Tensor], site: Site, longest: int) -> Tensor:
    """The batches' records as one tensor, the position axis padded with zeros to `longest`."""
    if site.position is not None and site.kind != "pattern":
        return torch.cat(parts)
    padded = []
    for part in parts:
        if site.kind == "pattern":
            part = _pad_pattern(part, longest, site)
        else:
            part = torch.nn.functional.pad(part, (*[0, 0] * (part.ndim - 2), 0, longest - part.shape[1]))
        padded.append(part)
    return torch.cat(padded)


def _zero_padding(tensor: Tensor, site: Site, lengths: list[int]) -> Tensor:
    """`tensor` with the padding's rows zero, in place: the positions past each text's length
    (a pattern's query rows and key columns; a name with @p is at a real position)."""
    if site.position is not None:
        return tensor
    for text, length in enumerate(lengths):
        if site.kind == "pattern":
            tensor[text, ..., length:, :] = 0
            tensor[text, ..., length:] = 0
        else:
            tensor[text, length:] = 0
    return tensor


def _pad_pattern(part: Tensor, longest: int, site: Site) -> Tensor:
    """A pattern's key axis (and query axis, without @p) padded with zeros to `longest`."""
    key = longest - part.shape[-1]
    if site.position is not None:
        return torch.nn.functional.pad(part, (0, key))
    return torch.nn.functional.pad(part, (0, key, 0, key))


register_result(Trace, lambda t: trace_frame(t, t.names, MAX_ROWS), trace_view)

__all__ = ["DEFAULT_BATCH", "MAX_ROWS", "Trace", "trace"]
