"""`resstream.lens(...)`: the decoding trajectory of one text, layer by layer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

from resstream.analysis.shift.lens import LensResult, trajectories
from resstream.api.decoders import DecoderLike, decoder_spec
from resstream.api.inputs import check_top_k, one_model, takes_load_args
from resstream.api.prediction import TextArgs, TextRequest
from resstream.api.texts import TextLike
from resstream.capture import residual_states
from resstream.data.tokenizer import token_text
from resstream.errors import UsageError
from resstream.models import ModelLike

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@takes_load_args
def lens(
    text: TextLike | None = None,
    *,
    model: ModelLike = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    positions: range | slice | None = None,
    top_k: int = 1,
    decoder: DecoderLike = "logit-lens",
    ranks: bool = True,
    probabilities: bool = True,
    progress: bool = False,
    **given: Unpack[TextArgs],
) -> LensResult:
    """What every layer's residual state decodes to, position by position, in `text` (or in
    the UTF-8 file `text_file`: exactly one of the two).

    `text`: a string, or token ids (a 1-D integer tensor, a (1, T) tensor or a list of ints,
    used exactly as given: no special tokens added; a model object then needs no `tokenizer`,
    and tokens without one read "<1234>"). `model` is a spec (loaded with `dtype`, `device`,
    `device_map`, `trust_remote_code`) or a model in memory with its `tokenizer`, as for
    `resstream.shift`; `positions` a range or slice of token positions (a slice may leave its
    end open); `decoder` "logit-lens", "embedding", "tuned:DIR" (the directory of a lens
    trained for this model by `resstream.tune_lens`) or a loaded lens.

    Returns a `LensResult`: per position (`trajectories`) and layer 0..L (0 = embedding),
    the exact top-`top_k` token ids (`top_ids`) with their probabilities (`top_probs`, the
    softmax of the decoder's scores), and the ranks and probabilities of the input token
    (`input_ranks`, `input_probs`) and of the next token (`next_ranks`, `next_probs`).
    `token_text(id)` gives the text of every token it mentions; `to_dict()` the content of
    lens.json. `ranks` False leaves out the input and next token's ranks and probabilities,
    `probabilities` False every probability: each layer then costs less (with both off, one
    unembedding matmul and an exact top-k: what the peers' logit lens computes).
    """
    asked = TextRequest.of(text, given)
    spec = decoder_spec(decoder)
    options = asked.load_options(given, tokenizer=tokenizer, progress=progress)
    with one_model(model, options) as loaded:
        view, tokenizer = loaded.view, loaded.tokenizer
        ids = asked.token_ids(loaded)
        check_top_k(top_k, view.W_U.shape[0])
        chosen = _position_range(positions, ids.shape[1])
        states = residual_states(view, ids.to(view.W_E.device))[:, 0]
        return trajectories(
            states,
            ids[0],
            spec.build(view).exact(low_precision=None),
            top_k=top_k,
            positions=chosen,
            model=loaded.name,
            token_text=lambda token: token_text(tokenizer, token),
            ranks=ranks,
            probabilities=probabilities,
        )


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
