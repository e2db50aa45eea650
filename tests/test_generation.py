"""Generation under edits: the sampling rule against hand computations, resstream's own loop
against Hugging Face's `generate`, `resstream.generate`'s positions ("prompt", "new") and its
refusals, and the `--edit` grammar of the command line."""

from __future__ import annotations

import pytest
import torch

import resstream
from resstream.analysis.steering.generation import Sampling, choose, decode_loop, generate_ids, nucleus
from resstream.api.generate import placed
from resstream.cli.edits import check_edit_specs, parse_edit_spec
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from tests.test_models_adapters import char_tokenizer, tiny_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_nucleus_keeps_the_smallest_set_reaching_top_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    # 0.5 < 0.7, 0.5 + 0.3 reaches it: the first two, renormalised
    assert torch.allclose(nucleus(probs, 0.7), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(nucleus(probs, 0.4), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))  # the top token always
    shuffled = probs[:, [2, 0, 3, 1]]
    assert torch.allclose(nucleus(shuffled, 0.7), torch.tensor([[0.0, 0.625, 0.0, 0.375]]))


def test_greedy_takes_the_most_probable_token_and_sampling_follows_the_seed() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 2.5]])
    generator = torch.Generator().manual_seed(0)
    assert choose(logits, Sampling(), generator).tolist() == [1, 2]
    hot = Sampling(temperature=1.0, top_p=1.0)
    draws = [choose(logits, hot, torch.Generator().manual_seed(7)).tolist() for _ in range(2)]
    assert draws[0] == draws[1]  # the same seed, the same draw
    cold = Sampling(temperature=1e-4)
    assert choose(logits, cold, torch.Generator().manual_seed(3)).tolist() == [1, 2]


@pytest.mark.parametrize("case", ["gpt2", "llama"])
def test_the_plain_loop_generates_what_hugging_face_generates_greedily(case: str) -> None:
    view = view_of(tiny_model(case))
    prompts = tiny_ids(2, 5)
    sampling = Sampling(max_new_tokens=6)
    ours = decode_loop(view, prompts, sampling)
    theirs = generate_ids(view, prompts, sampling)
    assert torch.equal(ours, theirs)


def test_placed_gives_prompt_or_new_positions_to_edits_without_their_own() -> None:
    edits = [
        resstream.Scale("L1.resid", 0.5),
        resstream.Add("L1.resid@2", torch.zeros(4)),
        resstream.Set("L0.mlp"),
    ]
    assert placed(edits, "all", 4, 3) == edits
    prompt = placed(edits, "prompt", 4, 3)
    assert list(prompt[0].positions) == [0, 1, 2, 3] and prompt[1] is edits[1]
    new = placed(edits, "new", 4, 3)
    assert list(new[2].positions) == [4, 5, 6]


def _hidden(model) -> int:
    config = model.config
    return getattr(config, "d_model", None) or config.hidden_size


@pytest.mark.parametrize("case", ["gpt2", "resstream"])
def test_edits_on_new_positions_leave_the_first_new_token_and_change_later_ones(case: str) -> None:
    """An edit at the new positions cannot change the first new token (its logits come from
    the prompt's last position); a strong one changes the rest. At the prompt's positions it
    changes the first too."""
    model = tiny_model(case)
    vector = torch.randn(_hidden(model), generator=torch.Generator().manual_seed(0))
    edits = [resstream.Add("L1.resid", vector, coef=50.0)]
    args = {"tokenizer": char_tokenizer(), "max_new_tokens": 5}
    new = resstream.generate(model, ["Hello"], edits=edits, where="new", **args).continuations[0]
    assert new.steered_ids[0] == new.unsteered_ids[0]
    assert new.steered_ids != new.unsteered_ids
    everywhere = resstream.generate(model, ["Hello"], edits=edits, **args).continuations[0]
    assert everywhere.steered_ids[0] != everywhere.unsteered_ids[0]


def test_generate_without_edits_gives_the_unedited_continuation_and_a_record() -> None:
    model = tiny_model("gpt2")
    result = resstream.generate(model, ["Hi there", "Hello"], tokenizer=char_tokenizer(), max_new_tokens=4)
    assert all(c.changed is False for c in result.continuations)
    frame = result.to_pandas()
    assert list(frame["prompt"]) == ["Hi there", "Hello"] and not frame["changed"].any()
    assert result.to_dict()["sampling"]["max_new_tokens"] == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"edits": [resstream.Add("L9.resid", torch.zeros(32))]}, "layer 9 is out of range"),
        ({"edits": [resstream.Add("L1.resid", torch.zeros(7))]}, "has shape (7,); allowed: (32,)"),
        (
            {"edits": [resstream.Add("L1.resid", torch.zeros(32), coef=float("nan"))]},
            "`coef` nan is not finite",
        ),
        ({"max_new_tokens": 50}, "over the model's context of"),
        ({"max_new_tokens": 0}, "`max_new_tokens` 0"),
        ({"temperature": -1.0}, "`temperature` -1.0"),
        ({"top_p": 0.0}, "`top_p` 0.0"),
        ({"where": "middle"}, "`where` 'middle'"),
        ({"prompts": []}, "give one or more non-empty prompts"),
    ],
)
def test_bad_input_is_one_line_before_anything_runs(kwargs: dict, message: str) -> None:
    args = {"prompts": ["Hello"], "tokenizer": char_tokenizer(), "max_new_tokens": 4, **kwargs}
    with pytest.raises(UsageError, match=None) as caught:
        resstream.generate(tiny_model("resstream"), **args)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_edit_specs_parse_and_refuse_with_the_grammar() -> None:
    assert parse_edit_spec("add:L6.resid:4").number == 4.0
    assert parse_edit_spec("project:L6.resid@3").site == "L6.resid@3"
    assert parse_edit_spec("scale:L3.resid:0.5").text == "scale:L3.resid:0.5"
    for bad, message in [
        ("push:L1.resid:3", "unknown operation 'push'"),
        ("add:L1.resid", "expected add:SITE:NUMBER"),
        ("project:L1.resid:2", "expected project:SITE"),
        ("scale:L1.resid:x", "'x' is not a number"),
        ("set:L1.mlp:inf", "is not finite"),
    ]:
        with pytest.raises(UsageError, match=None) as caught:
            parse_edit_spec(bad)
        assert message in str(caught.value)
    with pytest.raises(UsageError, match="needs --direction"):
        check_edit_specs(["add:L1.resid:2"], None)
    assert check_edit_specs(["scale:L1.resid:0.5"], None)[0].operation == "scale"
