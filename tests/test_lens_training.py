"""Training and evaluating tuned-lens translators (resstream.analysis.decoding.lens_training and
`resstream.tune_lens` / `resstream.evaluate_lens`).

Spec (issue 12): the loss is Σ_l mean KL(final distribution ‖ lens distribution) over layers
0..L−1, its gradient written down (q − p through the soft-cap and W_U) rather than taken by
autograd through the logits; checked here against a 3-token vocabulary by hand and against
autograd of the direct formula (plain, with an unembedding bias, soft-capped); the evaluation's
cross-entropy against a direct log-softmax of the decoder; SGD with Nesterov momentum and a
linear decay; training lowers the held-out KL of the reference model at every layer 0..L−1,
and `evaluate_lens` reproduces the training run's evaluation on the same held-out windows.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import resstream
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.decoding.lens_training import LayerSums, LensEvaluation, LensObjective, LensOptimiser
from resstream.analysis.decoding.tuned_lens import Translators, TunedLens, load_lens
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from resstream.notices import ResstreamNotice
from tests.lens_support import plays_file
from tests.test_models_adapters import tiny_model

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")

LN2 = math.log(2.0)


# --------------------------------------------------------------------------- views to train on


def three_token_view(softcap: float | None = None):
    """A 1-layer view with d = 3, identity final norm and W_U = I: the logits are the state."""
    view = view_of(tiny_model("resstream"))
    return dataclasses.replace(
        view,
        blocks=view.blocks[:1],
        final_norm=nn.Identity(),
        W_U=torch.eye(3),
        W_E=torch.eye(3),
        b_U=None,
        logit_softcap=softcap,
        d_model=3,
    )


def tiny_view(case: str):
    """A tiny random model's view (2 layers, d 32, vocab 128): resstream's GPT, the same with an
    unembedding bias, or Gemma-2 (final norm 1 + w, logits soft-capped at 3)."""
    if case == "gemma2":
        view = view_of(tiny_model("gemma2"))
        assert view.logit_softcap == 3.0
        return view
    view = view_of(tiny_model("resstream"))
    if case == "bias":
        bias = torch.randn(view.W_U.shape[0], generator=torch.Generator().manual_seed(2))
        view = dataclasses.replace(view, b_U=bias)
    return view


def random_translators(view, seed: int = 0, scale: float = 0.3) -> Translators:
    translators = Translators(view.n_layers, view.d_model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        translators.weight.copy_(
            scale * torch.randn(translators.weight.shape, generator=g) / view.d_model**0.5
        )
        translators.bias.copy_(scale * torch.randn(translators.bias.shape, generator=g))
    return translators


def random_states(view, n: int, seed: int = 1, scale: float = 1.0) -> torch.Tensor:
    """(L+1, n, d) states: not a model's, but the objective does not care where they come from."""
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(view.n_layers + 1, n, view.d_model, generator=g)


def direct_logits(view, x: torch.Tensor) -> torch.Tensor:
    """The decoder's logits written out: W_U · final_norm(x) (+ b_U), soft-capped (the model's
    own norm module, not the objective's formula of it)."""
    z = view.final_norm(x) @ view.W_U.detach().T
    if view.b_U is not None:
        z = z + view.b_U
    if view.logit_softcap:
        z = view.logit_softcap * torch.tanh(z / view.logit_softcap)
    return z


def direct_kl(view, translators: Translators, states: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q_l) per layer 0..L−1 and position (L, n), differentiable in the translators."""
    log_p = torch.log_softmax(direct_logits(view, states[-1]), -1)
    rows = []
    for layer in range(view.n_layers):
        log_q = torch.log_softmax(direct_logits(view, translators.translate(states[layer], layer)), -1)
        rows.append((log_p.exp() * (log_p - log_q)).sum(-1))
    return torch.stack(rows)


# --------------------------------------------------------------------------- by hand


def test_kl_and_q_minus_p_on_a_three_token_vocabulary_by_hand() -> None:
    # p = (1/2, 1/4, 1/4); logits 0 give q = (1/3, 1/3, 1/3):
    # KL(p ‖ q) = ½ ln(3/2) + 2·¼ ln(3/4) = ½ ln(9/8), and q − p = (−1/6, 1/12, 1/12).
    log_p = torch.tensor([[0.5, 0.25, 0.25]]).log()
    z = torch.zeros(1, 1, 3)
    kl = LensObjective._kl_in_place(z, log_p)
    assert kl.shape == (1, 1)
    assert kl.item() == pytest.approx(0.5 * math.log(9 / 8), rel=1e-6)
    torch.testing.assert_close(z, torch.tensor([[[-1 / 6, 1 / 12, 1 / 12]]]))
    # a shift of the logits changes neither q nor the KL
    z = torch.full((1, 1, 3), 5.0)
    assert LensObjective._kl_in_place(z, log_p).item() == pytest.approx(0.5 * math.log(9 / 8), rel=1e-5)


def test_backward_on_a_three_token_vocabulary_by_hand() -> None:
    # One layer, W_U = I, no norm: the lens logits are T(h_0) = h_0 + A h_0 + b, the final
    # ones h_1. h_0 = (1, 1, 1) with zero translators gives q uniform; h_1 = log(½, ¼, ¼) gives
    # p. dKL/dz = q − p = (−1/6, 1/12, 1/12), so grad b = q − p and grad A = (q − p) h_0ᵀ:
    # row i is (q − p)_i in every column.
    view = three_token_view()
    objective = LensObjective(view)
    translators = Translators(1, 3)
    states = torch.stack([torch.ones(1, 3), torch.tensor([[0.5, 0.25, 0.25]]).log()])
    sums = objective.backward(translators, states, total=1)
    assert sums.shape == (1,) and sums.dtype == torch.float64
    assert sums.item() == pytest.approx(0.5 * math.log(9 / 8), rel=1e-6)
    q_minus_p = torch.tensor([-1 / 6, 1 / 12, 1 / 12])
    torch.testing.assert_close(translators.bias.grad[0], q_minus_p)
    torch.testing.assert_close(translators.weight.grad[0], q_minus_p[:, None].expand(3, 3))
    # this call's share of a step of 4 positions: a quarter of the gradient, added to the first
    objective.backward(translators, states, total=4)
    torch.testing.assert_close(translators.bias.grad[0], 1.25 * q_minus_p)


def test_soft_capped_gradient_on_a_three_token_vocabulary_by_hand() -> None:
    # Soft-cap c = 2: lens scores s = (1, 1, 1) -> z = 2 tanh(½) in each entry, q uniform; the
    # final scores (1, 0, −1) give p = softmax(2 tanh(s / 2)). dKL/ds = (q − p)(1 − tanh²(s / c)).
    c = 2.0
    view = three_token_view(softcap=c)
    objective = LensObjective(view)
    translators = Translators(1, 3)
    final = [1.0, 0.0, -1.0]
    capped = [c * math.tanh(s / c) for s in final]
    norm = sum(math.exp(v) for v in capped)
    p = [math.exp(v) / norm for v in capped]
    kl = sum(pi * math.log(pi / (1 / 3)) for pi in p)
    states = torch.tensor([[[1.0, 1.0, 1.0]], [final]])
    sums = objective.backward(translators, states, total=1)
    assert sums.item() == pytest.approx(kl, rel=1e-5)
    slope = 1 - math.tanh(1 / c) ** 2
    want = torch.tensor([(1 / 3 - pi) * slope for pi in p])
    torch.testing.assert_close(translators.bias.grad[0], want)
    # measure: KL at layer 0 the same; at layer 1 (the output) zero; CE of target 0 by hand
    got = objective.measure(Translators(1, 3), states, torch.tensor([0]))
    assert got.kl[0].item() == pytest.approx(kl, rel=1e-5) and abs(got.kl[1].item()) < 1e-6
    assert got.ce[0].item() == pytest.approx(math.log(3), rel=1e-6)
    assert got.ce[1].item() == pytest.approx(-math.log(p[0]), rel=1e-6)
    assert got.positions == 1


# --------------------------------------------------------------------------- against autograd


@pytest.mark.parametrize("case", ["resstream", "bias", "gemma2"])
def test_kl_and_gradient_match_autograd_of_the_direct_formula(case) -> None:
    view = tiny_view(case)
    view.model.requires_grad_(False)
    states = random_states(view, n=10)
    total = 25  # this call holds 10 of a step's 25 positions
    written = random_translators(view)
    sums = LensObjective(view).backward(written, states, total)

    by_autograd = random_translators(view)
    kl = direct_kl(view, by_autograd, states)
    (kl.sum() / total).backward()
    torch.testing.assert_close(sums, kl.sum(1).double(), rtol=1e-5, atol=1e-6)
    assert sums.min() > 0.01  # non-zero translators: a real divergence, a real gradient
    torch.testing.assert_close(written.weight.grad, by_autograd.weight.grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(written.bias.grad, by_autograd.bias.grad, rtol=1e-4, atol=1e-7)
    assert written.bias.grad.abs().max() > 1e-4


def test_blocks_of_positions_give_the_whole_batchs_answer() -> None:
    view = tiny_view("gemma2")
    states = random_states(view, n=9, seed=3)
    whole, blocked = random_translators(view), random_translators(view)
    one_block = LensObjective(view)
    row_at_a_time = LensObjective(view, chunk_bytes=1)
    assert one_block.rows_per_block(view.n_layers) >= 9 and row_at_a_time.rows_per_block(view.n_layers) == 1
    torch.testing.assert_close(
        row_at_a_time.backward(blocked, states, 9), one_block.backward(whole, states, 9), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(blocked.weight.grad, whole.weight.grad, rtol=1e-5, atol=1e-8)
    targets = torch.arange(9) * 11
    a, b = one_block.measure(whole, states, targets), row_at_a_time.measure(whole, states, targets)
    torch.testing.assert_close(a.kl, b.kl, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.ce, b.ce, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["bias", "gemma2"])
def test_measure_against_the_decoders_log_softmax(case) -> None:
    view = tiny_view(case)
    states = random_states(view, n=8, seed=4)
    targets = torch.randint(0, view.W_U.shape[0], (8,), generator=torch.Generator().manual_seed(5))
    translators = random_translators(view, seed=6)
    objective = LensObjective(view)
    sums = objective.measure(translators, states, targets)
    assert sums.kl.shape == sums.ce.shape == (view.n_layers + 1,) and sums.positions == 8
    lens = TunedLens.zero(view, "tiny")
    lens.translators = translators
    decoder = decoder_of(view, "tuned", lens)  # the reading path
    with torch.no_grad():
        log_p = torch.log_softmax(decoder.at(view.n_layers).logits(states[-1]), -1)
        for layer in range(view.n_layers + 1):
            log_q = torch.log_softmax(decoder.at(layer).logits(states[layer]), -1)
            ce = -log_q.gather(1, targets[:, None]).sum().item()
            kl = (log_p.exp() * (log_p - log_q)).sum().item()
            assert sums.ce[layer].item() == pytest.approx(ce, rel=1e-5), layer
            assert sums.kl[layer].item() == pytest.approx(kl, rel=1e-4, abs=1e-5), layer
    assert abs(sums.kl[-1].item()) < 1e-5  # the output is its own final distribution
    trained = LensObjective(view).backward(random_translators(view, seed=6), states, 8)
    torch.testing.assert_close(sums.kl[:-1], trained, rtol=1e-5, atol=1e-6)  # the same KL both ways


# --------------------------------------------------------------------------- sums, optimiser


def test_layer_sums_add_and_evaluation_means_in_bits_by_hand() -> None:
    a = LayerSums(torch.tensor([4 * LN2, 0.0], dtype=torch.float64), torch.tensor([2.0, 1.0]).double(), 2)
    b = LayerSums(torch.tensor([2 * LN2, 0.0], dtype=torch.float64), torch.tensor([4.0, 3.0]).double(), 1)
    total = a + b
    assert total.positions == 3 and total.kl.tolist() == pytest.approx([6 * LN2, 0.0])
    tuned = LayerSums(torch.tensor([3 * LN2, 0.0]).double(), torch.tensor([3 * LN2, 6 * LN2]).double(), 3)
    ev = LensEvaluation.from_sums("m", total, tuned, sample="rule")
    assert ev.layers == (0, 1) and ev.num_tokens == 3 and ev.sample == "rule"
    assert ev.logit_kl == pytest.approx((2.0, 0.0)) and ev.tuned_kl == pytest.approx((1.0, 0.0))
    assert ev.logit_ce == pytest.approx((6 / (3 * LN2), 4 / (3 * LN2))) and ev.tuned_ce == pytest.approx(
        (1.0, 2.0)
    )
    assert ev.to_dict()["tuned_kl"] == pytest.approx([1.0, 0.0])


def test_optimiser_is_sgd_with_nesterov_momentum_and_a_linear_decay() -> None:
    translators = Translators(2, 3)
    optimiser, schedule = LensOptimiser(steps=4, lr=0.5, momentum=0.8, weight_decay=0.01).build(translators)
    assert isinstance(optimiser, torch.optim.SGD)
    group = optimiser.param_groups[0]
    assert group["nesterov"] and group["momentum"] == 0.8 and group["weight_decay"] == 0.01
    assert {id(p) for p in group["params"]} == {id(translators.weight), id(translators.bias)}
    rates = []
    for step in range(5):
        rates.append(group["lr"])
        translators.bias.grad = torch.ones_like(translators.bias)
        translators.weight.grad = torch.zeros_like(translators.weight)
        optimiser.step()
        schedule.step()
        if step == 0:  # Nesterov from a zero start: the buffer is g, the step lr · (g + 0.8 g)
            assert torch.allclose(translators.bias, torch.full((2, 3), -0.5 * 1.8))
            assert not translators.weight.any()
    assert rates == pytest.approx([0.5, 0.375, 0.25, 0.125, 0.0])  # lr · (1 − step / steps), then 0


# --------------------------------------------------------------------------- training the reference model

#: Training settings the lowering test uses: the reference model on a slice of its own corpus.
STEPS, TOKENS, SEQ_LEN, EVAL_SEQS, LR = 12, 12 * 4 * 64, 64, 8, 0.01


@pytest.fixture(scope="module")
def plays(tmp_path_factory) -> Path:
    """40,000 characters of the built-in corpus (the reference model's own text) as a file."""
    return plays_file(tmp_path_factory.mktemp("corpus"), 40_000)


@pytest.fixture(scope="module")
def trained(plays):
    """A lens of the reference model trained for STEPS steps, with how long that took."""
    start = time.perf_counter()
    with pytest.warns(ResstreamNotice, match="tokens a step"):  # a small test run: said, not silent
        report = resstream.tune_lens(
            None,
            dataset=str(plays),
            tokens=TOKENS,
            steps=STEPS,
            seq_len=SEQ_LEN,
            eval_seqs=EVAL_SEQS,
            batch_size=4,
            optimiser=LensOptimiser(lr=LR),
            device="cpu",
            progress=False,
        )
    return report, time.perf_counter() - start


def test_training_lowers_the_held_out_kl_at_every_layer(trained) -> None:
    report, seconds = trained
    ev = report.evaluation
    assert ev.layers == tuple(range(7)) and ev.num_tokens == EVAL_SEQS * (SEQ_LEN - 1)
    for layer in range(6):
        assert ev.tuned_kl[layer] < ev.logit_kl[layer], (layer, ev.logit_kl, ev.tuned_kl)
    assert ev.tuned_kl[6] == ev.logit_kl[6] and abs(ev.logit_kl[6]) < 1e-5  # the output itself
    assert ev.tuned_ce[6] == ev.logit_ce[6]
    assert len(report.history) == STEPS and report.history[-1] < report.history[0]
    print(  # how much training the lowering needed: shown by `pytest -s` or on a failure
        f"\n[tune-lens] {STEPS} steps, {TOKENS} tokens, lr {LR}: {seconds:.1f} s; held-out KL bits "
        f"logit {[round(x, 3) for x in ev.logit_kl]} tuned {[round(x, 3) for x in ev.tuned_kl]}"
    )


def test_the_training_record(trained, plays) -> None:
    report, _ = trained
    record = report.lens.record
    per_step = math.ceil(TOKENS / (STEPS * SEQ_LEN))
    assert record["dataset"] == str(plays) and record["seq_len"] == SEQ_LEN and record["seed"] == 0
    assert record["train_seqs"] == STEPS * per_step and record["eval_seqs"] == EVAL_SEQS
    assert record["sequences_per_step"] == per_step and record["train_tokens"] == STEPS * per_step * SEQ_LEN
    assert record["optimiser"]["lr"] == LR and record["optimiser"]["steps"] == STEPS
    assert record["kl_bits_per_step"] == [round(v, 6) for v in report.history]
    assert report.dataset_fingerprint == record["dataset_fingerprint"] and report.dataset_fingerprint
    assert "12 steps" in repr(report) and "tuned lens" in repr(report)


def test_evaluate_lens_reproduces_the_training_runs_evaluation(trained, tmp_path) -> None:
    report, _ = trained
    path = report.lens.save(tmp_path / "lens")
    again = resstream.evaluate_lens(path, device="cpu", progress=False)
    assert again == report.evaluation  # the very held-out windows: every number equal
    assert resstream.evaluate_lens(
        load_lens(path), batch_size=3, device="cpu", progress=False
    ).num_tokens == (report.evaluation.num_tokens)


def test_evaluate_lens_on_other_text_samples_afresh(trained, tmp_path) -> None:
    # another corpus: `eval_seqs` fresh windows of it, of the lens's own seq_len (arguments left
    # None come from the training record, says evaluate_lens)
    report, _ = trained
    other = tmp_path / "other.txt"
    other.write_text("the king is dead, long live the king.\n" * 80, encoding="utf-8")
    ev = resstream.evaluate_lens(report.lens, dataset=str(other), eval_seqs=3, device="cpu", progress=False)
    assert str(other) in ev.sample and ev.sample.startswith("3 held-out windows")
    assert ev.num_tokens == 3 * (SEQ_LEN - 1), ev.sample


def test_evaluate_lens_with_fewer_windows_keeps_the_lens_corpus(trained, plays) -> None:
    # only `eval_seqs` given: the dataset left None is the lens's training corpus, not the default
    report, _ = trained
    ev = resstream.evaluate_lens(report.lens, eval_seqs=2, device="cpu", progress=False)
    assert str(plays) in ev.sample, ev.sample
    assert ev.num_tokens == 2 * (SEQ_LEN - 1), ev.sample


def test_evaluate_lens_refuses_another_models_lens(trained) -> None:
    from resstream.models import as_loaded, load_model
    from resstream.training.model import GPT

    report, _ = trained
    reference = load_model(None, device="cpu", progress=False)
    torch.manual_seed(1)  # the reference's shape, other weights
    other = as_loaded(GPT(reference.view.model.config), reference.tokenizer, name="other")
    with pytest.raises(UsageError, match=f"expects fingerprint {report.lens.fingerprint}"):
        resstream.evaluate_lens(report.lens, other, progress=False)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"steps": 0}, "`steps` 0 is not allowed; allowed: an integer >= 1"),
        ({"tokens": 0}, "`tokens` 0 is not allowed"),
        ({"tokens": -5}, "`tokens` -5 is not allowed"),
        ({"eval_seqs": 0}, "`eval_seqs` 0 is not allowed"),
        ({"steps": True}, "`steps` True is not allowed"),
        ({"tokens": 10**7}, "is too small for `tokens` 10,000,000 in 12 steps"),
    ],
)
def test_tune_lens_bad_arguments(plays, kwargs, pattern) -> None:
    options = {"tokens": TOKENS, "steps": STEPS, "seq_len": SEQ_LEN, "eval_seqs": EVAL_SEQS, **kwargs}
    with pytest.raises(UsageError) as caught:
        resstream.tune_lens(None, dataset=str(plays), device="cpu", progress=False, **options)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and pattern in message, message
