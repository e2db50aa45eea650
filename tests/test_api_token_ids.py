"""Token ids wherever the API takes a text (`api.texts.given_ids` / `text_ids`, read through
`api.prediction.TextRequest`): the same result as from the text they encode, in every form
(1-D, (1, T), int32, a list); a model object without a tokenizer reads them, its tokens named
"<id>"; and each bad form of ids is a one-line UsageError naming what is allowed."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch

import resstream
from resstream.errors import UsageError
from resstream.models import LoadedModel, load_model

TEXT = "The king said that the queen"
CORRUPT = "The queen said that the king"  # as many tokens as TEXT
#: A head, an MLP and a neuron: a few interventions.
FEW = ["L0.H1", "L3.mlp", "L2.N5"]

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def reference() -> LoadedModel:
    return load_model(None, device="cpu")


def ids_of(reference: LoadedModel, text: str) -> torch.Tensor:
    """The ids the reference model's tokenizer reads in `text` (1-D), as the API would."""
    assert reference.tokenizer is not None
    return reference.tokenizer(text, add_special_tokens=True, return_tensors="pt")["input_ids"][0]


def same(a: Any, b: Any) -> bool:
    """Two results' `to_dict()` are equal (as JSON: NaN equal to NaN)."""
    return json.dumps(a.to_dict(), sort_keys=True, default=str) == json.dumps(
        b.to_dict(), sort_keys=True, default=str
    )


FORMS: dict[str, Callable[[torch.Tensor], Any]] = {
    "1-D tensor": lambda ids: ids,
    "(1, T) tensor": lambda ids: ids.unsqueeze(0),
    "int32 tensor": lambda ids: ids.to(torch.int32),
    "list of ints": lambda ids: ids.tolist(),
}


@pytest.mark.parametrize("form", FORMS)
def test_lens_of_ids_in_every_form_is_the_lens_of_their_text(reference, form: str) -> None:
    ids = FORMS[form](ids_of(reference, TEXT))
    assert same(resstream.lens(ids, top_k=2), resstream.lens(TEXT, top_k=2))


CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "attribute": lambda text, corrupt: resstream.attribute(text, top=5),
    "ablate": lambda text, corrupt: resstream.ablate(text, components=FEW, direct=True),
    "patch": lambda text, corrupt: resstream.patch(text, corrupt=corrupt, components=FEW),
    "patch atp": lambda text, corrupt: resstream.patch(text, corrupt=corrupt, atp=True, confirm=2),
    "routes": lambda text, corrupt: resstream.routes(text),
    "decompose": lambda text, corrupt: resstream.decompose(text, position=3),
    "faithfulness": lambda text, corrupt: resstream.faithfulness(text, candidates=4, top_k=3),
}


@pytest.mark.parametrize("call", CALLS)
def test_every_one_text_function_reads_ids_as_their_text(reference, call: str) -> None:
    ids = ids_of(reference, TEXT)
    from_ids = CALLS[call](ids, ids_of(reference, CORRUPT).tolist())
    assert same(from_ids, CALLS[call](TEXT, CORRUPT))


def test_patch_takes_a_text_beside_ids(reference) -> None:
    mixed = resstream.patch(TEXT, corrupt=ids_of(reference, CORRUPT), components=["L1.H0"])
    assert same(mixed, resstream.patch(TEXT, corrupt=CORRUPT, components=["L1.H0"]))


def test_verify_reads_ids_as_their_text(reference) -> None:
    from_ids = resstream.verify(text=ids_of(reference, TEXT)).to_dict()
    from_text = resstream.verify(text=TEXT).to_dict()
    assert from_ids.pop("text") == TEXT == from_text.pop("text")  # the tokens' texts joined
    assert json.dumps(from_ids, sort_keys=True) == json.dumps(from_text, sort_keys=True)


def test_ids_are_used_exactly_as_given(reference) -> None:
    """No special token is added to ids: a prefix of the text's ids is a shorter text."""
    ids = ids_of(reference, TEXT)[:3]
    result = resstream.decompose(ids)
    assert len(result.tokens) == 3 and result.position == 2


def test_a_model_object_without_a_tokenizer_reads_ids(reference) -> None:
    """The numbers are those of the same ids with the tokenizer; every token reads "<id>"."""
    ids = ids_of(reference, TEXT)
    placeholders = tuple(f"<{int(i)}>" for i in ids)
    bare = reference.model
    with pytest.raises(UsageError, match="needs its `tokenizer`"):  # a text still needs one
        resstream.ablate(TEXT, model=bare, components=FEW)
    ablated = resstream.ablate(ids, model=bare, components=FEW)
    named = resstream.ablate(ids, model=reference, components=FEW)
    assert ablated.tokens == placeholders and ablated.target == f"<{ablated.target_id}>"
    assert ablated.effects == named.effects and ablated.clean == named.clean
    patched = resstream.patch(ids, corrupt=ids_of(reference, CORRUPT), model=bare, components=["L1.H0"])
    assert patched.corrupt_tokens == tuple(f"<{int(i)}>" for i in ids_of(reference, CORRUPT))
    assert patched.effects == resstream.patch(TEXT, corrupt=CORRUPT, components=["L1.H0"]).effects
    lens = resstream.lens(ids.tolist(), model=bare, top_k=2)
    assert lens.trajectories == resstream.lens(ids, model=reference, top_k=2).trajectories
    assert lens.token_text(int(ids[0])) == placeholders[0]
    attributed = resstream.attribute(ids, model=bare, top=5, target_id=12)
    assert attributed.target_id == 12 and attributed.tokens == placeholders
    assert resstream.routes(ids, model=bare).tokens == placeholders
    assert resstream.decompose(ids, model=bare).tokens == placeholders
    scored = resstream.faithfulness(ids, model=bare, candidates=4, top_k=3)
    assert scored.tokens == placeholders
    assert resstream.verify(bare, text=ids).text == "".join(placeholders)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda bare, ids: resstream.ablate(ids, model=bare, target=" queen"),
            r"`target` ' queen' is text and the model has no tokenizer to read it; give `target_id`, or the "
            r"model's `tokenizer`",
        ),
        (
            lambda bare, ids: resstream.attribute(ids, model=bare, foil=" king"),
            r"`foil` ' king' is text and the model has no tokenizer to read it; give the model's `tokenizer`",
        ),
        (
            lambda bare, ids: resstream.patch(ids, corrupt=CORRUPT, model=bare),
            r"a model passed as an object \(GPT\) needs its `tokenizer`",
        ),
        (
            lambda bare, ids: resstream.ablate(ids, model=bare, mode="mean", components=["L0.H0"]),
            r"has no tokenizer, and this analysis reads text",
        ),
    ],
)
def test_text_given_to_a_model_without_a_tokenizer_is_refused_naming_what_to_give(
    reference, call, message: str
) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        call(reference.model, ids_of(reference, TEXT))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (
            torch.tensor([1.0, 2.0, 3.0]),
            r"`text` is a tensor of dtype torch\.float32; allowed: a string, or token ids",
        ),
        (torch.tensor([True, False]), r"`text` is a tensor of dtype torch\.bool; allowed:"),
        (
            torch.ones(2, 4, dtype=torch.long),
            r"`text` is a batch of 2 sequences \(shape \(2, 4\)\); allowed: one text, token ids of shape "
            r"\(T,\) or \(1, T\)",
        ),
        (torch.ones(1, 1, 4, dtype=torch.long), r"`text` is a tensor of shape \(1, 1, 4\); allowed:"),
        (torch.zeros(0, dtype=torch.long), r"`text` holds no token ids; give at least one"),
        ([], r"`text` holds no token ids; give at least one"),
        ([5, "6", 7], r"`text` item 1 is '6' \(str\); allowed: a string, or token ids"),
        ([5, 6.0], r"`text` item 1 is 6\.0 \(float\); allowed:"),
        ([5, True], r"`text` item 1 is True \(bool\); allowed:"),
        (range(3), r"`text` is a range; allowed: a string, or token ids"),
        ([5, 4096, 7], r"`text` holds token id 4096, outside the model's vocabulary; allowed: 0\.\.4095"),
        (
            torch.tensor([5, -1]),
            r"`text` holds token id -1, outside the model's vocabulary; allowed: 0\.\.4095",
        ),
        (
            [5] * 129,
            r"`text` \(129 tokens\) is longer than the model's context of 128 tokens; allowed: 2\.\.128",
        ),
        ([5], r"the text is 1 token long; at least 2 tokens are needed"),
    ],
)
def test_bad_ids_are_one_line_usage_errors(ids: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        resstream.ablate(ids, components=["L0.H0"])
    assert "\n" not in str(caught.value)


def test_the_other_texts_name_themselves_in_their_refusals(reference) -> None:
    ids = ids_of(reference, TEXT)
    with pytest.raises(UsageError, match=r"`corrupt` is a tensor of dtype torch\.float64"):
        resstream.patch(ids, corrupt=torch.zeros(6, dtype=torch.float64))
    with pytest.raises(UsageError, match=r"`corrupt` holds token id 9999, outside the model's vocabulary"):
        resstream.patch(ids, corrupt=[9999] * 6)
    with pytest.raises(UsageError, match=r"give exactly one of `text` or `text_file`"):
        resstream.lens(ids, text_file="passage.txt")
    with pytest.raises(UsageError, match=r"`text` holds token id 4096"):
        resstream.verify(text=[4096, 1])
    with pytest.raises(UsageError, match=r"`text` is a batch of 3 sequences"):
        resstream.lens(torch.ones(3, 2, dtype=torch.long))


def test_generate_and_steer_take_prompts_as_ids() -> None:
    """A prompt given as ids generates what its text generates; a model without a tokenizer
    generates from ids alone, its texts read "<id>"; a (N, T) tensor is N prompts."""
    from tests.test_models_adapters import char_tokenizer, tiny_model

    model, reader = tiny_model("gpt2"), char_tokenizer()
    ids = reader("Hello", add_special_tokens=True, return_tensors="pt")["input_ids"][0]
    args = {"max_new_tokens": 4}
    from_text = resstream.generate(model, ["Hello", "Hi"], tokenizer=reader, **args).continuations
    mixed = resstream.generate(model, [ids, "Hi"], tokenizer=reader, **args).continuations
    assert [(c.prompt_ids, c.steered_ids, c.steered) for c in mixed] == [
        (c.prompt_ids, c.steered_ids, c.steered) for c in from_text
    ]
    assert mixed[0].prompt == reader.decode(ids.tolist()) and mixed[1].prompt == "Hi"
    bare = resstream.generate(model, ids.tolist(), **args).continuations[0]
    assert bare.steered_ids == from_text[0].steered_ids
    assert bare.prompt == "".join(f"<{int(i)}>" for i in ids)
    assert bare.steered == "".join(f"<{i}>" for i in bare.steered_ids)
    assert len(resstream.generate(model, torch.stack([ids, ids]), **args).continuations) == 2
    sweep = {
        "directions": {"L1.resid": torch.ones(model.config.n_embd)},
        "coefs": [0, 8],
        "max_new_tokens": 2,
    }
    steered = resstream.steer(model, prompts=[ids], **sweep)
    named = resstream.steer(model, prompts=["Hello"], tokenizer=reader, **sweep)
    assert [(p.kl, p.perplexity, p.changed) for p in steered.points] == [
        (p.kl, p.perplexity, p.changed) for p in named.points
    ]
    assert steered.settings["prompts"] == [ids.tolist()] and steered.points[0].example.startswith("<")
    with pytest.raises(UsageError, match=r"`prompts` item 1 is a tensor of dtype torch\.float32"):
        resstream.generate(model, [ids, torch.zeros(3)], **args)
    with pytest.raises(UsageError, match=r"needs its `tokenizer`"):  # a prompt as text
        resstream.generate(model, ["Hi", ids], **args)
    with pytest.raises(UsageError, match=r"needs its `tokenizer`"):  # a concept token is text
        resstream.steer(model, prompts=[ids], concept_tokens=["a"], **sweep)
