"""One text and the prediction read in it: the keywords every one-text function shares, and
what they resolve to.

A function that reads one text takes `text` as its first parameter and the rest as one typed
keyword group beside the loading keywords (``**given: Unpack[PredictionArgs]``, shown in
`help()` and the API reference as the keywords they are: `api.inputs.takes_load_args`). The
groups nest, each the one before and one more question: `TextArgs` (``text_file``),
`PositionArgs` (+ ``position``), `TargetArgs` (+ ``target``, ``target_id``), `PredictionArgs`
(+ ``foil``). `TextRequest.of` reads them once, before any model is loaded (the text itself,
from `text_file` when given, or its token ids: `api.texts.TextLike`); `TextRequest.encoded`
reads the text with the loaded model's tokenizer, or checks the ids against the model
(`EncodedText`: its ids and the prediction's position), which resolves the target and the
foil. Token ids need no tokenizer: a model object may come without one
(`TextRequest.load_options`), its tokens then read "<1234>" in the results. Each refusal
names its keyword.

The corpus modes, which take every next token of a corpus sample as a target (`attribute_corpus`,
`routes_corpus`, `faithfulness` with a `dataset`), share one default sample: `prediction_corpus`.
`attribute_corpus` and `routes_corpus` take its keywords as one group too, `CorpusModeArgs`
(``**given: Unpack[CorpusModeArgs]``), whose defaults are declared once (`CORPUS_MODE_DEFAULTS`)
and shown in their signatures; `corpus_mode_request` reads them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from resstream.api.inputs import CorpusRequest, LoadOptions, keyword_defaults, with_defaults
from resstream.api.texts import TextLike, given_ids, text_ids
from resstream.api.tokenizers import single_token
from resstream.checks import check_one_text
from resstream.data.files import read_text
from resstream.data.tokenizer import token_text
from resstream.errors import UsageError
from resstream.models import LoadArgs, LoadedModel

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from resstream.analysis.decoding.decoder import Decoder
    from resstream.capture import Internals


class TextArgs(LoadArgs, total=False):
    """One text's keywords (with the loading ones, `LoadArgs`): ``text_file``, a UTF-8 file
    read instead of `text` (exactly one of the two)."""

    text_file: str | os.PathLike[str] | None


class PositionArgs(TextArgs, total=False):
    """`TextArgs` and the prediction's ``position``: default the last token, negative counts
    from the end."""

    position: int | None


class TargetArgs(PositionArgs, total=False):
    """`PositionArgs` and the predicted token: ``target``, text that is exactly one token, or
    ``target_id``; default the model's own top prediction at the position."""

    target: str | None
    target_id: int | None


class PredictionArgs(TargetArgs, total=False):
    """`TargetArgs` and an optional ``foil``, a second token (one token of text) for a
    target − foil logit difference."""

    foil: str | None


#: The sample of a corpus mode when `num_seqs` or `seq_len` is not given: windows, and tokens
#: per window (clipped to the shortest context among the models). Every position of a window
#: is a prediction, each analysed on its own, so fewer and shorter windows than `shift`'s.
DEFAULT_NUM_SEQS = 16
DEFAULT_SEQ_LEN = 64


class CorpusModeArgs(LoadArgs, total=False):
    """A corpus mode's sample (with the loading keywords, `LoadArgs`): ``num_seqs`` windows
    (None: 16) of ``seq_len`` tokens (None: 64, clipped to the model's context) of ``dataset``
    (default "shakespeare") sampled with ``seed`` (default 0), from ``data_dir`` where given
    (`prediction_corpus`); ``batch_size`` sequences a forward (None: the function's default)."""

    dataset: str
    num_seqs: int | None
    seq_len: int | None
    seed: int
    batch_size: int | None
    data_dir: str | os.PathLike[str] | None


#: `CorpusModeArgs`' defaults other than None, shown in the signatures that take the group.
CORPUS_MODE_DEFAULTS = keyword_defaults(CorpusModeArgs, dataset="shakespeare", seed=0)

#: The keywords of the one-text groups that are not loading keywords, in the order above.
TEXT_KEYWORDS = tuple(name for name in PredictionArgs.__annotations__ if name not in LoadArgs.__annotations__)


@dataclass(frozen=True, eq=False)
class TextRequest:
    """The text a call analyses (read, or its token `ids` (1 × T) as given, checked in form)
    and its prediction as asked (`PredictionArgs`), before any model is loaded; `encoded`
    reads it with a loaded model. `text` is None when ids were given."""

    text: str | None
    position: int | None = None
    target: str | None = None
    target_id: int | None = None
    foil: str | None = None
    ids: torch.Tensor | None = None

    @classmethod
    def of(cls, text: TextLike | None, given: Mapping[str, Any]) -> TextRequest:
        """`text` (a string, or token ids: `api.texts.given_ids`), or the content of `given`'s
        ``text_file``, and the prediction `given` asks for."""
        asked = (given.get("position"), given.get("target"), given.get("target_id"), given.get("foil"))
        if text is None or isinstance(text, str):
            return cls(_text_of(text, given.get("text_file")), *asked)
        if given.get("text_file") is not None:
            raise UsageError("give exactly one of `text` or `text_file`")
        return cls(None, *asked, ids=given_ids(text))

    @property
    def reads_ids(self) -> bool:
        """Whether the text was given as token ids (no tokenizer is needed to read it)."""
        return self.ids is not None

    def load_options(self, load: LoadArgs, **options: Any) -> LoadOptions:
        """The call's `LoadOptions` (`LoadOptions.of` with `options`): with token ids, a model
        object may come without its tokenizer."""
        return LoadOptions.of(load, reads_ids=self.reads_ids, **options)

    def token_ids(self, loaded: LoadedModel) -> torch.Tensor:
        """The text's ids (1 × T) for `loaded` (`api.texts.text_ids`): read by its tokenizer,
        or the ids given, checked against its vocabulary and context."""
        given = self.text if self.ids is None else self.ids
        assert given is not None  # `of`: a text, or its ids
        return text_ids(given, loaded.tokenizer, loaded.view)

    def encoded(self, loaded: LoadedModel) -> EncodedText:
        """The text as `loaded` reads it (`token_ids`: refused when it does not fit the model's
        context), with the prediction's position."""
        ids = self.token_ids(loaded)
        return EncodedText(self, loaded.tokenizer, ids, self._position_in(int(ids.shape[1])))

    def _position_in(self, length: int) -> int:
        """The position whose prediction is analysed in a text of `length` tokens (default the
        last); UsageError outside the text or for a text shorter than 2 tokens."""
        if length < 2:
            raise UsageError(f"the text is {length} token long; at least 2 tokens are needed (a context)")
        position = self.position
        if position is None:
            return length - 1
        where = position + length if position < 0 else position
        if not 0 <= where < length:
            raise UsageError(
                f"`position` {position} is outside the text's {length} tokens; allowed: 0..{length - 1} "
                f"(or -{length}..-1 from the end)"
            )
        return where


@dataclass(frozen=True, eq=False)
class EncodedText:
    """A `TextRequest` read by one model: the text's `ids` (1 × T; a string's with the
    tokenizer's special tokens, given ids as they are), the model's `tokenizer` (None: a model
    given ids without one) and the prediction's `position` (0..T−1)."""

    request: TextRequest
    tokenizer: PreTrainedTokenizerBase | None
    ids: torch.Tensor
    position: int

    def tokens(self) -> tuple[str, ...]:
        """The text's tokens as strings ("<1234>" without a tokenizer: `token_text`)."""
        return tuple(token_text(self.tokenizer, int(t)) for t in self.ids[0])

    def target(self, decoder: Decoder, internals: Internals) -> int:
        """The target token: given as text (`target`), as an id (`target_id`), or the model's
        top prediction at the position (the last block's output through `decoder`)."""
        asked = self.request
        if asked.target is not None and asked.target_id is not None:
            raise UsageError("give `target` or `target_id`, not both")
        vocab = decoder.vocab_size
        if asked.target_id is not None:
            if not 0 <= asked.target_id < vocab:
                raise UsageError(
                    f"`target_id` {asked.target_id} is outside the vocabulary; allowed: 0..{vocab - 1}"
                )
            return asked.target_id
        if asked.target is not None:
            return single_token(
                self._reader("`target`", asked.target, " `target_id`, or"),
                asked.target,
                "`target`",
                " (e.g. with its leading space) or `target_id`",
            )
        final = internals.blocks[-1].block_output[0, self.position]
        with torch.no_grad():
            return int(decoder.logits(final).argmax())

    def foil(self, target: int) -> int | None:
        """The foil's token id (None without a `foil`); refused when it is the `target`."""
        foil = self.request.foil
        if foil is None:
            return None
        foil_id = single_token(self._reader("`foil`", foil), foil, "`foil`")
        if foil_id == target:
            raise UsageError(f"`foil` {foil!r} is the target token itself; give a different token")
        return foil_id

    def _reader(self, label: str, value: str, instead: str = "") -> PreTrainedTokenizerBase:
        """The tokenizer that reads `value`, a token given as text; UsageError without one (a
        model given token ids and no tokenizer), naming `instead`, what else is accepted."""
        if self.tokenizer is None:
            raise UsageError(
                f"{label} {value!r} is text and the model has no tokenizer to read it; give{instead} "
                f"the model's `tokenizer`"
            )
        return self.tokenizer


def prediction_corpus(
    dataset: str,
    num_seqs: int | None,
    seq_len: int | None,
    seed: int,
    data_dir: str | os.PathLike[str] | None,
) -> CorpusRequest:
    """The sample of a corpus mode: `num_seqs` windows (default 16) of `seq_len` tokens (default
    64, clipped to the shortest context) of `dataset` sampled with `seed` (`CorpusRequest`)."""
    count = DEFAULT_NUM_SEQS if num_seqs is None else num_seqs
    return CorpusRequest(dataset, count, seq_len, seed, data_dir, default_seq_len=DEFAULT_SEQ_LEN)


def corpus_mode_request(given: Mapping[str, Any]) -> CorpusRequest:
    """The sample that `given`, a call's `CorpusModeArgs`, asks for (`prediction_corpus`), with
    the group's defaults for the keywords not given."""
    asked = with_defaults(CorpusModeArgs, given)
    return prediction_corpus(
        asked["dataset"], asked["num_seqs"], asked["seq_len"], asked["seed"], asked["data_dir"]
    )


def text_keywords(given: Mapping[str, Any]) -> dict[str, Any]:
    """The one-text keywords among `given` (a call's keywords), in `TEXT_KEYWORDS` order."""
    return {name: given[name] for name in TEXT_KEYWORDS if name in given}


def _text_of(text: str | None, text_file: str | os.PathLike[str] | None) -> str:
    """The text to analyse: `text`, or the content of `text_file`; UsageError unless exactly one
    is given and it holds text (`check_one_text`, as the command line checks it)."""
    check_one_text(text, text_file)
    if text is not None:
        return text
    assert text_file is not None  # check_one_text: exactly one is given
    content = read_text(Path(text_file), "`text_file`", alternative=" or `text`")
    if not content.strip():
        raise UsageError(f"`text_file` {str(text_file)!r} holds no text; give a file with text")
    return content


__all__ = [
    "CORPUS_MODE_DEFAULTS",
    "DEFAULT_NUM_SEQS",
    "DEFAULT_SEQ_LEN",
    "TEXT_KEYWORDS",
    "CorpusModeArgs",
    "EncodedText",
    "PositionArgs",
    "PredictionArgs",
    "TargetArgs",
    "TextArgs",
    "TextRequest",
    "corpus_mode_request",
    "prediction_corpus",
    "text_keywords",
]
