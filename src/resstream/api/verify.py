"""`resstream.verify(...)`: the proof, for one checkpoint, that resstream sees exactly what the
model computes (the checks: `resstream.analysis.verification`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

import torch
from torch import Tensor

from resstream.analysis.verification import TOLERANCES, Projected, Reference, VerifyResult, verification
from resstream.api.inputs import LoadOptions, one_model, takes_load_args_on_one_device
from resstream.api.texts import TextLike, given_ids, text_ids
from resstream.capture import block_internals, record, residual_states, run_forward
from resstream.checks import verify_dtype
from resstream.data.tokenizer import token_text
from resstream.errors import UsageError
from resstream.models import LoadArgs, ModelLike, ModelView, is_spec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from resstream.training.model import GPT

#: The text verified when none is given: one plain English sentence (~20 tokens).
DEFAULT_TEXT = (
    "The old lighthouse keeper climbed the narrow stairs every evening to light the great lamp "
    "for the passing ships."
)


@takes_load_args_on_one_device
def verify(
    model: ModelLike = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    text: TextLike | None = None,
    progress: bool = False,
    **load: Unpack[LoadArgs],
) -> VerifyResult:
    """Check, on one `text` (default `DEFAULT_TEXT`), that resstream's view of `model` sees
    exactly what the model computes: the last position's logits, every layer's residual
    state, the exact decomposition of every state, the logit lens's top-1 tokens and, for a
    mixture of experts, the routed experts (`resstream.analysis.verification`).

    `model` is a spec (loaded with `dtype` "float32" — also for "auto" — or "bfloat16",
    `device` and `trust_remote_code`; None: the built-in reference model) or a model in memory
    with its `tokenizer`, checked in its own dtype (float32 or bfloat16). A Hugging Face
    model is compared with its own forward (`output_hidden_states`, its output layer,
    `output_router_logits`); resstream's own GPT with its `forward` and `hidden_states`.

    `text` may also be token ids (a 1-D integer tensor, a (1, T) tensor or a list of ints,
    used exactly as given; a model object then needs no `tokenizer`); the result's `text` is
    then their tokens' texts joined ("<1234>" for each token without a tokenizer).

    Returns a `VerifyResult`: every figure, the tolerances of the dtype, a verdict per check
    and `passed`. UsageError for an empty text, another dtype or an unsupported model.
    """
    if isinstance(text, str) and not text.strip():
        raise UsageError("`text` is empty")
    given = None if text is None or isinstance(text, str) else given_ids(text)
    options = LoadOptions.of(
        _float32_by_default(model, load), tokenizer=tokenizer, progress=progress, reads_ids=given is not None
    )
    with one_model(model, options) as loaded:
        _check_dtype(loaded.dtype)
        view = loaded.view
        if given is None:
            chosen = text if isinstance(text, str) else DEFAULT_TEXT
            ids = text_ids(chosen, loaded.tokenizer, view)
        else:
            ids = text_ids(given, loaded.tokenizer, view)
            chosen = "".join(token_text(loaded.tokenizer, int(t)) for t in ids[0])
        ids = ids.to(view.W_E.device)
        states = residual_states(view, ids)[:, 0]
        internals = block_internals(view, ids)
        return verification(
            view,
            states,
            internals,
            own_forward(view, ids),
            model=loaded.name,
            dtype=loaded.dtype,
            device=loaded.device,
            text=chosen,
            projected=projection_outputs(view, ids),
        )


def _float32_by_default(model: ModelLike, load: LoadArgs) -> LoadArgs:
    """`load` with the dtype verify loads a spec in: float32 unless "bfloat16" is asked for
    ("auto" too is float32: the tolerances are per dtype); UsageError for another."""
    if not is_spec(model):
        return load
    dtype = load.get("dtype", "auto")
    return {**load, "dtype": verify_dtype(dtype)}


def _check_dtype(dtype: str) -> None:
    """UsageError for a model in memory in a dtype verify has no tolerances for."""
    if dtype not in TOLERANCES:
        raise UsageError(
            f"the model is in {dtype}, for which verify has no tolerances; allowed: "
            f"{', '.join(TOLERANCES)} (cast the model first)"
        )


def projection_outputs(view: ModelView, ids: Tensor) -> Projected:
    """The outputs (sequence 0) of every block's query, key and value projections
    (`BlockView.qkv_columns`) in one forward of the model, by module."""
    modules = {
        id(module): module
        for block in view.blocks
        if block.qkv_columns is not None
        for module in (block.qkv_columns(which, 0)[0] for which in ("q", "k", "v"))
    }
    with record(list(modules.values())) as seen, torch.inference_mode():
        run_forward(view, ids)
    outputs = {key: seen[str(i)][0][0] for i, key in enumerate(modules)}
    return lambda module: outputs.get(id(module))


def own_forward(view: ModelView, ids: Tensor) -> Reference:
    """What the model computes for `ids` (1, T) by its own forward: a Hugging Face model's
    logits, hidden states, output layer and router logits, or resstream's GPT's logits and
    `hidden_states`; UsageError for a model that is neither."""
    from transformers import PreTrainedModel

    from resstream.training.model import GPT

    model = view.model
    if isinstance(model, GPT):
        return _gpt_forward(model, ids)
    if isinstance(model, PreTrainedModel):
        return _hf_forward(model, ids, routed=any(block.experts is not None for block in view.blocks))
    raise UsageError(
        f"verify compares with a Hugging Face model's or resstream's own forward; "
        f"a {type(model).__name__} has neither"
    )


def _hf_forward(model: PreTrainedModel, ids: Tensor, *, routed: bool) -> Reference:
    """A Hugging Face causal LM's own outputs: `output_hidden_states` (and `output_router_logits`
    for a mixture of experts) and `get_output_embeddings()` as the output layer."""
    extra = {"output_router_logits": True} if routed else {}
    with torch.inference_mode():
        out = model(input_ids=ids, output_hidden_states=True, **extra)
    router = getattr(out, "router_logits", None) if routed else None
    return Reference(
        source="Hugging Face forward (output_hidden_states" + (", output_router_logits)" if routed else ")"),
        logits=out.logits[0],
        hidden_states=tuple(h[0] for h in out.hidden_states),
        head=model.get_output_embeddings(),
        router_logits=None if router is None else tuple(router),
    )


def _gpt_forward(model: GPT, ids: Tensor) -> Reference:
    """resstream's GPT: its logits (`forward`), its states h_0..h_L (`hidden_states`) and its
    unembedding (tied to the token embedding) as the output layer."""
    with torch.inference_mode():
        logits, _ = model(ids)
        states = model.hidden_states(ids)
    unembedding = model.W_U.detach()
    return Reference(
        source="resstream GPT (forward, hidden_states)",
        logits=logits[0],
        hidden_states=tuple(h[0] for h in states),
        head=lambda x: torch.nn.functional.linear(x, unembedding),
    )


__all__ = ["DEFAULT_TEXT", "VerifyResult", "own_forward", "verify"]
