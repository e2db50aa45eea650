"""`resstream.generate(...)`: continuations of prompts under edits, beside the unedited ones.

Every prompt is generated twice with the same sampling rule and seed: under the edits
(`resstream.stream.edited`: the hooks act on every forward the generation runs, the KV
cache's one-token steps included) and without them. `where` says which positions an edit
without positions of its own acts at: "all" (every position), "prompt" (the prompt's only) or
"new" (the generated ones only). Prompts of the same length run together (no padding, so a
batch generates exactly what each prompt alone would); the model's context is checked for
the longest prompt before anything runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Unpack

import torch
from torch import Tensor
from tqdm.auto import tqdm

from resstream.analysis.steering.continuations import Continuation, GenerationResult
from resstream.analysis.steering.generation import Sampling, check_room, generate_ids
from resstream.api.inputs import LoadOptions, one_model, takes_load_args
from resstream.api.texts import TextsLike, text_ids, text_list
from resstream.data.tokenizer import decoded_text
from resstream.errors import UsageError
from resstream.models import LoadArgs, ModelLike, ModelView
from resstream.stream.edited import edited
from resstream.stream.edits import StreamEdit, resolve

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Where = Literal["all", "prompt", "new"]
WHERES = ("all", "prompt", "new")
#: Prompts generated together, at most.
DEFAULT_BATCH = 8


@takes_load_args
def generate(
    model: ModelLike = None,
    prompts: TextsLike = "",
    *,
    edits: StreamEdit | Sequence[StreamEdit] = (),
    where: Where = "all",
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    use_cache: bool = True,
    compare: bool = True,
    batch_size: int = DEFAULT_BATCH,
    tokenizer: PreTrainedTokenizerBase | None = None,
    progress: bool = False,
    **load: Unpack[LoadArgs],
) -> GenerationResult:
    """Continue every prompt under `edits` (and, with `compare`, without them) (module docstring).

    `model`: a spec (loaded with `dtype`, `device`, …; None: the built-in reference model) or
    a model in memory with its `tokenizer`. `prompts`: one prompt or a list of them, each a
    string or token ids (a 1-D integer tensor, a (1, T) tensor or a list of ints, used exactly
    as given; a (N, T) tensor is N prompts); with ids only, a model object needs no
    `tokenizer` (a continuation's text then reads "<1234>" per token). `edits`:
    `resstream.Add`, `Scale`, `Set`, `Clamp`, `Project`, `Apply` on the component grammar.
    Sampling: greedy with `temperature` 0,
    else softmax(logits / temperature) cut to `top_p`, seeded by `seed`; `use_cache`: Hugging
    Face models generate with their KV cache. `progress`: a bar over the prompts (and while a
    spec loads). UsageError, before anything runs, for an edit the
    model does not have (a site, a vector's width, a coefficient that is not finite), a prompt
    and `max_new_tokens` over the context, or a bad setting."""
    sampling = Sampling(max_new_tokens, temperature, top_p, seed, use_cache)
    sampling.check()
    listed = text_list(prompts, "prompts", "`prompts`: give one or more non-empty prompts")
    if where not in WHERES:
        raise UsageError(f"`where` {where!r}; allowed: {', '.join(WHERES)}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise UsageError(f"`batch_size` {batch_size!r}; allowed: an int >= 1")
    ids_only = not any(isinstance(prompt, str) for prompt in listed)
    options = LoadOptions.of(load, tokenizer=tokenizer, progress=progress, reads_ids=ids_only)
    with one_model(model, options) as loaded:
        view, reader = loaded.view, loaded.tokenizer
        resolved = resolve(edits, view)  # every edit checked before anything runs
        encoded = [
            text_ids(prompt, reader, view, f"`prompts` item {number}")[0]
            for number, prompt in enumerate(listed)
        ]
        check_room(view, max(len(ids) for ids in encoded), sampling)
        eos = end_of_text(view, reader)
        with tqdm(total=len(encoded), desc="generate", unit="prompt", disable=not progress) as bar:
            found = generate_all(
                view, encoded, list(_listed(edits)), where, sampling, compare, batch_size, eos, bar.update
            )
        continuations = tuple(
            _continuation(
                prompt if isinstance(prompt, str) else decoded_text(reader, ids), ids, found[i], reader, eos
            )
            for i, (prompt, ids) in enumerate(zip(listed, encoded, strict=True))
        )
        return GenerationResult(
            model=loaded.name,
            continuations=continuations,
            edits=tuple(edit_record(each.edit) for each in resolved),
            sampling=dataclasses.asdict(sampling),
            where=where,
        )


def end_of_text(view: ModelView, reader: Any) -> int | None:
    """The token that ends a continuation: the tokenizer's end-of-text token, else (also
    without a tokenizer, None) the first of the model's generation config (None: nothing
    stops a continuation early)."""
    if isinstance(getattr(reader, "eos_token_id", None), int):
        return int(reader.eos_token_id)
    config = getattr(view.model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return int(eos) if isinstance(eos, int) else None


def _listed(edits: StreamEdit | Sequence[StreamEdit]) -> Sequence[StreamEdit]:
    return [edits] if isinstance(edits, StreamEdit) else edits


def placed(edits: Sequence[StreamEdit], where: Where, prompt: int, new: int) -> list[StreamEdit]:
    """The edits with `where`'s positions given to those that have none of their own (a
    prompt of `prompt` tokens and `new` new ones)."""
    if where == "all":
        return list(edits)
    span = range(0, prompt) if where == "prompt" else range(prompt, prompt + new)
    return [
        dataclasses.replace(e, positions=list(span))  # type: ignore[call-arg]
        if getattr(e, "positions", None) is None and "@" not in e.name
        else e
        for e in edits
    ]


def generate_all(
    view: ModelView,
    encoded: list[Tensor],
    edits: list[StreamEdit],
    where: Where,
    sampling: Sampling,
    compare: bool,
    batch_size: int,
    eos: int | None,
    done: Callable[[int], object] | None = None,
) -> dict[int, tuple[Tensor, Tensor | None]]:
    """Each prompt's (steered, unsteered) generated ids, prompts of one length batched."""
    by_length: dict[int, list[int]] = {}
    for index, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(index)
    device = view.W_E.device if view.W_E.device.type != "meta" else torch.device("cpu")
    found: dict[int, tuple[Tensor, Tensor | None]] = {}
    for length, indices in by_length.items():
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            batch = torch.stack([encoded[i] for i in chunk]).to(device)
            plain = generate_ids(view, batch, sampling, eos) if compare else None
            with edited(view, placed(edits, where, length, sampling.max_new_tokens)):
                steered = generate_ids(view, batch, sampling, eos)
            for row, index in enumerate(chunk):
                found[index] = (steered[row].cpu(), None if plain is None else plain[row].cpu())
            if done is not None:
                done(len(chunk))
    return found


def _continuation(
    prompt: str, ids: Tensor, found: tuple[Tensor, Tensor | None], reader: Any, eos: int | None
) -> Continuation:
    steered, plain = found
    steered_ids = new_tokens(steered, len(ids), eos)
    plain_ids = None if plain is None else new_tokens(plain, len(ids), eos)
    return Continuation(
        prompt=prompt,
        prompt_ids=tuple(ids.tolist()),
        steered=decoded_text(reader, steered_ids),
        steered_ids=steered_ids,
        unsteered=None if plain_ids is None else decoded_text(reader, plain_ids),
        unsteered_ids=plain_ids,
    )


def new_tokens(row: Tensor, prompt: int, eos: int | None) -> tuple[int, ...]:
    """The new tokens of a generated row after its `prompt` tokens, up to and with the first
    end-of-text token."""
    new = [int(t) for t in row[prompt:].tolist()]
    return tuple(new[: new.index(eos) + 1] if eos is not None and eos in new else new)


def edit_record(edit: StreamEdit) -> dict[str, Any]:
    """An edit as JSON: its operation, site, positions, and its numbers (a tensor by its
    shape and norm; a function by its name)."""
    record: dict[str, Any] = {"label": edit.label(), "operation": type(edit).__name__.lower()}
    for item in dataclasses.fields(edit):
        value = getattr(edit, item.name)
        if isinstance(value, Tensor):
            record[item.name] = {"shape": list(value.shape), "norm": float(value.double().norm())}
        elif callable(value):
            record[item.name] = getattr(value, "__name__", type(value).__name__)
        elif isinstance(value, (range, tuple)):
            record[item.name] = list(value)
        else:
            record[item.name] = value
    return record


__all__ = [
    "DEFAULT_BATCH",
    "WHERES",
    "edit_record",
    "end_of_text",
    "generate",
    "generate_all",
    "new_tokens",
    "placed",
]
