"""The API takes models in every form — spec string, loaded Hugging Face model, resstream GPT,
ModelView, LoadedModel — with identical results; and `lens` and `shift` agree on every rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import resstream
from resstream.errors import UsageError
from resstream.models import as_loaded, load_model

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"


def without_names(report_dict: dict[str, Any]) -> dict[str, Any]:
    """A shift/recency report with each model's display name removed (it names the form)."""
    return {**report_dict, "models": [{**m, "model": None} for m in report_dict["models"]]}


@pytest.fixture(scope="module")
def reference():
    """The built-in model on the default device (the one a spec is loaded onto), so that every
    form computes the same states."""
    return load_model(None)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text((TEXT + "\n") * 40, encoding="utf-8")
    return path


def shift_of(models: Any, corpus: Path, **kwargs: Any) -> dict[str, Any]:
    report = resstream.shift(models, dataset=str(corpus), num_seqs=3, seq_len=16, progress=False, **kwargs)
    return without_names(report.to_dict())


def test_every_form_of_the_reference_model_gives_identical_shift(reference, corpus: Path) -> None:
    expected = shift_of(None, corpus)
    assert shift_of("reference", corpus) == expected
    assert shift_of(reference, corpus) == expected  # a LoadedModel
    assert shift_of(reference.model, corpus, tokenizer=reference.tokenizer) == expected  # resstream GPT
    assert shift_of(reference.view, corpus, tokenizer=reference.tokenizer) == expected  # ModelView
    assert shift_of([reference.model], corpus, tokenizer=reference.tokenizer) == expected


def test_every_form_gives_identical_lens_and_recency(reference, corpus: Path) -> None:
    by_spec = resstream.lens(TEXT, progress=False)
    by_object = resstream.lens(TEXT, model=reference.model, tokenizer=reference.tokenizer)
    assert by_object.to_dict() == {**by_spec.to_dict(), "model": by_object.model}
    recency = [
        without_names(
            resstream.recency(
                m, tokenizer=t, dataset=str(corpus), num_seqs=2, seq_len=8, progress=False
            ).to_dict()
        )
        for m, t in ((None, None), (reference.view, reference.tokenizer))
    ]
    assert recency[0] == recency[1]


def test_a_hugging_face_model_in_memory_equals_its_saved_directory(tmp_path: Path, corpus: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from resstream.data import train_bpe

    tokenizer = train_bpe([TEXT] * 20, vocab_size=300)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=len(tokenizer), n_positions=32)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    saved = str(tmp_path / "tiny")  # loaded onto the CPU, where the object is
    assert shift_of(model, corpus, tokenizer=tokenizer) == shift_of(saved, corpus, device="cpu")
    by_object = resstream.lens(TEXT[:40], model=model, tokenizer=tokenizer, top_k=3)
    by_spec = resstream.lens(TEXT[:40], model=saved, top_k=3, device="cpu")
    assert by_object.to_dict() == {**by_spec.to_dict(), "model": by_object.model}


def test_a_model_in_training_mode_is_analysed_in_eval_mode_and_handed_back(reference, corpus: Path) -> None:
    model = reference.model
    expected = shift_of(None, corpus)
    model.train()
    try:
        assert shift_of(model, corpus, tokenizer=reference.tokenizer) == expected  # dropout off
        assert model.training and all(m.training for m in model.modules())
    finally:
        model.eval()


def test_a_model_in_training_mode_gets_its_mode_back_when_the_analysis_fails(reference, corpus: Path) -> None:
    model = reference.model
    model.train()
    try:
        with pytest.raises(UsageError, match=r"`top_k` 0 is outside"):
            resstream.shift(model, tokenizer=reference.tokenizer, top_k=0, progress=False)
        assert model.training
        with pytest.raises(UsageError, match=r"`positions` 90:95 is outside"):
            resstream.lens(TEXT, model=model, tokenizer=reference.tokenizer, positions=range(90, 95))
        assert model.training and all(m.training for m in model.modules())
    finally:
        model.eval()


def test_model_objects_need_a_tokenizer_and_must_be_models(reference) -> None:
    with pytest.raises(UsageError, match=r"needs its `tokenizer`"):
        resstream.shift(reference.model, progress=False)
    with pytest.raises(UsageError, match=r"`models` holds a dict"):
        as_loaded({"not": "a model"}, reference.tokenizer)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="unsupported model"):
        resstream.lens(TEXT, model=torch.nn.Linear(2, 2), tokenizer=reference.tokenizer)


def test_options_that_apply_to_no_model_are_refused(reference) -> None:
    with pytest.raises(UsageError, match=r"`tokenizer` is used only with a model passed as an object"):
        resstream.lens(TEXT, tokenizer=reference.tokenizer)  # the reference model brings its own
    with pytest.raises(UsageError, match=r"`tokenizer` is used only"):
        resstream.shift(reference, tokenizer=reference.tokenizer, progress=False)  # a LoadedModel
    with pytest.raises(UsageError, match=r"`dtype` applies to models loaded from a spec"):
        resstream.lens(TEXT, model=reference.model, tokenizer=reference.tokenizer, dtype="bfloat16")
    with pytest.raises(UsageError, match=r"`device` applies to models loaded from a spec"):
        resstream.shift(reference.view, tokenizer=reference.tokenizer, device="cpu", progress=False)


# --------------------------------------------------------------------------- lens ≡ shift


@pytest.fixture(scope="module")
def tied_gpt(reference):
    """A GPT without positional embeddings (h_0 = W_E[t]), unit-norm embedding rows (so at
    h_0 the embedding decoder puts t at the top) and an exact duplicate ("twin") of the row of
    every token of the text, every other twin with a lower id than its token: every decoding
    of those tokens ties, and at h_0 half of the cells show the twin rather than the token."""
    from resstream.training.config import ModelConfig
    from resstream.training.model import GPT

    torch.manual_seed(1)
    tokenizer = reference.tokenizer
    model = GPT(
        ModelConfig(n_layer=2, n_head=2, d_model=16, block_size=64, vocab_size=len(tokenizer), pos_emb="none")
    )
    ids = tokenizer(TEXT)["input_ids"]
    free = [token for token in range(len(tokenizer)) if token not in set(ids)]
    twins = {
        token: free[i // 2] if i % 2 == 0 else free[-1 - i // 2] for i, token in enumerate(sorted(set(ids)))
    }
    with torch.no_grad():
        weight = model.wte.weight
        weight /= weight.norm(dim=1, keepdim=True)
        for token, twin in twins.items():
            weight[twin] = weight[token]
    assert any(twin < token for token, twin in twins.items()) and any(twin > t for t, twin in twins.items())
    return model.eval(), tokenizer, ids, twins


@pytest.mark.parametrize("decoder", ["embedding", "logit-lens"])
@pytest.mark.parametrize("top_k", [1, 2, 5])
def test_lens_and_shift_agree_on_every_rank_ties_included(tied_gpt, tmp_path: Path, decoder, top_k) -> None:
    model, tokenizer, ids, twins = tied_gpt
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": ids}) + "\n")
    lens = resstream.lens(TEXT, model=model, tokenizer=tokenizer, decoder=decoder, top_k=top_k)
    shift = resstream.shift(
        model, tokenizer=tokenizer, dataset=str(rows), top_k=top_k, decoder=decoder, progress=False
    )
    result = shift.results[0]
    scored = lens.trajectories[:-1]  # the last position has no next token
    for layer in range(result.num_layers + 1):
        in_hits = sum(t.input_ranks[layer] < top_k for t in scored)
        out_hits = sum(t.next_ranks[layer] < top_k for t in scored)
        assert in_hits / len(scored) == result.in_match[layer]
        assert out_hits / len(scored) == result.out_match[layer]
        for t in lens.trajectories:
            # a token in a cell's list is a top-k token by shift's count (ties inclusive)
            assert (t.input_id in t.top_ids[layer]) <= (t.input_ranks[layer] < top_k)
    if decoder == "embedding":  # h_0 = W_E[t]: t and its twin tie at the very top
        assert result.in_match[0] == 1.0
        for t in lens.trajectories:
            low, high = sorted((t.input_id, twins[t.input_id]))
            assert t.input_ranks[0] == 0 and t.top_ids[0][0] == low  # ties: the lower id first
            if top_k > 1:
                assert t.top_ids[0][:2] == (low, high)
        # where the twin has the lower id, the cell shows the twin, yet shift counts a top-1 hit
        shown_twin = [t for t in lens.trajectories if twins[t.input_id] < t.input_id]
        assert shown_twin and all(t.top1[0] != t.input_id for t in shown_twin)
