"""The tokenizer an analysis needs, taken from its `LoadedModel` once.

`LoadedModel.tokenizer` is None only for a model wrapped for an analysis of the weights alone
(`as_loaded(..., needs_tokenizer=False)`) or a `LoadedModel` built without one; an analysis
that reads text asks `tokenizer_of`, one that samples a corpus `fast_tokenizer_of`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resstream.data.tokenizer import check_fast
from resstream.errors import UsageError
from resstream.models import LoadedModel

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

#: The hint of a one-token refusal for text that may lack its leading space.
LEADING_SPACE = " (e.g. with its leading space)"


def tokenizer_of(loaded: LoadedModel) -> PreTrainedTokenizerBase:
    """The tokenizer of a model whose analysis reads text. Every model has one (`as_loaded`
    refuses a model object without it) unless it was wrapped for an analysis of the weights
    alone, or is a `LoadedModel` built without one: UsageError."""
    if loaded.tokenizer is None:
        raise UsageError(
            f"model {loaded.name!r} has no tokenizer, and this analysis reads text; "
            f"pass the model with its tokenizer"
        )
    return loaded.tokenizer


def fast_tokenizer_of(loaded: LoadedModel) -> PreTrainedTokenizerFast:
    """The tokenizer of a model whose analysis samples a corpus (`tokenizer_of`), which must be
    a fast (Rust) one: the corpus is tokenized through its backend. UsageError if not."""
    return check_fast(tokenizer_of(loaded), f"the tokenizer of model {loaded.name!r}")


def single_token(tokenizer: PreTrainedTokenizerBase, text: str, label: str, hint: str = "") -> int:
    """The id of `text`, which must be exactly one token of `tokenizer` (without special
    tokens); UsageError otherwise, starting with `label` (how the caller names the value, e.g.
    ```target```) and ending with `hint` (what else the caller accepts)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        pieces = " + ".join(repr(tokenizer.decode([i])) for i in ids) or "no tokens"
        raise UsageError(
            f"{label} {text!r} is {len(ids)} tokens ({pieces}); give text that is one token{hint}"
        )
    return int(ids[0])
