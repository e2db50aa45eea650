#!/usr/bin/env python
"""Time the AlignmentResearch `tuned-lens` package's OWN training loop on a random GPT-2-small.

Runs in a side environment holding that package, NOT in resstream's (see docs/benchmarks.md for
the install: torch==2.13.0 first, then `tuned-lens` and `torchdata==0.9.0` under a constraints
file pinning torch and transformers). `benchmarks/bench_tuned.py --tuned-lens-python PY` runs it
between its own rounds; alone:

    OMP_NUM_THREADS=2 PY benchmarks/tuned_lens_package.py --batch 8 --seq 128 --steps 1 --warmup 1

What is timed
  (a) forward: `model(input_ids)` under torch.inference_mode(), over the same batches (b) trains on.
  (b) train: the package's `tuned_lens.scripts.train_loop.Train.execute()` itself (its no_grad
      forward with output_hidden_states=True, KL against the final log-softmax, one autocast(bf16)
      forward and one backward PER TRANSLATOR, clip_grad_norm_, SGD step, LR schedule). Only
      `Train.setup()` is replaced, because it downloads a model, tokenizer and dataset from the
      Hub: the replacement builds the same State from the package's own pieces (get_lens,
      Optimizer.create_optim / create_scheduler, Distributed.distribute_lens,
      calculate_gradient_accumulation_steps), and a plain iterator of {"input_ids": (batch, seq)}
      stands in for its DataLoader2. Steps are timed from the batch-fetch timestamps to the loop's
      final lens.save() call (the save itself is not timed).
  `--no-autocast` departs from the package on purpose: its bf16 autocast becomes a no-op, so the
  lens runs in float32 like resstream's (this CPU has no bf16 matrix units; bf16 is ~3x slower).

One optimiser step = `--grad-acc` micro-batches of (batch, seq) tokens (default 1).
"""

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TQDM_DISABLE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="timed optimiser steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed optimiser steps first")
    p.add_argument("--grad-acc", type=int, default=1, help="micro-batches per optimiser step")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    p.add_argument("--loss", choices=["kl", "ce"], default="kl", help="package default: kl")
    p.add_argument(
        "--no-autocast",
        action="store_true",
        help="DEVIATION from the package: make its th.autocast(bf16) a no-op so the lens runs in fp32",
    )
    p.add_argument("--json", type=str, default=None, help="also write the summary here")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)

    import importlib.metadata as md

    import transformers
    import tuned_lens.scripts.ingredients as ing
    import tuned_lens.scripts.train_loop as tl_train
    from transformers import GPT2Config, GPT2LMHeadModel

    print(
        f"torch {torch.__version__} | transformers {transformers.__version__} | "
        f"tuned-lens {md.version('tuned-lens')} | torchdata {md.version('torchdata')} | "
        f"threads {torch.get_num_threads()}"
    )

    if args.no_autocast:
        # The loop calls `th.autocast(self.dist.device.type, dtype=th.bfloat16)` where th is torch.
        tl_train.th.autocast = lambda *a, **k: contextlib.nullcontext()
        print("NOTE: --no-autocast: package's bf16 autocast replaced by a no-op (fp32 lens)")

    # ---- model: GPT-2-small shape, random weights, seed 0 (mirrors ing.Model.load's eval/no-grad)
    torch.manual_seed(0)
    config = GPT2Config()  # n_layer 12, n_embd 768, n_head 12, vocab 50257, n_positions 1024
    assert (config.n_layer, config.n_embd, config.vocab_size) == (12, 768, 50257)
    model = GPT2LMHeadModel(config)
    model.eval()
    model.requires_grad_(False)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: GPT2LMHeadModel(GPT2Config()) random, {n_params / 1e6:.1f}M params, fp32")

    # ---- tokens: seed 0, one (batch, seq) tensor per micro-batch, shared by (a) and (b)
    n_micro = (args.warmup + args.steps) * args.grad_acc
    gen = torch.Generator().manual_seed(0)
    batches = torch.randint(0, config.vocab_size, (n_micro, args.batch, args.seq), generator=gen)
    tok_per_micro = args.batch * args.seq
    timed_tokens = args.steps * args.grad_acc * tok_per_micro
    print(
        f"tokens: {n_micro} micro-batches of ({args.batch}, {args.seq}); "
        f"{args.warmup} warm-up + {args.steps} timed steps x {args.grad_acc} micro-batches"
    )

    # ---- sanity: hidden_states semantics the loop relies on (13 states, last one post-ln_f)
    with torch.no_grad():
        out = model(input_ids=batches[0][:1, :16], output_hidden_states=True)
        hs = out.hidden_states
        ok_len = len(hs) == config.n_layer + 1
        ok_last = torch.allclose(model.lm_head(hs[-1]), out.logits, atol=1e-4)
    print(f"check: len(hidden_states)={len(hs)} (want 13): {ok_len}; lm_head(hs[-1])==logits: {ok_last}")

    # ---- (a) plain forward, inference_mode (timed before AND after (b); the machine is shared)
    timed_idx = list(range(args.warmup * args.grad_acc, n_micro))

    def time_forward():
        with torch.inference_mode():
            for i in range(args.warmup * args.grad_acc):
                model(input_ids=batches[i])
            t0 = time.perf_counter()
            for i in timed_idx:
                model(input_ids=batches[i])
            return time.perf_counter() - t0

    fwd_before = time_forward()
    print(
        f"(a) forward  : {fwd_before:8.3f} s for {timed_tokens} tokens -> "
        f"{timed_tokens / fwd_before:10.1f} tok/s (before train)"
    )

    # ---- (b) the package's own Train.execute()
    outdir = Path(tempfile.mkdtemp(prefix="tl_bench_"))
    train = tl_train.Train(
        model=ing.Model(name="random-gpt2-small"),
        data=ing.Data(),
        opt=ing.Optimizer(),  # package defaults: SGD nesterov, momentum .9, lr_scale 1, wd 1e-3
        dist=ing.Distributed(per_gpu_batch_size=args.batch),
        output=outdir,
        num_steps=args.warmup + args.steps,
        tokens_per_step=tok_per_micro * args.grad_acc,
        loss=tl_train.LossChoice(args.loss),
    )

    fetch_times = []

    class TimedBatches:
        """Stands in for DataLoader2: yields the same dicts its collate would."""

        def __iter__(self):
            for i in range(n_micro):
                fetch_times.append(time.perf_counter())
                yield {"input_ids": batches[i]}

    step_losses = []
    orig_log = train._log

    def capture_log(opt, step, losses, tuned_lens_, nats_to_bpb):
        step_losses.append({k: sum(v) / len(v) for k, v in losses.items()})
        return orig_log(opt, step, losses, tuned_lens_, nats_to_bpb)

    object.__setattr__(train, "_log", capture_log)

    built = {}

    def setup():
        # Same order/pieces as Train.setup() (train_loop.py:288-347) minus Hub loading,
        # DataLoader2, snapshots, wandb and torch.distributed.
        train.dist.init()
        lens = train.get_lens(model)  # -> TunedLens.from_model(model)
        params = [p for p in lens.parameters() if p.requires_grad]
        opt = train.opt.create_optim(params)
        scheduler = train.opt.create_scheduler(opt, train.num_steps)
        ddp_lens = train.dist.distribute_lens(lens)
        state = tl_train.State(
            step=0,
            wandb_id=None,
            lens=ddp_lens,
            opt=opt,
            scheduler=scheduler,
            dataloader=TimedBatches(),
            nats_to_bpb=1.0,
        )
        grad_acc_steps = train.calculate_gradient_accumulation_steps(args.seq)
        assert grad_acc_steps == args.grad_acc, (grad_acc_steps, args.grad_acc)
        orig_save = lens.save

        def timed_save(path, *a, **k):
            built["t_end"] = time.perf_counter()
            return orig_save(path, *a, **k)

        object.__setattr__(lens, "save", timed_save)
        built.update(lens=lens, opt=opt, n_trainable=sum(p.numel() for p in params))
        return state, model, grad_acc_steps

    object.__setattr__(train, "setup", setup)
    train.execute()

    lens = built["lens"]
    opt = built["opt"]
    t_start = fetch_times[args.warmup * args.grad_acc]
    train_s = built["t_end"] - t_start
    train_tps = timed_tokens / train_s
    per_step = []
    bounds = [fetch_times[s * args.grad_acc] for s in range(args.warmup + args.steps)] + [built["t_end"]]
    for s in range(args.warmup + args.steps):
        per_step.append(bounds[s + 1] - bounds[s])

    # lens dtype actually used under the loop's autocast, on one short slice (outside timing)
    with torch.no_grad():
        h = model(input_ids=batches[0][:1, :8], output_hidden_states=True).hidden_states[0]
        with tl_train.th.autocast("cpu", dtype=torch.bfloat16):
            lg = lens(h, idx=0)
            lsm = lg.log_softmax(-1)
    print(
        f"lens: {len(lens)} translators, {built['n_trainable'] / 1e6:.2f}M trainable params, "
        f"param dtype {next(lens.layer_translators.parameters()).dtype}; "
        f"under the loop's autocast: logits {lg.dtype}, log_softmax {lsm.dtype}"
    )
    shown = {k: v for k, v in opt.defaults.items() if k in ("lr", "momentum", "nesterov", "weight_decay")}
    print(f"optimizer: {type(opt).__name__} {shown}")
    print("per-step wall s (warm-up first): " + ", ".join(f"{x:.3f}" for x in per_step))
    for s, d in enumerate(step_losses):
        vals = [d[f"translator_{i}"] for i in range(len(d))]
        print(
            f"  step {s}: mean {args.loss} over translators {sum(vals) / len(vals):.4f} "
            f"(layer0 {vals[0]:.4f}, last {vals[-1]:.4f})"
        )
    print(f"(b) train    : {train_s:8.3f} s for {timed_tokens} tokens -> {train_tps:10.1f} tok/s")
    fwd_after = time_forward()
    print(
        f"(a) forward  : {fwd_after:8.3f} s for {timed_tokens} tokens -> "
        f"{timed_tokens / fwd_after:10.1f} tok/s (after train)"
    )
    fwd_s = (fwd_before + fwd_after) / 2
    fwd_tps = timed_tokens / fwd_s
    print(f"(a) forward  : mean {fwd_s:.3f} s -> {fwd_tps:10.1f} tok/s")
    ratio = train_tps / fwd_tps
    print(
        f"ratio train/forward tok/s = {ratio:.4f}  (training is {1 / ratio:.2f}x slower than a plain forward)"
    )

    summary = dict(
        train_seconds_per_step=train_s / args.steps,
        batch=args.batch,
        seq=args.seq,
        steps=args.steps,
        warmup=args.warmup,
        grad_acc=args.grad_acc,
        threads=torch.get_num_threads(),
        loss=args.loss,
        autocast=not args.no_autocast,
        forward_s=fwd_s,
        forward_tok_s=fwd_tps,
        forward_s_before=fwd_before,
        forward_s_after=fwd_after,
        train_s=train_s,
        train_tok_s=train_tps,
        ratio_train_over_forward=ratio,
        per_step_s=per_step,
        versions=dict(
            torch=torch.__version__,
            transformers=transformers.__version__,
            tuned_lens=md.version("tuned-lens"),
            torchdata=md.version("torchdata"),
        ),
    )
    print("SUMMARY " + json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    sys.exit(main())
