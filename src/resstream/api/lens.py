"""`resstream.lens(...)`: the decoding trajectory of one text, layer by layer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from resstream.analysis.decoding import DecoderKind, decoder_of
from resstream.analysis.lens import LensResult, trajectories
from resstream.api.inputs import LoadOptions, check_length, check_top_k, one_model
from resstream.capture import residual_states
from resstream.data.files import read_text, tokenizer_pieces
from resstream.data.tokenizer import token_text
from resstream.errors import UsageError
from resstream.models import ModelLike, ModelView

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


def lens(
    text: str | None = None,
    *,
    text_file: str | os.PathLike[str] | None = None,
    model: ModelLike = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    positions: range | slice | None = None,
    top_k: int = 1,
    decoder: DecoderKind = "logit-lens",
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = None,
    trust_remote_code: bool = False,
    progress: bool = True,
) -> LensResult:
    """What every layer's residual state decodes to, position by position, in `text` (or in
    the UTF-8 file `text_file`: exactly one of the two).

    `model` is a spec (loaded with `dtype`, `device`, `device_map`, `trust_remote_code`) or
    a model in memory with its `tokenizer`, as for `resstream.shift`; `positions` a range or
    slice of token positions (a slice may leave its end open); `decoder` "logit-lens" or
    "embedding".

    Returns a `LensResult`: per position (`trajectories`) and layer 0..L (0 = embedding),
    the exact top-`top_k` token ids (`top_ids`) with their probabilities (`top_probs`, the
    softmax of the decoder's scores), and the ranks and probabilities of the input token
    (`input_ranks`, `input_probs`) and of the next token (`next_ranks`, `next_probs`).
    `token_text(id)` gives the text of every token it mentions; `to_dict()` the content of
    lens.json.
    """
    text = _the_text(text, text_file)
    options = LoadOptions(tokenizer, dtype, device, device_map, trust_remote_code, progress)
    with one_model(model, options) as loaded:
        view = loaded.view
        ids = _encode(loaded.tokenizer, text, view)
        check_top_k(top_k, view.W_U.shape[0])
        chosen = _position_range(positions, ids.shape[1])
        states = residual_states(view, ids.to(view.W_E.device))[:, 0]
        return trajectories(
            states,
            ids[0],
            decoder_of(view, decoder).exact(),
            top_k=top_k,
            positions=chosen,
            model=loaded.name,
            token_text=lambda token: token_text(loaded.tokenizer, token),
        )


def _encode(tokenizer: PreTrainedTokenizerBase, text: str, view: ModelView) -> torch.Tensor:
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


def _the_text(text: str | None, text_file: str | os.PathLike[str] | None) -> str:
    """The text to decode: `text`, or the content of `text_file`; UsageError unless exactly one
    is given and it holds text."""
    if (text is None) == (text_file is None):
        raise UsageError("give exactly one of `text` or `text_file`")
    if text_file is None:
        if not text.strip():
            raise UsageError("`text` is empty")
        return text
    content = read_text(Path(text_file), "`text_file`", alternative=" or `text`")
    if not content.strip():
        raise UsageError(f"`text_file` {str(text_file)!r} holds no text; give a file with the text to decode")
    return content


def _position_range(positions: range | slice | None, length: int) -> range | None:
    """A non-empty range inside 0..length (a slice's missing stop: the end); UsageError if not."""
    if positions is None:
        return None
    if positions.step not in (None, 1):
        raise UsageError(
            f"`positions` with step {positions.step} is not allowed; allowed: consecutive positions A:B"
        )
    start = positions.start or 0
    stop = length if positions.stop is None else positions.stop
    if start < 0 or stop > length or stop <= start:
        raise UsageError(
            f"`positions` {start}:{stop} is outside the text's 0:{length} tokens; "
            f"allowed: A:B with 0 <= A < B <= {length}"
        )
    return range(start, stop)
