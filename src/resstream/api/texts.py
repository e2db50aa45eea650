"""A text as the API takes it, a string or its token ids, and the one place either becomes the
ids a model reads.

A function that reads a text takes a `TextLike`: a string (read by the model's tokenizer,
`encode_text`) or token ids used exactly as given, no special tokens added (`given_ids`: a 1-D
integer tensor, a (1, T) tensor or a list of ints, checked in form before any model is loaded).
`text_ids` turns either into the (1 × T) ids of a loaded model, the ids checked against its
vocabulary and context; without a tokenizer only ids can be read. The list functions
(`generate`'s and `steer`'s prompts) take several (`TextsLike`, `text_list`). One-text functions
read theirs through `resstream.api.prediction.TextRequest`, which calls these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from resstream.api.inputs import check_length
from resstream.data.files import tokenizer_pieces
from resstream.errors import UsageError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from resstream.models import ModelView

#: A text as the API takes it: a string, or its token ids, used exactly as given (no special
#: tokens added): a 1-D integer tensor, a (1, T) one, or a list of ints (`given_ids`).
TextLike = str | torch.Tensor | Sequence[int]
#: The forms of token ids, in words, for messages.
IDS_ALLOWED = "a string, or token ids: an integer tensor of shape (T,) or (1, T), or a list of ints"


def given_ids(ids: torch.Tensor | Sequence[int], name: str = "`text`") -> torch.Tensor:
    """Token ids given for a text, as a (1, T) int64 tensor on the CPU, checked before any
    model is loaded: an integer tensor of shape (T,) or (1, T) (one text: a batch of several
    rows is refused), or a list of ints; at least one id. `name` names the value in each
    one-line UsageError. Which ids the model has is checked once it is loaded (`text_ids`)."""
    if isinstance(ids, torch.Tensor):
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise UsageError(f"{name} is a tensor of dtype {ids.dtype}; allowed: {IDS_ALLOWED}")
        if ids.ndim == 2 and ids.shape[0] != 1:
            raise UsageError(
                f"{name} is a batch of {ids.shape[0]} sequences (shape {tuple(ids.shape)}); allowed: one "
                f"text, token ids of shape (T,) or (1, T) (one call per text)"
            )
        if ids.ndim not in (1, 2):
            raise UsageError(f"{name} is a tensor of shape {tuple(ids.shape)}; allowed: {IDS_ALLOWED}")
        row = ids.detach().reshape(1, -1).to("cpu", torch.long)
    elif isinstance(ids, (list, tuple)):
        for number, item in enumerate(ids):
            if isinstance(item, bool) or not isinstance(item, int):
                raise UsageError(
                    f"{name} item {number} is {item!r} ({type(item).__name__}); allowed: {IDS_ALLOWED}"
                )
        row = torch.tensor([list(ids)], dtype=torch.long).reshape(1, -1)
    else:
        raise UsageError(f"{name} is a {type(ids).__name__}; allowed: {IDS_ALLOWED}")
    if row.shape[1] == 0:
        raise UsageError(f"{name} holds no token ids; give at least one")
    return row


#: Several texts as the list functions take them (`generate`'s and `steer`'s prompts): one
#: `TextLike`, a list of them, or a (N, T) integer tensor of N texts (`text_list`).
TextsLike = TextLike | Sequence[TextLike]


def text_list(texts: TextsLike, name: str, empty: str) -> list[str | torch.Tensor]:
    """The texts of a list function's `texts`, each a non-empty string or its ids as a (1, T)
    tensor (`given_ids`, its refusals naming "`name` item i"), checked before any model is
    loaded: one string, one text's ids (a tensor (T,) or (1, T), or a list of ints), a list of
    either, or a (N, T) tensor of N texts. UsageError `empty` for no text or an empty string."""
    if isinstance(texts, torch.Tensor):
        listed: list[Any] = list(texts) if texts.ndim == 2 else [texts]
    elif isinstance(texts, str) or (
        isinstance(texts, (list, tuple)) and texts and all(isinstance(t, int) for t in texts)
    ):
        listed = [texts]
    else:
        listed = list(texts)
    found: list[str | torch.Tensor] = []
    for number, text in enumerate(listed):
        if isinstance(text, str):
            if not text:
                raise UsageError(empty)
            found.append(text)
        else:
            found.append(given_ids(text, f"`{name}` item {number}"))
    if not found:
        raise UsageError(empty)
    return found


def text_ids(
    text: str | torch.Tensor, tokenizer: PreTrainedTokenizerBase | None, view: ModelView, name: str = "`text`"
) -> torch.Tensor:
    """The ids (1 × T) a model reads for `text`, the one place every text becomes ids: a string
    read by `tokenizer` (`encode_text`; UsageError without one), or ids (`given_ids`'s
    (1, T) tensor) used exactly as given, each inside the model's vocabulary (the rows of its
    embedding) and all of them inside its context. `name` names the value in messages."""
    if isinstance(text, str):
        if tokenizer is None:
            raise UsageError(
                f"{name} is text and the model has no tokenizer to read it; give token ids, or pass "
                f"the model's `tokenizer`"
            )
        return encode_text(tokenizer, text, view)
    vocab = int(view.W_E.shape[0])
    low, high = int(text.min()), int(text.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise UsageError(
            f"{name} holds token id {bad}, outside the model's vocabulary; allowed: 0..{vocab - 1}"
        )
    check_length(int(text.shape[1]), view, name + " ({n} tokens)")
    return text


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str, view: ModelView) -> torch.Tensor:
    """The text's ids (1 x T, with the tokenizer's special tokens); UsageError when they do not
    fit the model's context. A long text is counted piece by piece first and refused once it
    overflows, so a huge file costs the memory of one piece, not of all its tokens."""
    if view.max_positions is not None:
        count = 0
        for piece in tokenizer_pieces(text):
            count += len(tokenizer(piece, add_special_tokens=False)["input_ids"])
            if count > view.max_positions:
                check_length(count, view, "the text (at least {n} tokens)")
    ids = tokenizer(text, add_special_tokens=True, return_tensors="pt")["input_ids"]
    check_length(ids.shape[1], view, "the text ({n} tokens)")
    return ids


__all__ = [
    "IDS_ALLOWED",
    "TextLike",
    "TextsLike",
    "encode_text",
    "given_ids",
    "text_ids",
    "text_list",
]
