"""The trainer: golden losses, exact resume, divergence handling, refusal of mismatched resumes."""

from __future__ import annotations

import json

import pytest
import torch

from resstream.errors import RunError, UsageError
from resstream.training import checkpoint as ckpt
from resstream.training import loop
from resstream.training.config import build_config
from resstream.training.loop import train
from resstream.training.metrics import iter_metrics

#: Losses of the first four steps of `tiny_config()` on `corpus`; any change to the model,
#: initialisation, data order, tokenizer or optimizer shows up here.
GOLDEN_LOSSES = [5.715660572052002, 5.68874454498291, 5.6462931632995605, 5.565759658813477]


def corpus_text() -> str:
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "while",
        "seven",
        "wizards",
        "quietly",
        "judge",
        "boxing",
        "matches",
        "and",
        "a",
        "king",
        "of",
        "england",
        "sings",
        "of",
        "love",
        "and",
        "war",
    ]
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(400)]
    return "\n".join(lines) + "\n"


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


def tiny_config(corpus, tmp_path, **overrides):
    values = dict(
        dataset=str(corpus),
        n_layer=2,
        n_head=2,
        d_model=16,
        block_size=16,
        bpe_vocab_size=300,
        max_steps=8,
        batch_size=4,
        eval_interval=4,
        eval_batches=2,
        checkpoint_interval=4,
        warmup_steps=2,
        cache_dir=str(tmp_path / "cache"),
        threads=1,
    )
    values.update(overrides)
    return build_config(values)


def interrupted_run(config, run_dir, monkeypatch, *, at_step: int) -> None:
    """Train until step `at_step` (0-based) asks for its batch, then stop as Ctrl-C would."""
    real_batch = loop.micro_batch

    def interrupt(*args, **kwargs):
        if kwargs["step"] == at_step:
            raise KeyboardInterrupt
        return real_batch(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(loop, "micro_batch", interrupt)
        with pytest.raises(KeyboardInterrupt):
            train(config, run_dir, progress=False)


def losses(run_dir) -> list[float]:
    return [rec["loss"] for rec in iter_metrics(run_dir) if "loss" in rec]


def test_golden_four_step_loss(corpus, tmp_path):
    result = train(tiny_config(corpus, tmp_path, max_steps=4), tmp_path / "run", progress=False)
    if GOLDEN_LOSSES is None:
        pytest.fail(f"record GOLDEN_LOSSES = {list(result.train_losses)!r}")
    assert list(result.train_losses) == pytest.approx(GOLDEN_LOSSES, rel=1e-5)


def test_a_second_run_on_the_corpus_loads_the_kept_bpe_instead_of_training_it(corpus, tmp_path, monkeypatch):
    """Two runs (their set-up: `Trainer`) on one corpus and vocabulary size: the BPE is trained
    once, and the second run's tokenizer is the first one's."""
    from resstream.data import tokenizer as tk
    from resstream.data.tokenizer import tokenizer_fingerprint
    from resstream.training import preparation

    trained = []
    real = tk.train_bpe
    monkeypatch.setattr(tk, "train_bpe", lambda *args, **kwargs: trained.append(1) or real(*args, **kwargs))
    config = tiny_config(corpus, tmp_path, max_steps=4)
    first = loop.Trainer(config, tmp_path / "a", progress=False).tokenizer
    said: list[str] = []
    monkeypatch.setattr(preparation, "STATUS_DELAY_S", 0)  # every set-up step said at once
    second = loop.Trainer(config, tmp_path / "b", progress=True, log=said.append).tokenizer
    assert len(trained) == 1
    assert any(
        line.startswith("preparing: loading the 300-token BPE tokenizer of this corpus kept in")
        for line in said
    )
    assert tokenizer_fingerprint(first) == tokenizer_fingerprint(second)


def test_run_directory_contents_and_metrics(corpus, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(corpus, tmp_path, gate="learned", max_steps=4), run, progress=False)
    for name in ("run.json", "metrics.jsonl", "model.safetensors", "model.json", "tokenizer"):
        assert (run / name).exists(), name
    records = list(iter_metrics(run))
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    first = steps[0]
    assert set(first) >= {"loss", "lr", "tokens_per_s", "mfu", "grad_norm", "grad_norm_layers", "gate"}
    assert len(first["grad_norm_layers"]) == 2 and all(g > 0 for g in first["grad_norm_layers"])
    assert first["mfu"] is None  # CPU: no known peak
    assert sum(first["gate"]) == pytest.approx(1.0)
    assert [r["step"] for r in records if "val_loss" in r] == [4]
    record = json.loads((run / "run.json").read_text())
    assert record["config"]["model"]["gate"] == "learned"
    assert record["dataset_fingerprint"] and record["versions"]["torch"]
    loaded = ckpt.load_run(run)
    assert loaded.config.model.vocab_size == len(loaded.tokenizer)


def test_resume_continues_exactly(corpus, tmp_path, monkeypatch):
    config = tiny_config(corpus, tmp_path, dropout=0.1)
    whole = train(config, tmp_path / "whole", progress=False)

    interrupted_run(config, tmp_path / "parts", monkeypatch, at_step=5)
    assert ckpt.latest_checkpoint_step(tmp_path / "parts") == 4
    resumed = train(config, tmp_path / "parts", resume=True, progress=False)

    assert resumed.train_losses == whole.train_losses[4:]
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")
    a = ckpt.load_run(tmp_path / "whole").model.state_dict()
    b = ckpt.load_run(tmp_path / "parts").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(corpus, tmp_path, monkeypatch):
    real_step = loop.Trainer.train_step

    def poisoned(self, step, **kwargs):
        if step == 5:  # the sixth step
            with torch.no_grad():
                self.model.wte.weight.fill_(float("nan"))
        return real_step(self, step, **kwargs)

    monkeypatch.setattr(loop.Trainer, "train_step", poisoned)
    run = tmp_path / "run"
    with pytest.raises(
        RunError, match=r"non-finite training loss \(nan\) at step 6; stopped, last good checkpoint: step 4"
    ):
        train(tiny_config(corpus, tmp_path), run, progress=False)
    good = ckpt.load_checkpoint(run)
    assert good.step == 4
    assert all(torch.isfinite(v).all() for v in good.model_state.values())
    assert not (run / "model.safetensors").exists()


def test_resume_with_changed_model_config_lists_the_fields(corpus, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(corpus, tmp_path, max_steps=4), run, progress=False)
    changed = tiny_config(corpus, tmp_path, max_steps=8, n_layer=3, bpe_vocab_size=301)
    with pytest.raises(UsageError, match=r"model.n_layer: 2 -> 3; tokenizer.bpe_vocab_size: 300 -> 301"):
        train(changed, run, resume=True, progress=False)


def test_training_into_an_existing_run_is_refused(corpus, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(corpus, tmp_path, max_steps=4), run, progress=False)
    with pytest.raises(UsageError, match="already holds a run"):
        train(tiny_config(corpus, tmp_path, max_steps=4), run, progress=False)


def test_corpus_smaller_than_one_sequence_is_refused(tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("a b c d e f g h i j k l m n o p\n" * 3, encoding="utf-8")
    with pytest.raises(UsageError, match="fewer than one batch"):
        train(tiny_config(small, tmp_path, block_size=64), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_resuming_a_finished_run_keeps_its_validation_loss(corpus, tmp_path):
    run = tmp_path / "run"
    first = train(tiny_config(corpus, tmp_path, max_steps=4), run, progress=False)
    again = train(tiny_config(corpus, tmp_path, max_steps=4), run, resume=True, progress=False)
    assert again.train_losses == ()
    assert again.final_val_loss == pytest.approx(first.final_val_loss, rel=1e-6)
    assert json.loads((run / "model.json").read_text())["val_loss"] == pytest.approx(first.final_val_loss)


def test_resume_applies_changed_optimizer_settings(corpus, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(corpus, tmp_path, max_steps=4), run, progress=False)
    trainer = loop.Trainer(
        tiny_config(corpus, tmp_path, max_steps=8, lr=1e-3, min_lr=1e-4, weight_decay=0.0, beta2=0.99),
        run,
        resume=True,
        progress=False,
    )
    groups = {g["name"]: g for g in trainer.optimizer.param_groups}
    assert groups["decay"]["base_lr"] == 1e-3 and groups["decay"]["weight_decay"] == 0.0
    assert groups["no_decay"]["betas"] == (0.9, 0.99)


def test_non_finite_gradient_with_finite_loss_stops_before_the_update(corpus, tmp_path, monkeypatch):
    real_step = loop.Trainer.train_step

    def poisoned(self, step, **kwargs):
        if step == 5:
            self.model.final_norm.weight.register_hook(lambda g: g * float("inf"))
        return real_step(self, step, **kwargs)

    monkeypatch.setattr(loop.Trainer, "train_step", poisoned)
    with pytest.raises(
        RunError, match=r"non-finite gradient norm \(\w+\) at step 6; stopped, last good checkpoint: step 4"
    ):
        train(tiny_config(corpus, tmp_path), tmp_path / "run", progress=False)


def test_a_truncated_metrics_line_does_not_break_resume(corpus, tmp_path, monkeypatch):
    config = tiny_config(corpus, tmp_path)
    interrupted_run(config, tmp_path / "run", monkeypatch, at_step=5)
    with (tmp_path / "run" / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 5, "loss": 1.2')  # a writer killed mid-line
    train(config, tmp_path / "run", resume=True, progress=False)
    assert [r["step"] for r in iter_metrics(tmp_path / "run") if "loss" in r] == list(range(1, 9))


def test_a_fresh_run_replaces_a_leftover_tokenizer(corpus, tmp_path):
    from resstream.data import train_bpe

    run = tmp_path / "run"
    from resstream.data import save_tokenizer

    save_tokenizer(train_bpe(["a b c d e f"] * 10, 270), run / "tokenizer")
    train(tiny_config(corpus, tmp_path, max_steps=2), run, progress=False)
    loaded = ckpt.load_run(run)
    assert len(loaded.tokenizer) == loaded.config.model.vocab_size


def poison_at(monkeypatch, at_step: int) -> None:
    """Step `at_step` (0-based) computes its loss from NaN weights, as a diverging run does."""
    real_step = loop.Trainer.train_step

    def poisoned(self, step, **kwargs):
        if step == at_step:
            with torch.no_grad():
                self.model.wte.weight.fill_(float("nan"))
        return real_step(self, step, **kwargs)

    monkeypatch.setattr(loop.Trainer, "train_step", poisoned)


def test_a_checkpoint_whose_next_step_diverges_is_not_the_good_one(corpus, tmp_path, monkeypatch):
    config = tiny_config(corpus, tmp_path, checkpoint_interval=2)
    whole = train(config, tmp_path / "whole", progress=False)
    run = tmp_path / "run"
    poison_at(monkeypatch, 4)  # the step computed from checkpoint 4's weights
    good = run / "checkpoints" / "step-0000002"
    with pytest.raises(RunError, match=rf"at step 5; stopped, last good checkpoint: step 2 in '{good}'"):
        train(config, run, progress=False)
    assert (run / "checkpoints" / "step-0000004" / ckpt.DIVERGED).is_file()
    assert ckpt.newest_good_checkpoint(run).step == 2
    monkeypatch.undo()
    resumed = train(config, run, resume=True, progress=False)  # from step 2, the newest good
    assert resumed.train_losses == whole.train_losses[2:]
    assert losses(run) == losses(tmp_path / "whole")


def test_a_checkpoint_is_verified_by_the_step_computed_from_it(corpus, tmp_path, monkeypatch):
    run = tmp_path / "run"
    interrupted_run(tiny_config(corpus, tmp_path), run, monkeypatch, at_step=5)
    marker = json.loads((run / "checkpoints" / "step-0000004" / ckpt.VERIFIED).read_text())
    assert marker["step"] == 5 and marker["loss"] == pytest.approx(losses(run)[4])


def test_non_finite_optimizer_state_stops_before_the_checkpoint_is_written(corpus, tmp_path, monkeypatch):
    real_step = torch.optim.AdamW.step

    def overflowing(self, *args, **kwargs):
        result = real_step(self, *args, **kwargs)
        if any(s["step"] == 6 for s in self.state.values()):  # v = g² overflowed, weights still finite
            next(iter(self.state.values()))["exp_avg_sq"].fill_(float("inf"))
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", overflowing)
    run = tmp_path / "run"
    config = tiny_config(corpus, tmp_path, checkpoint_interval=2)
    with pytest.raises(
        RunError,
        match=r"non-finite optimizer state \(tensor 'state\.\d+\.exp_avg_sq' holds \d+ non-finite values? of "
        r"\d+\) at step 6; stopped, checkpoint 6 not written, last good checkpoint: step 4",
    ):
        train(config, run, progress=False)
    assert ckpt.latest_checkpoint_step(run) == 4


def test_resume_with_another_max_steps_keeps_the_original_schedule(corpus, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(corpus, tmp_path, max_steps=4), run, progress=False)
    said: list[str] = []
    train(tiny_config(corpus, tmp_path, max_steps=8), run, resume=True, progress=False, log=said.append)
    assert len(said) == 1
    assert "`max_steps` 8 (was 4)" in said[0] and "schedule of the original run" in said[0], said
    rates = {r["step"]: r["lr"] for r in iter_metrics(run) if "lr" in r}
    min_lr = tiny_config(corpus, tmp_path).optim.min_lr
    assert [rates[s] for s in (5, 6, 7, 8)] == pytest.approx([min_lr] * 4)
    record = json.loads((run / "run.json").read_text())
    assert record["lr_schedule"]["max_steps"] == 4
    assert json.loads((run / "model.json").read_text())["schedule_steps"] == 4
    # A straight 8-step run decays over 8 steps: its step 5 is well above min_lr.
    straight = train(tiny_config(corpus, tmp_path, max_steps=8), tmp_path / "straight", progress=False)
    straight_rates = {r["step"]: r["lr"] for r in iter_metrics(straight.run_dir) if "lr" in r}
    assert straight_rates[5] > 2 * min_lr
    # The same max_steps again says nothing.
    said.clear()
    train(tiny_config(corpus, tmp_path, max_steps=4), tmp_path / "straight4", progress=False, log=said.append)
    train(
        tiny_config(corpus, tmp_path, max_steps=4),
        tmp_path / "straight4",
        resume=True,
        progress=False,
        log=said.append,
    )
    assert said == []


def test_a_run_starts_by_removing_what_interrupted_writers_left(corpus, tmp_path, monkeypatch):
    run = tmp_path / "run"
    config = tiny_config(corpus, tmp_path)
    interrupted_run(config, run, monkeypatch, at_step=5)
    leftovers = [
        run / ".run.json.k2j4_9ab.tmp",
        run / ".tmpQ1w2E3",
        run / "checkpoints" / ".latest.json.x1y2z3w4.tmp",
    ]
    for path in leftovers:
        path.write_text("half-written")
    (run / "checkpoints" / ".step-0000008.0123456789ab").mkdir()
    (run / "notes.txt").write_text("a user's file")
    train(config, run, resume=True, progress=False)
    assert not list(run.rglob(".*")), sorted(run.rglob(".*"))
    assert (run / "notes.txt").read_text() == "a user's file"
