"""Tuned-lens training and decoding speed on a GPT-2-small-shaped model (issue 12).

    python benchmarks/bench_tuned.py                       # CPU, ~5 min
    python benchmarks/bench_tuned.py --tuned-lens-python /path/to/venv/bin/python

Random weights (GPT2Config(): 12 layers, d 768, vocabulary 50,257, seed 0) and random tokens
(seed 0): timing does not depend on what the weights know. Printed, from interleaved rounds in
one run (absolute times on a shared machine are noise; the ratios are the result):

1. tokens/s of one `tune-lens` optimiser step (`resstream.api.tune_lens.LensTrainer.step`: the
   forward that captures h_0..h_L, every layer's KL gradient, clipping, SGD) against one plain
   forward pass over the same tokens (`model(input_ids)` under inference mode): the model's
   cost is a floor, so the ratio says what the lens adds.
2. With `--tuned-lens-python` (a Python whose environment has the AlignmentResearch
   `tuned-lens` package; see docs/benchmarks.md for how it was installed): that package's own
   training loop (`benchmarks/tuned_lens_package.py`) on the same model and tokens, each round
   run in a fresh process between ours.
3. `resstream.shift` through a tuned lens against the logit lens on the same sequences (the
   translator adds one d×d product per layer to the decoding).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from harness import interleaved, random_gpt2, rounds_of, seconds

HERE = Path(__file__).resolve().parent


def random_tokens(batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(0))


def time_forward(model, tokens: torch.Tensor) -> float:
    with torch.inference_mode():
        return seconds(lambda: model(input_ids=tokens), tokens.device)


def time_lens_step(trainer, tokens: torch.Tensor) -> float:
    return seconds(lambda: trainer.step(list(tokens)), tokens.device)


def time_floor(view, tokens: torch.Tensor) -> float:
    """The matrix products no exact KL training can skip: per layer the lens logits
    (n × d)·(d × V) and their gradient (n × V)·(V × d), and once the final logits: 2L + 1
    products of n·d·V multiply-adds, timed on random float32 operands."""
    n, (vocab, d) = tokens.numel(), view.W_U.shape
    W_U = view.W_U.detach().float()
    x, g = torch.randn(n, d), torch.randn(n, vocab)

    def products() -> None:
        for _ in range(view.n_layers):
            x @ W_U.T
            g @ W_U
        x @ W_U.T

    return seconds(products)


def time_package(python: str, batch: int, seq_len: int, autocast: bool) -> float:
    """Seconds per optimiser step of the tuned-lens package (one timed step after a warm-up
    step, in a fresh process; `autocast` False: its bf16 autocast off); nan if it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        command = [python, str(HERE / "tuned_lens_package.py"), "--batch", str(batch), "--seq", str(seq_len)]
        command += ["--steps", "1", "--warmup", "1", "--json", str(summary)]
        command += [] if autocast else ["--no-autocast"]
        done = subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"}
        )
        if done.returncode != 0 or not summary.is_file():
            print(f"tuned-lens package run failed ({done.returncode}): {done.stderr.strip()[-400:]}")
            return math.nan
        return float(json.loads(summary.read_text())["train_seconds_per_step"])


def run_shift(model, tokenizer, rows: Path, decoder) -> object:
    import resstream

    return resstream.shift(model, tokenizer=tokenizer, dataset=str(rows), decoder=decoder, progress=False)


def tokenizer_for(vocab: int):
    """A word-level tokenizer of `vocab` entries (shift needs one; the rows are token ids)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    inner = Tokenizer(models.WordLevel(words, unk_token="w0"))
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="w0", eos_token="w0")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=8, help="sequences per optimiser step")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tuned-lens-python", default=None, help="a Python with the tuned-lens package")
    args = parser.parse_args()

    from resstream.analysis.decoding.lens_training import LensOptimiser
    from resstream.analysis.decoding.tuned_lens import TunedLens
    from resstream.api.tune_lens import LensTrainer
    from resstream.models.adapters import view_of

    model = random_gpt2(args.device)
    view = view_of(model)
    tokens = random_tokens(args.batch, args.seq_len, view.W_U.shape[0]).to(args.device)
    n_tokens = tokens.numel()
    lens = TunedLens.zero(view, "gpt2-small-random")
    trainer = LensTrainer(view, lens, LensOptimiser(steps=1000), batch_size=args.batch)
    time_forward(model, tokens)  # warm-up
    time_lens_step(trainer, tokens)
    measures = {
        "forward": lambda: time_forward(model, tokens),
        "resstream step": lambda: time_lens_step(trainer, tokens),
        "2L+1 unembedding products": lambda: time_floor(view, tokens),
    }
    modes = ("fp32", "bf16 autocast (as shipped)") if args.tuned_lens_python else ()
    for mode in modes:
        measures[f"package {mode}"] = lambda mode=mode: time_package(
            args.tuned_lens_python, args.batch, args.seq_len, mode != "fp32"
        )
    times = rounds_of(measures, args.rounds, report=".2f")
    f, o = statistics.median(times["forward"]), statistics.median(times["resstream step"])
    print(
        f"\n{n_tokens:,} tokens per step (batch {args.batch} × {args.seq_len}), "
        f"medians of {args.rounds} rounds"
    )
    print(f"plain forward                 {n_tokens / f:>8,.0f} tokens/s")
    print(f"resstream tune-lens           {n_tokens / o:>8,.0f} tokens/s  ({o / f:.2f}× a forward)")
    u = statistics.median(times["2L+1 unembedding products"])
    print(
        f"2L+1 unembedding products     {n_tokens / u:>8,.0f} tokens/s  "
        f"(resstream step = {o / u:.2f}× this floor)"
    )
    for mode in modes:
        package = [t for t in times[f"package {mode}"] if not math.isnan(t)]
        if package:
            p = statistics.median(package)
            print(
                f"tuned-lens package, {mode:<10} {n_tokens / p:>8,.0f} tokens/s  ({p / f:.2f}× a forward; "
                f"resstream {p / o:.2f}× its tokens/s)"
            )

    shift_ratio(model, view, lens, args)


def shift_ratio(model, view, lens, args) -> None:
    """`shift` through a (randomly perturbed) tuned lens against the logit lens."""
    with torch.no_grad():
        lens.translators.weight.normal_(0, 0.01)
    tokenizer = tokenizer_for(view.W_U.shape[0])
    rows = random_tokens(args.batch, args.seq_len, view.W_U.shape[0])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.jsonl"
        path.write_text("".join(json.dumps({"input_ids": row.tolist()}) + "\n" for row in rows))
        variants = {
            "logit lens": lambda: run_shift(model, tokenizer, path, "logit-lens"),
            "tuned lens": lambda: run_shift(model, tokenizer, path, lens),
        }
        times, _ = interleaved(variants, args.rounds, args.device)
    a, b = statistics.median(times["logit lens"]), statistics.median(times["tuned lens"])
    print(f"\nshift over {rows.numel():,} tokens: logit lens {a:.2f} s, tuned lens {b:.2f} s ({b / a:.2f}×)")


if __name__ == "__main__":
    sys.exit(main())
