"""`resstream.directions(...)`: directions of a concept read from two sets of texts, at every
layer, each with its held-out ROC-AUC (the methods: `resstream.analysis.steering.directions`).

Reading the states. The texts (positives and negatives together, shortest first) run in batches
of `batch_size`, each text encoded as `encode_text` encodes it (with the tokenizer's special
tokens, e.g. a BOS) and the batch right-padded: a causal model's states at a text's real
positions never see the padding after them. A Hugging Face model gets the attention mask of the
real tokens; resstream's own GPT (which takes no mask) none, its padding being causal too. One
forward per batch records h_0..h_L (`resstream.capture.residual_states`) and each text is
reduced at once by the position rule, so a batch's (layers, texts, positions, d) states are the
largest thing held:

* ``last``: the state at the text's last token (the last real token: padding never counts);
* ``mean``: the mean over the text's real tokens, without the BOS token the tokenizer adds
  before the text (its state is the same for every text).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

import torch
from torch import Tensor
from tqdm.auto import tqdm

from resstream.analysis.steering.directions import (
    HELD_OUT,
    DirectionsResult,
    Position,
    check_position,
    check_set_size,
    find_directions,
)
from resstream.analysis.steering.files import SavedDirections, load_directions
from resstream.api.inputs import LoadOptions, one_model, takes_load_args
from resstream.api.tokenizers import LEADING_SPACE, single_token, tokenizer_of
from resstream.capture import residual_states
from resstream.capture.hooks import right_padding_mask
from resstream.checks import check_batch_size, check_fraction
from resstream.data.concepts import ContrastTexts, concept_texts, read_pairs, read_text_set
from resstream.data.sampling import prepends_bos
from resstream.errors import UsageError, check_choice
from resstream.models import LoadArgs, LoadedModel, ModelLike, ModelView

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: A set of texts as the API takes it: a file (`resstream.data.concepts.read_text_set`) or
#: the texts themselves.
TextSet = str | os.PathLike[str] | Sequence[str]
#: Contrast pairs: a `.jsonl` file of positive/negative rows, or (positive, negative) tuples.
PairSet = str | os.PathLike[str] | Sequence[tuple[str, str]]

#: Texts per forward pass by default.
BATCH_SIZE = 16


@takes_load_args
def directions(
    model: ModelLike = None,
    positive: TextSet | None = None,
    negative: TextSet | None = None,
    *,
    pairs: PairSet | None = None,
    concept: str | None = None,
    position: Position = "last",
    tokens: Sequence[str] = (),
    held_out: float = HELD_OUT,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
    tokenizer: PreTrainedTokenizerBase | None = None,
    progress: bool = False,
    **load: Unpack[LoadArgs],
) -> DirectionsResult:
    """Directions of a concept at every layer: DiffMean, the first principal component of
    paired differences and a logistic-regression probe, each scored by its held-out ROC-AUC of
    concept detection (definitions: `resstream.analysis.steering.directions`).

    The texts: `positive` and `negative` (each a `.jsonl` file of ``{"text": ...}`` rows, any
    other file with one text per line, or a list of texts), or `pairs` (a `.jsonl` file of
    ``{"positive": ..., "negative": ...}`` rows, or a list of (positive, negative) tuples), or
    a built-in `concept` from the plays: "comedy-tragedy" or "speaker:NAME" (e.g.
    "speaker:HAMLET"; `resstream.data.concepts`), at most 256 texts a set. `position` is the
    rule that reads one state per text and layer: "last" (the last token) or "mean" (the mean
    over the text's tokens, a BOS the tokenizer adds left out; module docstring). `tokens`:
    texts of one token each whose unembedding rows every direction is compared with (cosine).
    A seeded (`seed`) fraction `held_out` of each set (of the pairs) is held out, the same for
    every method. `batch_size` texts run per forward pass.

    `model` is a spec (loaded with `dtype`, `device`, `device_map`, `trust_remote_code`; None:
    the built-in reference model) or a model in memory with its `tokenizer`. `progress`: bars.

    Returns a `DirectionsResult` (`direction(layer, method)`, `best()`, `to_dict()`,
    `to_pandas()`), saved by `resstream.analysis.steering.save_directions` and exported to
    llama.cpp by `export_control_vector`. UsageError, before the model loads, for no texts or
    two sources of them, a missing or empty file, an empty text, a set too small to split
    (at least 3 texts with the default `held_out`), an unknown `position` or `concept`; once it
    has loaded, for a text longer than the model's context or a token that is not one token.
    """
    check_position(position)
    check_fraction("held_out", held_out)
    check_batch_size(batch_size)
    texts = contrast_texts(positive, negative, pairs=pairs, concept=concept, seed=seed)
    if texts.paired:
        check_set_size("`pairs`", len(texts.positive), held_out)
    else:
        check_set_size("`positive`", len(texts.positive), held_out)
        check_set_size("`negative`", len(texts.negative), held_out)
    words = _checked_tokens(tokens)
    options = LoadOptions.of(load, tokenizer=tokenizer, progress=progress)
    with one_model(model, options) as loaded:
        tok = tokenizer_of(loaded)
        token_ids = [single_token(tok, word, "`tokens`:", LEADING_SPACE) for word in words]
        encoded = _encoded(tok, texts, loaded.view)
        states = text_states(loaded.view, encoded, position, batch_size, progress=progress, pad=_pad_id(tok))
        count = len(texts.positive)
        unembedding = loaded.view.W_U[token_ids].detach() if token_ids else None
        return find_directions(
            states[:count],
            states[count:],
            paired=texts.paired,
            held_out=held_out,
            seed=seed,
            unembedding=unembedding,
            tokens=words,
            token_ids=token_ids,
            position=position,
            model=loaded.name,
            source=texts.source,
            model_fingerprint=fingerprint_of(loaded),
            family=loaded.view.family,
            model_hint=loaded.view.family,
        )


def contrast_texts(
    positive: TextSet | None,
    negative: TextSet | None,
    *,
    pairs: PairSet | None = None,
    concept: str | None = None,
    seed: int = 0,
) -> ContrastTexts:
    """The two sets of texts from exactly one source: `positive` and `negative`, `pairs` or
    `concept` (`directions`); UsageError for none, two, or one set without the other."""
    given = [name for name, value in (("positive", positive), ("negative", negative)) if value is not None]
    sources = (bool(given), pairs is not None, concept is not None)
    if sum(sources) != 1:
        raise UsageError(
            "give the texts one way: `positive` and `negative`, or `pairs`, or `concept` "
            f"({'none was given' if not any(sources) else 'several were given'})"
        )
    if concept is not None:
        return concept_texts(concept, seed=seed)
    if pairs is not None:
        found = read_pairs(pairs) if isinstance(pairs, (str, os.PathLike)) else _given_pairs(pairs)
        where = f"pairs {str(pairs)!r}" if isinstance(pairs, (str, os.PathLike)) else "pairs given"
        return ContrastTexts(tuple(p for p, _ in found), tuple(n for _, n in found), True, where)
    if len(given) == 1:
        other = "negative" if given == ["positive"] else "positive"
        raise UsageError(f"`{given[0]}` needs `{other}` beside it (or give `pairs`)")
    assert positive is not None and negative is not None
    sets = [_text_set(value, f"`{name}`") for name, value in (("positive", positive), ("negative", negative))]
    where = " against ".join(
        str(value) if isinstance(value, (str, os.PathLike)) else f"{len(found)} texts"
        for value, found in zip((positive, negative), sets, strict=True)
    )
    return ContrastTexts(sets[0], sets[1], False, where)


def _text_set(value: TextSet, what: str) -> tuple[str, ...]:
    """One set: read from a file, or given as texts (each a non-empty string)."""
    if isinstance(value, (str, os.PathLike)):
        return read_text_set(Path(value), what)
    texts = tuple(value)
    for number, text in enumerate(texts, start=1):
        if not isinstance(text, str) or not text.strip():
            raise UsageError(
                f"{what} text {number} is {'empty' if isinstance(text, str) else 'not a string'}"
            )
    if not texts:
        raise UsageError(f"{what} holds no text")
    return texts


def _given_pairs(pairs: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Pairs given in memory, each two non-empty strings."""
    found = []
    for number, pair in enumerate(pairs, start=1):
        if not (
            isinstance(pair, (tuple, list))
            and len(pair) == 2
            and all(isinstance(t, str) and t.strip() for t in pair)
        ):
            raise UsageError(f"`pairs` item {number} is not two non-empty texts (positive, negative)")
        found.append((pair[0], pair[1]))
    if not found:
        raise UsageError("`pairs` holds no pair")
    return tuple(found)


def _checked_tokens(tokens: Sequence[str]) -> tuple[str, ...]:
    """`tokens` as a tuple of non-empty strings (a lone string is one token, not its letters)."""
    words = (tokens,) if isinstance(tokens, str) else tuple(tokens)
    for word in words:
        if not isinstance(word, str) or not word:
            raise UsageError(f"`tokens` holds {word!r}; allowed: texts of one token each")
    return words


def _pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id that fills a batch past a text's end (never read): the pad token, else 0."""
    pad = tokenizer.pad_token_id
    return int(pad) if isinstance(pad, int) else 0


def _encoded(
    tokenizer: PreTrainedTokenizerBase, texts: ContrastTexts, view: ModelView
) -> list[tuple[Tensor, int]]:
    """(ids, first position the mean reads) of every text, positives first; UsageError naming
    a text longer than the model's context. The first position is 1 when the tokenizer puts a
    BOS token before a text (`data.sampling.prepends_bos`), else 0."""
    every = [*texts.positive, *texts.negative]
    if not every:
        return []
    first = 1 if prepends_bos(tokenizer, "auto") else 0
    found = []
    for index, ids in enumerate(tokenizer(every, add_special_tokens=True)["input_ids"]):
        what, number = (
            ("positive", index + 1)
            if index < len(texts.positive)
            else ("negative", index + 1 - len(texts.positive))
        )
        if view.max_positions is not None and len(ids) > view.max_positions:
            which = f"pair {number}'s {what} text" if texts.paired else f"`{what}` text {number}"
            raise UsageError(
                f"{which} is {len(ids)} tokens, longer than the model's context of "
                f"{view.max_positions} tokens; shorten it"
            )
        if len(ids) <= first:
            raise UsageError(f"`{what}` text {number} encodes to no token")
        found.append((torch.tensor(ids, dtype=torch.long), first))
    return found


def text_states(
    view: ModelView,
    encoded: Sequence[tuple[Tensor, int]],
    position: Position,
    batch_size: int,
    *,
    progress: bool = False,
    pad: int = 0,
) -> Tensor:
    """One state per text and layer, (texts, L+1, d) float32 on the CPU, read as the module
    docstring says from `encoded` ((ids, first position the mean reads) per text)."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    out = torch.empty((len(encoded), view.n_layers + 1, view.d_model), dtype=torch.float32)
    with tqdm(total=len(encoded), desc="directions", unit="text", disable=not progress) as bar:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            lengths = torch.tensor([len(encoded[i][0]) for i in chunk])
            ids = torch.full((len(chunk), int(lengths.max())), pad, dtype=torch.long)
            weights = torch.zeros(ids.shape, dtype=torch.float32)  # "mean": each position's weight
            for row, i in enumerate(chunk):
                text, first = encoded[i]
                ids[row, : len(text)] = text
                weights[row, first : len(text)] = 1.0 / (len(text) - first)
            mask = right_padding_mask(view, lengths.tolist(), ids.shape[1], ids.device)
            states = residual_states(view, ids, mask)  # (L+1, batch, T, d)
            if position == "last":
                rows = torch.arange(len(chunk), device=states.device)
                reduced = states[:, rows, (lengths - 1).to(states.device)].float()
            else:
                reduced = torch.einsum("lbtd,bt->lbd", states.float(), weights.to(states.device))
            out[chunk] = reduced.transpose(0, 1).cpu()
            bar.update(len(chunk))
    return out


def fingerprint_of(loaded: LoadedModel) -> str | None:
    """What identifies the loaded weights: `model_fingerprint` for a Hugging Face model, the
    files' fingerprint of a directory it was loaded from (a resstream run, the reference
    model); None for a model handed over in memory."""
    from resstream.models.evaluation import directory_fingerprint, model_fingerprint

    found = model_fingerprint(loaded)
    if found is None and loaded.where is not None and Path(loaded.where).is_dir():
        return directory_fingerprint(loaded.where)
    return found


def read_direction_file(path: str | os.PathLike[str], loaded: LoadedModel | None = None) -> SavedDirections:
    """The directions file at `path` (`load_directions`), checked against `loaded` when given:
    read from a model of the same fingerprint where both are known, else of the same width and
    depth. UsageError otherwise (a direction of another model steers nothing meaningful)."""
    found = load_directions(path)
    if loaded is None:
        return found
    ours, theirs = fingerprint_of(loaded), found.model_fingerprint
    where = f"directions file {str(path)!r}"
    if ours is not None and theirs is not None and ours != theirs:
        raise UsageError(
            f"{where} was read from model {found.model!r} (fingerprint {theirs}), not from "
            f"{loaded.name!r} (fingerprint {ours}); read the directions from this model"
        )
    view = loaded.view
    if (found.d_model, found.n_layers) != (view.d_model, view.n_layers):
        raise UsageError(
            f"{where} holds directions of width {found.d_model} over {found.n_layers} layers; "
            f"model {loaded.name!r} has width {view.d_model} and {view.n_layers} layers"
        )
    return found


def direction_reader(
    path: str | os.PathLike[str], method: str, loaded: LoadedModel | None = None
) -> Callable[[str], Tensor]:
    """site (``L6.resid``) -> the unit direction of `method` there, from the directions file
    at `path` (`read_direction_file`, checked against `loaded`); UsageError for a method or a
    site the file does not hold."""
    found = read_direction_file(path, loaded)
    check_choice("`method`", method, found.methods)
    return lambda site: found.direction(site, method)


__all__ = [
    "BATCH_SIZE",
    "SavedDirections",
    "contrast_texts",
    "direction_reader",
    "directions",
    "fingerprint_of",
    "load_directions",
    "read_direction_file",
    "text_states",
]
