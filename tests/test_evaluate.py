"""Benchmark evaluation of a run: benchmark names, data, held-out tails, whole evaluations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from resstream.data import load_corpus, save_tokenizer, split_tokens, tokenize_documents
from resstream.errors import UsageError
from resstream.training.checkpoint import save_model
from resstream.training.config import build_config
from resstream.training.evaluate import (
    BENCHMARKS,
    EvalReport,
    TrainingText,
    check_benchmark_data,
    check_benchmarks,
    evaluate_run,
    parse_benchmarks,
    prepare,
    run_plan,
)
from resstream.training.evaluate.plan import _shakespeare_note
from tests.test_scoring import TEXT, tiny_gpt, tiny_tokenizer

# --------------------------------------------------------------------------- helpers


def make_run(run_dir: Path, *, dataset: str = "shakespeare", zero: bool = False, block: int = 16) -> Path:
    """A finished run directory without the trainer: weights, model.json and tokenizer."""
    tok = tiny_tokenizer()
    config = build_config(
        {
            "n_layer": 2,
            "n_head": 2,
            "d_model": 32,
            "block_size": block,
            "vocab_size": len(tok),
            "bpe_vocab_size": 300,
            "dataset": dataset,
        }
    )
    model = tiny_gpt(len(tok), block=block, zero=zero)
    save_model(
        run_dir, model.state_dict(), {"config": config.to_dict(), "steps": 0, "format": "resstream-gpt"}
    )
    save_tokenizer(tok, run_dir / "tokenizer")
    return run_dir


def write_data_dir(root: Path) -> Path:
    """A small data directory with the layout of shared/data (four named benchmarks)."""
    words = TEXT.split()
    (root / "wikitext-2").mkdir(parents=True)
    rows = [
        " = Cats = \n",
        "",
        f" {' '.join(words[:60])} \n",
        "",
        " = Dogs = \n",
        "",
        f" {' '.join(words[60:140])} \n",
    ]
    (root / "wikitext-2" / "wikitext-2-raw-v1.test.hf-rows.txt").write_text(
        "".join(row + "\n" for row in rows), encoding="utf-8"
    )
    (root / "lambada").mkdir()
    passages = [" ".join(words[i : i + 12]) for i in range(0, 120, 12)]
    (root / "lambada" / "lambada_test.jsonl").write_text(
        "".join(json.dumps({"text": p}) + "\n" for p in passages), encoding="utf-8"
    )
    (root / "openwebtext").mkdir()
    (root / "openwebtext" / "openwebtext_first100docs.txt").write_text(TEXT[:900] + "\n\n", encoding="utf-8")
    (root / "fineweb-edu").mkdir()
    (root / "fineweb-edu" / "fineweb-edu_sample-10BT_first1Mchars.txt").write_text(
        TEXT[100:1200], encoding="utf-8"
    )
    return root


# ------------------------------------------------------------------ evaluate_run


def test_parse_benchmarks():
    assert parse_benchmarks("lambada, wikitext-2,lambada") == ("lambada", "wikitext-2")
    assert parse_benchmarks(BENCHMARKS) == BENCHMARKS
    with pytest.raises(UsageError, match="wikitext-2"):
        parse_benchmarks("wikitext2")
    with pytest.raises(UsageError, match="empty"):
        parse_benchmarks(" , ")


def test_check_benchmarks_is_the_one_validator():
    assert check_benchmarks(["lambada", "lambada"]) == ("lambada",)
    every = ("lambada", "wikitext-2", "openwebtext", "fineweb-edu", "shakespeare")
    assert check_benchmarks(["lambada", "all"], allow_all=True) == every
    with pytest.raises(UsageError, match=r"unknown benchmark 'all'; allowed: wikitext-2, .*shakespeare$"):
        check_benchmarks(["all"])
    with pytest.raises(UsageError, match=r"'al' \(did you mean 'all'\?\);.* shakespeare, all$"):
        check_benchmarks(["al"], allow_all=True)


def test_check_benchmark_data(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    data = write_data_dir(tmp_path / "data")
    check_benchmark_data(["wikitext-2", "lambada"], data)
    with pytest.raises(UsageError, match="nodata' is not a directory"):
        check_benchmark_data(["lambada"], tmp_path / "nodata")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="benchmark 'lambada' is not available"):
        check_benchmark_data(["lambada"], tmp_path / "empty")


def test_evaluate_run_on_local_data(tmp_path):
    run = make_run(tmp_path / "run", zero=True)
    data = write_data_dir(tmp_path / "data")
    names = ("wikitext-2", "lambada", "openwebtext", "fineweb-edu")
    report = evaluate_run(run, names, data_dir=data, batch_size=4, progress=False)
    assert isinstance(report, EvalReport)
    assert [r.name for r in report.results] == list(names)
    assert report.block_size == 16 and report.stride == 8
    vocab = len(tiny_tokenizer())
    for r in report.results:  # uniform model
        assert r.loss == pytest.approx(math.log(vocab), abs=1e-6), r.name
        assert r.num_tokens > 0
    lam = report.results[1]
    assert lam.num_examples == 10 and lam.last_word_accuracy == 0.0
    # the stream is exactly tokenize_documents of the corpus: N - 1 tokens scored
    corpus = load_corpus("openwebtext", data_dir=data)
    tok = tiny_tokenizer()
    assert report.results[2].num_tokens == len(tokenize_documents(corpus.documents, tok)) - 1
    as_dict = report.to_dict()
    assert as_dict["stride"] == 8 and "sliding_window" in as_dict["method"]
    assert as_dict["benchmarks"][1]["last_word_accuracy"] == 0.0
    json.dumps(as_dict)


def test_evaluate_run_max_tokens_and_stride(tmp_path):
    run = make_run(tmp_path / "run")
    data = write_data_dir(tmp_path / "data")
    report = evaluate_run(
        run, "wikitext-2,lambada", data_dir=data, max_tokens=50, stride=16, batch_size=2, progress=False
    )
    wiki, lam = report.results
    assert wiki.num_tokens == 49 and report.stride == 16
    assert lam.num_examples is not None and 1 <= lam.num_examples < 10
    with pytest.raises(UsageError, match="`stride` 17"):
        evaluate_run(run, "wikitext-2", data_dir=data, stride=17, progress=False)
    with pytest.raises(UsageError, match="lambada"):
        evaluate_run(run, "lambada", data_dir=data, max_tokens=3, progress=False)


def test_unavailable_benchmark_is_a_usage_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    run = make_run(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="lambada"):
        evaluate_run(run, "lambada", data_dir=tmp_path / "empty", progress=False)


def test_shakespeare_is_the_trainers_validation_tail(tmp_path, monkeypatch):
    import resstream.data as data

    small = data.Corpus("shakespeare", (TEXT[:700], TEXT[300:1500]), "abc", "test corpus")
    monkeypatch.setattr(data, "load_corpus", lambda name, **kw: small)
    run = make_run(tmp_path / "run", zero=True)
    plan = prepare(run, ["shakespeare"], max_tokens=None)
    (bench,) = plan.benchmarks
    tok = tiny_tokenizer()
    _, val = split_tokens(tokenize_documents(small.documents, tok), 0.1)  # the trainer's rule
    assert bench.tokens.tolist() == np.asarray(val).tolist()
    assert "held out" in bench.note
    (result,) = run_plan(plan, progress=False).results
    assert result.num_tokens == len(val) - 1
    assert result.accuracy == pytest.approx(100.0 * np.mean(np.asarray(val[1:]) == 0))
    assert result.loss == pytest.approx(math.log(len(tok)), abs=1e-6)


def test_shakespeare_note_says_whether_the_tail_is_held_out():
    def trained(dataset, fingerprint=None):
        return TrainingText(dataset, 0.1, fingerprint)

    assert "held out: the run trained on shakespeare" in _shakespeare_note(trained("shakespeare"), "f")
    assert "NOT held out" in _shakespeare_note(trained("wikitext-2"), "f")
    assert "differs" in _shakespeare_note(trained("shakespeare", "g"), "f")


def test_an_estimate_counts_the_tokens_fed_and_suggests_a_cap():
    from resstream.training.evaluate import BenchmarkSize, EvalEstimate, duration_text

    # 100,001 tokens, block 128, stride 64: 1,562 windows of 128 fed; lambada feeds 2,000.
    sizes = (
        BenchmarkSize("wikitext-2", 100_000, 199_936, 100_001),
        BenchmarkSize("lambada", 300, 2_000, 2_020),
    )
    guess = EvalEstimate(sizes, tokens_per_s=1_000.0)
    assert guess.scored == 100_300
    assert guess.seconds() == pytest.approx(201.936)
    # max_tokens 20,000: a fifth of the text (39,987 tokens fed), all of lambada (2,000)
    assert guess.seconds(20_000) == pytest.approx((199_936 * 20_000 / 100_001 + 2_000) / 1_000)
    assert guess.suggested_cap() == 20_000  # 42 s; 50,000 would take 102 s
    assert EvalEstimate(sizes, tokens_per_s=10_000.0).suggested_cap() is None  # 20 s: not long
    assert EvalEstimate(sizes, tokens_per_s=1.0).suggested_cap() == 100  # nothing fits: the smallest
    small = (BenchmarkSize("lambada", 30, 90, 99),)
    assert EvalEstimate(small, tokens_per_s=1.0).suggested_cap() is None  # no cap shortens it
    assert [duration_text(t) for t in (0.2, 44.6, 200, 600, 3_000, 7_500)] == [
        "1 s", "45 s", "3 min 20 s", "10 min", "50 min", "2 h 5 min"
    ]  # fmt: skip


def test_the_estimate_sizes_match_what_scoring_counts(tmp_path):
    from resstream.training.evaluate import benchmark_size, prepare, run_plan

    run = make_run(tmp_path / "run")
    plan = prepare(run, "openwebtext,lambada", data_dir=write_data_dir(tmp_path / "data"), max_tokens=90)
    report = run_plan(plan, progress=False)
    for bench, result in zip(plan.benchmarks, report.results, strict=True):
        size = benchmark_size(plan, bench)
        assert size.scored == result.num_tokens
        assert size.capped <= 90


def test_benchmark_tokens_prefix_and_cache_equal_the_whole_stream(tmp_path):
    """A prefix tokenised only as far as needed equals the whole stream's first tokens; the
    whole stream is tokenised once per (tokenizer, corpus) and shared read-only."""
    from resstream.data import load_corpus, tokenize_documents
    from resstream.models import load_model
    from resstream.training.evaluate import plan as ev

    text = tmp_path / "bench.txt"
    text.write_text("".join(f"Line {i} of a small benchmark, with words.\n" for i in range(8000)))
    corpus = load_corpus(str(text))
    tokenizer = load_model(None, device="cpu").tokenizer
    whole = tokenize_documents(corpus.documents, tokenizer)
    ev._STREAMS.clear()
    ev._PREFIXES.clear()
    prefix = ev.benchmark_tokens(corpus, tokenizer, limit=100)
    assert 100 <= len(prefix) < len(whole) and (prefix == whole[: len(prefix)]).all()
    assert not ev._STREAMS  # a prefix is not the whole stream
    assert ev.benchmark_tokens(corpus, tokenizer, limit=50) is prefix  # kept for a cap no larger
    first = ev.benchmark_tokens(corpus, tokenizer)
    assert (first == whole).all() and not first.flags.writeable
    assert ev.benchmark_tokens(corpus, tokenizer) is first
    assert ev.benchmark_tokens(corpus, tokenizer, limit=10) is first  # the kept stream serves prefixes
