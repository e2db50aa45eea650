"""Scoring: sliding-window coverage, exact hand-checked scores, LAMBADA rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from resstream.data import train_bpe
from resstream.training.config import ModelConfig
from resstream.training.model import GPT
from resstream.training.scoring import (
    BenchmarkResult,
    LambadaExample,
    lambada_examples,
    lambada_scores,
    score_lambada,
    score_tokens,
    split_passage,
    window_plan,
)

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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    model = tiny_gpt(97, seed=5)
    tokens = np.random.default_rng(3).integers(0, 97, size=200)
    cpu = score_tokens(model, tokens, block_size=16, stride=8, batch_size=4)
    gpu = score_tokens(model.to("cuda"), tokens, block_size=16, stride=8, batch_size=4, device="cuda")
    assert gpu.count == cpu.count and gpu.nll == pytest.approx(cpu.nll, rel=1e-4)
