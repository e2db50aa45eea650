"""Training-step speed of resstream, measured side by side in one process.

    python benchmarks/bench_train.py            # CPU: ratios vs a plain PyTorch loop and gate overheads
    python benchmarks/bench_train.py --cuda     # also tokens/s and MFU of the gpt2-124m preset on a GPU

Every variant runs the same number of timed steps after warm-up, in interleaved rounds
(A B C ..., then B C ... A, ...), so slow drift of a shared machine hits all of them alike; the reported
figure per variant is the median step time over rounds. Absolute times are noise on shared
machines: read the ratios.

Variants:
- `plain`: a minimal GPT-2 training loop written here in plain PyTorch (same shapes, same
  AdamW, same clipping), the yardstick.
- `baseline`: resstream's `Trainer.train_step` + optimizer step, gate `none`.
- `control`: the same as `baseline`, a second time: its ratio to `baseline` is the noise floor.
- `learned`, `router`: resstream with those gates.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from harness import interleaved
from resstream.training.config import build_config
from resstream.training.loop import Trainer, peak_flops

CPU_SHAPE = dict(n_layer=4, n_head=4, d_model=128, block_size=128, bpe_vocab_size=2048, batch_size=8)


# ----------------------------------------------------------------- the yardstick
class PlainBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class PlainGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, block: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(PlainBlock(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln(x), self.tok.weight)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


class PlainRunner:
    """The plain loop over the same token stream and window starts as the Trainer."""

    def __init__(self, trainer: Trainer) -> None:
        c = trainer.config
        torch.manual_seed(0)
        self.trainer = trainer
        self.model = PlainGPT(
            c.model.vocab_size, c.model.d_model, c.model.n_layer, c.model.n_head, c.model.block_size
        ).to(trainer.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=c.optim.lr,
            betas=(c.optim.beta1, c.optim.beta2),
            fused=trainer.device.type == "cuda",
        )

    def step(self, step: int) -> float:
        accum = self.trainer.config.run.grad_accum
        for micro in range(accum):
            x, y = self.trainer._batch(step, micro)
            with self.trainer._autocast():
                loss = self.model(x, y)
            (loss / accum).backward()
        value = float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return value


class ResstreamRunner:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def step(self, step: int) -> float:
        loss, _, _ = self.trainer.train_step(step)
        self.trainer.optimizer.step()
        self.trainer.optimizer.zero_grad(set_to_none=True)
        return loss


# ------------------------------------------------------------------- measuring
def make_trainer(workdir: Path, corpus: Path, overrides: dict) -> Trainer:
    values = dict(
        dataset=str(corpus),
        cache_dir=str(workdir / "cache"),
        max_steps=10_000,
        warmup_steps=10,
        log_interval=10_000,
    )
    values.update(overrides)
    return Trainer(build_config(values), workdir / f"run-{len(list(workdir.iterdir()))}", progress=False)


def run_steps(runner: PlainRunner | ResstreamRunner, first: int, count: int) -> None:
    """Steps `first` .. `first + count - 1` of one runner."""
    for step in range(first, first + count):
        runner.step(step)


def measure(runners: dict, *, warmup: int, steps: int, rounds: int, device: torch.device) -> dict[str, float]:
    """Median over rounds of the mean step time (s) of each runner, interleaved: `warmup`
    untimed steps each, then `steps` steps per runner and round, every runner on the same
    step numbers."""
    next_step = dict.fromkeys(runners, warmup)

    def timed_steps(name: str) -> None:
        run_steps(runners[name], next_step[name], steps)
        next_step[name] += steps

    variants = {name: partial(timed_steps, name) for name in runners}
    warm_ups = {name: partial(run_steps, runner, 0, warmup) for name, runner in runners.items()}
    times, _ = interleaved(variants, rounds, device, warm_ups=warm_ups)
    return {name: statistics.median(values) / steps for name, values in times.items()}


def write_corpus(path: Path) -> Path:
    from resstream.data import load_corpus

    text = "\n\n".join(load_corpus("shakespeare").documents[:6])
    path.write_text(text, encoding="utf-8")
    return path


def cpu_benchmark(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = write_corpus(work / "corpus.txt")
        base = dict(CPU_SHAPE, device="cpu")
        baseline = make_trainer(work, corpus, base)
        runners = {
            "plain": PlainRunner(baseline),
            "baseline": ResstreamRunner(baseline),
            "control": ResstreamRunner(make_trainer(work, corpus, base)),
            "learned": ResstreamRunner(make_trainer(work, corpus, dict(base, gate="learned"))),
            "router": ResstreamRunner(make_trainer(work, corpus, dict(base, gate="router"))),
        }
        times = measure(
            runners, warmup=args.warmup, steps=args.steps, rounds=args.rounds, device=torch.device("cpu")
        )
    tokens = CPU_SHAPE["batch_size"] * CPU_SHAPE["block_size"]
    print(f"CPU, {args.threads} threads, shape {CPU_SHAPE}, {args.rounds} rounds x {args.steps} steps")
    print(f"{'variant':10s} {'ms/step':>9s} {'tokens/s':>10s}  ratio")
    for name, t in times.items():
        ratio = "" if name == "plain" else f"{times['plain'] / t:.3f}x plain tokens/s"
        print(f"{name:10s} {t * 1e3:9.2f} {tokens / t:10.0f}  {ratio}")
    print(
        f"resstream baseline vs plain (tokens/s): {times['plain'] / times['baseline']:.3f} (target >= 0.95)"
    )
    print(f"control vs baseline step time: {times['control'] / times['baseline']:.3f} (noise floor)")
    reference = (times["baseline"] + times["control"]) / 2
    for gate in ("learned", "router"):
        overhead = times[gate] / reference - 1
        print(f"{gate} gate overhead vs mean(baseline, control): {overhead * 100:+.1f}% (target <= +2%)")


def cuda_benchmark(args: argparse.Namespace) -> None:
    device = torch.device("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = write_corpus(work / "corpus.txt")
        overrides = dict(
            flatten_preset("gpt2-124m"),
            dataset=str(corpus),
            tokenizer="bpe",
            bpe_vocab_size=8192,
            batch_size=args.cuda_batch,
            grad_accum=1,
        )
        trainer = make_trainer(work, corpus, overrides)
        runners = {"plain": PlainRunner(trainer), "baseline": ResstreamRunner(trainer)}
        times = measure(runners, warmup=5, steps=10, rounds=3, device=device)
    c = trainer.config
    tokens = c.run.batch_size * c.model.block_size
    peak = peak_flops(c, device)
    for name, t in times.items():
        tps = tokens / t
        mfu = trainer.flops_per_token * tps / peak if peak else math.nan
        print(f"{torch.cuda.get_device_name()} {name:9s} {tps:12.0f} tokens/s  MFU {mfu * 100:5.1f}%")


def flatten_preset(name: str) -> dict:
    from resstream.training.config import PRESETS, flatten

    return flatten(PRESETS[name], "preset")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--d-model", type=int, default=CPU_SHAPE["d_model"], help="width of the CPU shape")
    parser.add_argument("--n-layer", type=int, default=CPU_SHAPE["n_layer"], help="depth of the CPU shape")
    parser.add_argument("--cuda", action="store_true", help="also run the gpt2-124m GPU benchmark")
    parser.add_argument("--cuda-batch", type=int, default=16)
    args = parser.parse_args()
    CPU_SHAPE.update(d_model=args.d_model, n_layer=args.n_layer)
    cpu_benchmark(args)
    if args.cuda and torch.cuda.is_available():
        cuda_benchmark(args)


if __name__ == "__main__":
    main()
