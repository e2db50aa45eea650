"""Benchmark evaluation: sliding-window coverage, exact hand-checked scores, LAMBADA rules."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from resstream.data import load_corpus, save_tokenizer, split_tokens, tokenize_documents, train_bpe
from resstream.errors import UsageError
from resstream.training.checkpoint import save_model
from resstream.training.config import ModelConfig, build_config
from resstream.training.evaluate import (
    BENCHMARKS,
    BenchmarkResult,
    EvalReport,
    LambadaExample,
    _shakespeare_note,
    check_benchmark_data,
    check_benchmarks,
    evaluate_run,
    lambada_examples,
    lambada_scores,
    parse_benchmarks,
    prepare,
    run_plan,
    score_lambada,
    score_tokens,
    split_passage,
    window_plan,
)
from resstream.training.model import GPT

TEXT = (
    "the cat sat on the mat and the dog ran to the park while a bird sang in the tree "
    "near the old house by the river where children play every day "
) * 20

# --------------------------------------------------------------------------- helpers


def tiny_tokenizer():
    return train_bpe([TEXT], 300)


def tiny_gpt(vocab: int, *, block: int = 16, seed: int = 0, zero: bool = False) -> GPT:
    torch.manual_seed(seed)
    model = GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=block, vocab_size=vocab))
    if zero:
        for p in model.parameters():
            torch.nn.init.zeros_(p)
    return model.eval()


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


class NextTokenModel(torch.nn.Module):
    """Predicts input + 1 with a confidence that depends on the input token (a checksum)."""

    def __init__(self, vocab: int, weights: torch.Tensor) -> None:
        super().__init__()
        self.vocab, self.weights = vocab, weights

    def forward(self, idx):
        logits = torch.zeros(*idx.shape, self.vocab)
        nxt = (idx + 1).clamp(max=self.vocab - 1)
        logits.scatter_(-1, nxt.unsqueeze(-1), self.weights[idx].unsqueeze(-1))
        return logits, None


class PrefixOracle(torch.nn.Module):
    """Puts logit `high` on table[prefix] after each listed prefix; all other logits are 0."""

    def __init__(self, vocab: int, table: dict[tuple[int, ...], int], high: float = 10.0) -> None:
        super().__init__()
        self.vocab, self.table, self.high = vocab, table, high

    def forward(self, idx):
        logits = torch.zeros(*idx.shape, self.vocab)
        for r, row in enumerate(idx.tolist()):
            for i in range(len(row)):
                nxt = self.table.get(tuple(row[: i + 1]))
                if nxt is not None:
                    logits[r, i, nxt] = self.high
        return logits, None


# --------------------------------------------------------------------- sliding windows


def test_window_plan_hand_example():
    # N = 10 tokens, block 4, stride 2: windows start at 0, 2, 4 and (pulled back) 5.
    plan = window_plan(10, 4, 2)
    assert plan.starts.tolist() == [0, 2, 4, 5] and plan.skip.tolist() == [0, 2, 2, 3]
    assert plan.length == 4
    # window 0 scores positions 1-4, then 5-6, 7-8 and 9
    assert plan.scored_positions().tolist() == list(range(1, 10))


@pytest.mark.parametrize("num_tokens", [2, 3, 16, 17, 18, 50, 101])
@pytest.mark.parametrize(("block", "stride"), [(16, 8), (16, 16), (16, 1), (16, 5), (4, 3)])
def test_every_position_scored_exactly_once_with_enough_context(num_tokens, block, stride):
    plan = window_plan(num_tokens, block, stride)
    positions = plan.scored_positions()
    assert positions.tolist() == list(range(1, num_tokens))  # each of 1..N-1, once, in order
    assert plan.length == min(block, num_tokens - 1)
    assert (plan.starts + plan.length <= num_tokens - 1).all()  # every window fits the stream
    for w, skip in enumerate(plan.skip.tolist()):
        assert 0 <= skip < plan.length
        if w > 0:  # context of the first scored target = inputs start .. start + skip
            assert skip + 1 >= block - stride


def test_window_plan_rejects_bad_arguments():
    with pytest.raises(ValueError, match="need at least 2 tokens"):
        window_plan(1, 16, 8)
    with pytest.raises(ValueError, match="stride 17 is outside"):
        window_plan(100, 16, 17)
    with pytest.raises(ValueError, match="stride 0 is outside"):
        window_plan(100, 16, 0)


@pytest.mark.parametrize("stride", [1, 3, 8])
def test_score_tokens_checksum_each_position_once(stride):
    # tokens 0..N-1, a model that predicts t+1 with logit w[t]: the summed nll is a known
    # function of exactly which positions were scored.
    n, vocab = 40, 64
    weights = torch.linspace(0.5, 4.0, vocab)
    model = NextTokenModel(vocab, weights)
    sums = score_tokens(model, np.arange(n), block_size=8, stride=stride, batch_size=3)
    w = weights[: n - 1].double()
    expected = float((torch.log(torch.exp(w) + vocab - 1) - w).sum())
    assert sums.count == n - 1 and sums.correct == n - 1
    assert sums.nll == pytest.approx(expected, rel=1e-6)


def test_uniform_model_gives_ln_vocab_exactly():
    vocab = 50
    model = tiny_gpt(vocab, zero=True)  # every weight 0 -> logits 0 -> uniform distribution
    tokens = np.random.default_rng(0).integers(0, vocab, size=200)
    tokens[::7] = 0
    result = score_tokens(model, tokens, block_size=16, stride=8, batch_size=4).result("x")
    assert result.num_tokens == 199
    assert result.loss == pytest.approx(math.log(vocab), abs=1e-6)
    assert result.perplexity == pytest.approx(vocab, rel=1e-5)
    # argmax of equal logits is token 0: accuracy = share of targets that are 0
    assert result.accuracy == pytest.approx(100.0 * np.mean(tokens[1:] == 0))


def test_result_does_not_depend_on_batch_size():
    vocab = 97
    model = tiny_gpt(vocab, seed=3)
    tokens = torch.randint(0, vocab, (301,), generator=torch.Generator().manual_seed(1))
    results = [score_tokens(model, tokens, block_size=16, stride=6, batch_size=b) for b in (1, 4, 64)]
    for other in results[1:]:
        assert other.count == results[0].count == 300
        assert other.correct == results[0].correct
        assert other.nll == pytest.approx(results[0].nll, rel=1e-6)


def test_more_context_does_not_change_first_window_and_stride_matters():
    model = tiny_gpt(97, seed=4)
    tokens = np.random.default_rng(2).integers(0, 97, size=120)
    a = score_tokens(model, tokens, block_size=16, stride=16, batch_size=8)
    b = score_tokens(model, tokens, block_size=16, stride=4, batch_size=8)
    assert a.count == b.count == 119
    assert a.nll != b.nll  # different contexts give different scores
    short = score_tokens(model, tokens[:17], block_size=16, stride=4, batch_size=8)
    assert short.count == 16  # one window


# --------------------------------------------------------------------------- LAMBADA


def test_split_passage():
    assert split_passage("he said hello there  \n") == ("he said hello", " there")
    assert split_passage("single") is None


def test_lambada_last_word_accuracy_on_forced_answers():
    tok = tiny_tokenizer()
    vocab = len(tok)
    passages = ["the cat sat on the mat", "a bird sang near the zyxwq", "the dog ran to the park"]
    examples = lambada_examples(tok, passages, block_size=16)
    assert [ex.ids[0] for ex in examples] == [tok.eos_token_id] * 3
    one, two, three = examples
    assert two.num_target >= 2, "the made-up word must span several tokens"
    assert tok.decode(list(two.ids[-two.num_target :])) == " zyxwq"

    def prefix(ex, k):  # the inputs that predict target token k
        return ex.ids[: len(ex.ids) - ex.num_target + k]

    table = {prefix(one, k): one.ids[len(one.ids) - one.num_target + k] for k in range(one.num_target)}
    table[prefix(two, 0)] = two.ids[-two.num_target]  # first token right ...
    wrong = next(t for t in range(1, vocab) if t != two.ids[-two.num_target + 1])
    table[prefix(two, 1)] = wrong  # ... second token wrong
    # passage three: nothing forced -> uniform logits -> argmax = token 0 (eos), wrong
    assert 0 not in three.ids[-three.num_target :]
    model = PrefixOracle(vocab, table)

    result = score_lambada(model, examples, batch_size=2).result("lambada")
    n1, n2, n3 = one.num_target, two.num_target, three.num_target
    assert result.num_examples == 3 and result.num_tokens == n1 + n2 + n3
    assert result.last_word_accuracy == pytest.approx(100 / 3)
    assert result.accuracy == pytest.approx(100 * (n1 + 1) / (n1 + n2 + n3))
    right = math.log(math.exp(10) + vocab - 1) - 10
    miss = math.log(math.exp(10) + vocab - 1)
    nll = (n1 + 1) * right + miss + (n2 - 2) * math.log(vocab) + n3 * math.log(vocab)
    assert result.loss == pytest.approx(nll / (n1 + n2 + n3), rel=1e-6)
    # batch size (and so the padding) changes nothing
    single = score_lambada(model, examples, batch_size=1).result("lambada")
    assert single == result


def test_lambada_scores_from_passages_and_max_tokens():
    tok = tiny_tokenizer()
    model = tiny_gpt(len(tok), seed=1)
    words = TEXT.split()
    passages = [" ".join(words[i : i + 10]) for i in range(0, 100, 10)]
    full = lambada_examples(tok, passages, block_size=16)
    assert len(full) == 10
    limit = sum(len(ex.ids) for ex in full[:4]) + 1
    capped = lambada_examples(tok, passages, block_size=16, max_tokens=limit)
    assert capped == full[:4]  # the first passages whose tokens fit
    assert all(len(ex.ids) <= 17 for ex in full)  # cut from the left to block_size + 1
    result = lambada_scores(model, tok, passages, block_size=16, batch_size=3)
    assert isinstance(result, BenchmarkResult) and result.num_examples == 10
    assert result.num_tokens == sum(ex.num_target for ex in full)
    assert result.perplexity == pytest.approx(math.exp(result.loss))


def test_long_passage_is_cut_from_the_left():
    tok = tiny_tokenizer()
    passage = " ".join(TEXT.split()[:80])
    (ex,) = lambada_examples(tok, [passage], block_size=8)
    assert len(ex.ids) == 9 and isinstance(ex, LambadaExample)
    assert ex.ids[0] != tok.eos_token_id


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
    with pytest.raises(UsageError, match="--stride 17"):
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
        config = build_config({"dataset": dataset})
        return SimpleNamespace(config=config, meta={"corpus_fingerprint": fingerprint})

    assert "held out: the run trained on shakespeare" in _shakespeare_note(trained("shakespeare"), "f", 0.1)
    assert "NOT held out" in _shakespeare_note(trained("wikitext-2"), "f", 0.1)
    assert "differs" in _shakespeare_note(trained("shakespeare", "g"), "f", 0.1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    model = tiny_gpt(97, seed=5)
    tokens = np.random.default_rng(3).integers(0, 97, size=200)
    cpu = score_tokens(model, tokens, block_size=16, stride=8, batch_size=4)
    gpu = score_tokens(model.to("cuda"), tokens, block_size=16, stride=8, batch_size=4, device="cuda")
    assert gpu.count == cpu.count and gpu.nll == pytest.approx(cpu.nll, rel=1e-4)
