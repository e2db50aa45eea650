"""The Python API on the built-in reference model: inputs the CLI passes through unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import resstream
from resstream.errors import UsageError


def test_lens_positions_may_run_to_the_end() -> None:
    result = resstream.lens("To be, or not to be", positions=slice(3, None))
    assert result.trajectories[0].position == 3
    assert result.trajectories[-1].next_id is None  # the last token of the text
    with pytest.raises(UsageError, match=r"`positions` 4:2 is outside the text's 0:\d+ tokens"):
        resstream.lens("To be, or not to be", positions=slice(4, 2))
    with pytest.raises(UsageError, match=r"`positions` with step 2 is not allowed"):
        resstream.lens("To be, or not to be", positions=range(0, 6, 2))


def test_lens_reads_a_text_file_and_refuses_a_bad_one_before_loading_a_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resstream.api import lens as lens_module

    path = tmp_path / "text.txt"
    path.write_text("To be, or not to be", encoding="utf-8")
    assert resstream.lens(text_file=path).to_dict() == resstream.lens("To be, or not to be").to_dict()
    monkeypatch.setattr(lens_module, "one_model", lambda *args: pytest.fail("loaded a model"))
    for kwargs, pattern in [
        ({"text_file": tmp_path}, r"^`text_file` '.*' is a directory; give a UTF-8 text file or `text`$"),
        ({"text_file": tmp_path / "gone.txt"}, r"^`text_file` '.*gone\.txt' does not exist$"),
        ({"text": "x", "text_file": path}, r"^give exactly one of `text` or `text_file`$"),
        ({}, r"^give exactly one of `text` or `text_file`$"),
    ]:
        with pytest.raises(UsageError, match=pattern):
            resstream.lens(**kwargs)


def test_pinned_ids_outside_the_vocabulary_are_refused(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({"input_ids": [1, 2, 3]}) + "\n" + json.dumps({"input_ids": [4, 99999]}) + "\n"
    )
    with pytest.raises(
        UsageError,
        match=r"row 2 of '.*rows\.jsonl' holds token id 99999, outside the model's "
        r"vocabulary of \d+",
    ):
        resstream.shift(dataset=str(rows), progress=False)


@pytest.mark.slow
def test_each_model_entry_records_its_sample_and_decoding() -> None:
    report = resstream.shift(num_seqs=2, seq_len=16, progress=False)
    entry = report.to_dict()["models"][0]
    assert entry["sample"] == report.sample_rule and "reservoir-sampled with seed 0" in entry["sample"]
    assert entry["tied"] is True and entry["decoding"] == "final norm, then W_U = W_E (tied)"


def test_named_dataset_is_case_insensitive_for_its_split(shared_data: Path) -> None:
    lower = resstream.shift(
        dataset="wikitext-2", num_seqs=2, seq_len=16, data_dir=shared_data, progress=False
    )
    upper = resstream.shift(
        dataset="WikiText-2", num_seqs=2, seq_len=16, data_dir=shared_data, progress=False
    )
    assert lower.dataset_fingerprint == upper.dataset_fingerprint


def test_pinned_rows_are_fingerprinted_by_the_file(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": [1, 2, 3, 4]}) + "\n")
    first = resstream.shift(dataset=str(rows), progress=False).dataset_fingerprint
    rows.write_text(json.dumps({"input_ids": [1, 2, 3, 5]}) + "\n")
    assert (
        first is not None and resstream.shift(dataset=str(rows), progress=False).dataset_fingerprint != first
    )


@pytest.mark.slow
def test_models_sharing_a_tokenizer_share_one_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    from resstream.api import inputs
    from resstream.assets import reference_model_dir

    calls = []
    real = inputs.sample_corpus
    monkeypatch.setattr(
        inputs, "sample_corpus", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs)
    )
    report = resstream.shift([None, str(reference_model_dir())], num_seqs=2, seq_len=16, progress=False)
    assert len(calls) == 1
    assert report.results[0].in_match == report.results[1].in_match


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> str:
    """A short text (the built-in corpus takes seconds to tokenise)."""
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("To be, or not to be, that is the question. " * 40, encoding="utf-8")
    return str(path)


def test_a_model_given_as_one_string_is_one_model(small_corpus: str) -> None:
    report = resstream.shift("reference", dataset=small_corpus, num_seqs=2, seq_len=16, progress=False)
    assert [r.model for r in report.results] == ["reference"]
    recency = resstream.recency("reference", dataset=small_corpus, num_seqs=2, seq_len=8, progress=False)
    assert [r.model for r in recency.results] == ["reference"]


def test_the_api_names_are_visible_to_completion() -> None:
    assert set(resstream.__all__) <= set(dir(resstream))
    assert "__version__" in dir(resstream)


def test_reports_print_as_a_summary(small_corpus: str) -> None:
    report = resstream.shift(dataset=small_corpus, num_seqs=2, seq_len=16, progress=False)
    text = repr(report)
    assert len(text) < 100 + len(small_corpus), text
    assert "reference: shift layer" in text and f"2 × 16 tokens of {small_corpus!r}" in text
    assert len(repr(report.results[0])) < 200 and "to_dict()" in repr(report.results[0])


def test_the_default_length_is_clipped_with_a_notice_in_python(small_corpus: str) -> None:
    from resstream.models import load_model
    from resstream.notices import ResstreamNotice
    from resstream.training.config import ModelConfig
    from resstream.training.model import GPT

    tokenizer = load_model(None).tokenizer
    model = GPT(ModelConfig(n_layer=1, n_head=1, d_model=8, block_size=24, vocab_size=len(tokenizer)))
    with pytest.warns(ResstreamNotice, match=r"`seq_len` 24: the default 128 is longer than the context"):
        report = resstream.shift(model, tokenizer=tokenizer, dataset=small_corpus, num_seqs=2, progress=False)
    assert report.seq_len == 24
    with pytest.raises(
        UsageError, match=r"`seq_len` 32 is longer than the context of model '.*' \(24 tokens\)"
    ):
        resstream.shift(
            model, tokenizer=tokenizer, dataset=small_corpus, num_seqs=2, seq_len=32, progress=False
        )
