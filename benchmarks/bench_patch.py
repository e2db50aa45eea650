"""Interventions on a GPT-2-small-shaped model (random weights, fp32): issue 25, item 6.

Side by side in one run, a 128-token random prompt, the prediction at its last position (the
model's own top token):

* **heads**: exact zero ablation of all 144 heads through resstream (`capture_run`, then
  `component_effects` with `zero_values`, total path, at every position), at each of
  `--batch-sizes`, against the straightforward loop — per head one full forward of the Hugging
  Face `GPT2LMHeadModel` (full logits, as TransformerLens-style code does) with a plain
  forward pre-hook on `attn.c_proj` zeroing the head's slice. Both must give the same
  log p(target) per head (the largest difference is printed; ≤ 1e-4 required). Target: ≥ 5×.
  Beside it, the ratio of the two's matmul FLOPs: what restarting at each head's block saves
  in arithmetic, the speed-up where both run at the same FLOP rate.
* **AtP**: attribution patching of all heads and all 36,864 neurons against one forward +
  backward of the same model (target ≤ 3×), when `analysis/interventions/atp.py` exists.
* **faithfulness**: `resstream.api.faithfulness.faithfulness` on `--num-seqs` × 128 tokens of
  tinyshakespeare (16 on a GPU; 2 on a CPU, where 16 take ~45 min), timed once (no target).

Each variant runs once as warm-up, then once per round in rotating order; figures are medians.
`--profile` adds where resstream's time goes (torch.profiler of one all-heads call; the parts
of one faithfulness prediction). On a CPU the 1-minute load average is printed when it exceeds
the cores: the one-sequence loop then slows more than the batched restarts (see the docs).

    python benchmarks/bench_patch.py                       # CPU, ~17 min on 2 quiet cores
    python benchmarks/bench_patch.py --quick               # loop timed on 24 heads, 1 round, 1 window
    python benchmarks/bench_patch.py --threads 1 --sections heads,atp
    python benchmarks/bench_patch.py --cuda --json $OUT/bench_patch.json   # fp32 on the GPU
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness import device_name, interleaved, load_average, medians, random_gpt2, timed, write_record
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.interventions.components import Component, ComponentSpace
from resstream.analysis.interventions.effects import Readout, component_effects
from resstream.analysis.interventions.runs import capture_run, zero_values
from resstream.models.adapters import view_of

SHAPE = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab": 50257, "seq": 128}
#: Largest |log p| difference between the loop and resstream that counts as the same.
TOLERANCE = 1e-4


# ---------------------------------------------------------------- heads: resstream and the loop


def resstream_heads(model: torch.nn.Module, ids: torch.Tensor, target: int, batch_size: int) -> torch.Tensor:
    """log p(target) at the last position with each head zero-ablated (every position), through
    resstream: one recorded run, then the batched restarts (total path)."""
    view = view_of(model)
    run = capture_run(view, ids, attention=False)
    readout = Readout(decoder_of(view), ids.shape[1] - 1, target)
    space = ComponentSpace(view.n_layers, view.blocks[0].W_O.shape[0], 0)
    effects = component_effects(
        run,
        readout,
        zero_values(run),
        [[head] for head in space.heads()],
        mode="zero",
        clean=readout.of_run(run),
        paths=("total",),
        batch_size=batch_size,
    )
    return torch.tensor([effect.logprob for effect in effects], dtype=torch.float64)


def zero_slice(start: int, stop: int) -> Callable[..., tuple[Any, ...]]:
    """A forward pre-hook zeroing features start:stop of the module's input."""

    def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        z = args[0].clone()
        z[..., start:stop] = 0.0
        return (z, *args[1:])

    return hook


def loop_heads(model: Any, ids: torch.Tensor, target: int, heads: list[Component]) -> torch.Tensor:
    """The straightforward loop: per head one full forward (full logits) with a pre-hook on
    `attn.c_proj` zeroing the head's slice; log p(target) at the last position."""
    d_head = model.config.n_embd // model.config.n_head
    out = []
    with torch.inference_mode():
        for head in heads:
            proj = model.transformer.h[head.layer].attn.c_proj
            hook = zero_slice(head.index * d_head, (head.index + 1) * d_head)
            handle = proj.register_forward_pre_hook(hook)
            try:
                logits = model(input_ids=ids).logits
            finally:
                handle.remove()
            out.append(logits[0, -1].float().log_softmax(-1)[target])
    return torch.stack(out).double().cpu()


def flop_ratio(n_layers: int, n_heads: int, d: int, seq: int, vocab: int) -> float:
    """Matmul FLOPs of the loop over those of resstream (its recorded run, then per head the
    blocks from the head's own on): attention scores and one-position read-outs left out."""
    block = 2 * 12 * d * d * seq  # QKV 3d², output d², MLP 8d² multiply-adds per token
    read_out = 2 * d * vocab * seq  # the loop's full logits
    loop = n_layers * n_heads * (n_layers * block + read_out)
    restarts = sum(n_heads * (n_layers - layer) * block for layer in range(n_layers))
    return loop / (n_layers * block + restarts)


def heads_section(args: argparse.Namespace, model: Any, ids: torch.Tensor, target: int) -> dict[str, Any]:
    """Zero ablation of every head: the loop against resstream at each batch size."""
    view = view_of(model)
    heads = ComponentSpace(view.n_layers, view.blocks[0].W_O.shape[0], 0).heads()
    looped = heads[:: max(1, len(heads) // args.loop_heads)][: args.loop_heads]
    scale = len(heads) / len(looped)
    loop_name = "loop" if scale == 1 else f"loop ({len(looped)} heads)"
    variants: dict[str, Callable[[], Any]] = {loop_name: lambda: loop_heads(model, ids, target, looped)}
    for size in args.batch_sizes:
        variants[f"resstream b={size}"] = lambda size=size: resstream_heads(model, ids, target, size)
    warm_up = {loop_name: lambda: loop_heads(model, ids, target, looped[:2])}
    load_before = load_average()
    seconds, results = interleaved(variants, args.repeats, args.device, warm_ups=warm_up, report=".2f")
    load_after = load_average()
    loop_logprobs = results.pop(loop_name)
    seconds["loop"] = [took * scale for took in seconds.pop(loop_name)]
    picked = torch.tensor([heads.index(h) for h in looped])
    diffs = {name: float((found[picked] - loop_logprobs).abs().max()) for name, found in results.items()}
    rows = medians(seconds)
    loop = rows["loop"]
    best = min(results, key=lambda name: rows[name])
    n_heads = len(heads) // view.n_layers
    ceiling = flop_ratio(view.n_layers, n_heads, view.d_model, ids.shape[1], SHAPE["vocab"])
    scaled = "" if scale == 1 else f" (timed on {len(looped)} heads, ×{scale:g})"
    print(f"\nzero ablation of all {len(heads)} heads at every position, total path, {ids.shape[1]} tokens")
    print(f"{'variant':<18} {'s (median)':>11} {'loop ÷ variant':>15} {'max |Δ log p|':>14}")
    print(f"{'loop':<18} {loop:>11.2f} {1.0:>15.2f} {'–':>14}{scaled}")
    for name in results:
        print(f"{name:<18} {rows[name]:>11.2f} {loop / rows[name]:>15.2f} {diffs[name]:>14.2e}")
    worst = max(diffs.values())
    verdict = "met" if loop / rows[best] >= 5 else "MISSED"
    print(
        f"best: {best}, {loop / rows[best]:.2f}× faster than the loop (target ≥ 5×: {verdict}); "
        f"matmul FLOPs loop ÷ resstream {ceiling:.2f}× (what exact recomputation saves)"
    )
    agree = "ok" if worst <= TOLERANCE else "FAILED"
    print(f"same log p per head: max |Δ| {worst:.2e} ({agree}: ≤ {TOLERANCE:g})")
    if not args.device.startswith("cuda") and max(load_before, load_after) > (os.cpu_count() or 1):
        print(
            f"load average {load_before:.1f} → {load_after:.1f} on {os.cpu_count()} cores: with cores "
            "oversubscribed each small operation of the one-sequence loop waits for a descheduled "
            "thread, which inflates the loop's time more than the batched restarts'; rerun quiet"
        )
    return {
        "heads": len(heads),
        "loop_heads_timed": len(looped),
        "seconds": seconds,
        "median_seconds": rows,
        "speedup": {name: loop / rows[name] for name in results},
        "best": best,
        "flop_ratio": ceiling,
        "max_abs_logprob_diff": diffs,
        "load_average": [load_before, load_after],
    }


def profile_heads(args: argparse.Namespace, model: Any, ids: torch.Tensor, target: int) -> None:
    """Where resstream's time goes: the recorded run against the restarts, and the top
    operators of one call by self time (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    view = view_of(model)
    took_run, _ = timed(lambda: capture_run(view, ids, attention=False), args.device)
    took_all, _ = timed(lambda: resstream_heads(model, ids, target, max(args.batch_sizes)), args.device)
    print(f"\nprofile: capture_run {took_run:.2f} s of {took_all:.2f} s for all heads")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        resstream_heads(model, ids, target, max(args.batch_sizes))
    sort = "self_device_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=12))


# ---------------------------------------------------------------- AtP and faithfulness


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def forward_backward(model: Any, ids: torch.Tensor, target: int) -> None:
    """One forward (full logits) and one backward of log p(target) at the last position."""
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    logits[0, -1].log_softmax(-1)[target].backward()


def atp_all(model: Any, ids: torch.Tensor, corrupt: torch.Tensor, target: int) -> Any:
    """AtP of every head, neuron, block output and residual state (patching from `corrupt`):
    the clean and corrupted runs recorded, then one forward with autograd and one backward."""
    from resstream.analysis.interventions.atp import attribution_patching

    view = view_of(model)
    base = capture_run(view, ids, attention=False)
    source = capture_run(view, corrupt, attention=False)
    return attribution_patching(base, source, Readout(decoder_of(view), ids.shape[1] - 1, target))


def atp_section(args: argparse.Namespace, model: Any, ids: torch.Tensor, target: int) -> dict[str, Any]:
    """AtP over all heads and neurons against one forward + backward of the model."""
    if not has_module("resstream.analysis.interventions.atp"):
        print("\nAtP: TODO — resstream.analysis.interventions.atp does not exist yet; not measured")
        return {"skipped": "resstream.analysis.interventions.atp does not exist"}
    from resstream.analysis.interventions.atp import attribution_patching

    corrupt = torch.randint(0, SHAPE["vocab"], ids.shape, generator=torch.Generator().manual_seed(2))
    corrupt = corrupt.to(ids.device)
    view = view_of(model)
    readout = Readout(decoder_of(view), ids.shape[1] - 1, target)
    runs = (capture_run(view, ids, attention=False), capture_run(view, corrupt, attention=False))
    variants: dict[str, Callable[[], Any]] = {
        "forward + backward": lambda: forward_backward(model, ids, target),
        "AtP, total": lambda: atp_all(model, ids, corrupt, target),
        "AtP, given both runs": lambda: attribution_patching(*runs, readout),
    }
    seconds, _ = interleaved(variants, args.repeats, args.device)
    model.zero_grad(set_to_none=True)
    estimates = attribution_patching(*runs, readout)
    rows = medians(seconds)
    yardstick = rows["forward + backward"]
    print(
        f"\nAtP of {estimates.heads.numel()} heads and {estimates.neurons.numel()} neurons (and every block "
        "output and residual state), patching from a second random prompt"
    )
    print(f"{'variant':<24} {'s (median)':>11} {'÷ forward + backward':>21}")
    for name, value in rows.items():
        print(f"{name:<24} {value:>11.3f} {value / yardstick:>21.2f}")
    ratio = rows["AtP, total"] / yardstick
    verdict = "met" if ratio <= 3 else "MISSED"
    print(f"AtP, total: {ratio:.2f}× one forward + backward (target ≤ 3×: {verdict})")
    return {
        "heads": estimates.heads.numel(),
        "neurons": estimates.neurons.numel(),
        "seconds": seconds,
        "median_seconds": rows,
        "ratio_total": ratio,
        "ratio_given_runs": rows["AtP, given both runs"] / yardstick,
    }


def faithfulness_section(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """Wall time of `resstream.faithfulness` over `--num-seqs` × 128 tokens of tinyshakespeare
    (GPT-2's tokenizer from the data folder), once, against a plain forward of as many tokens."""
    if not has_module("resstream.api.faithfulness"):
        print("\nfaithfulness: TODO — resstream.api.faithfulness does not exist yet; not measured")
        return {"skipped": "resstream.api.faithfulness does not exist"}
    from resstream.api.faithfulness import POSITIONS_PER_SEQ, faithfulness
    from resstream.data import load_tokenizer

    tokenizer = load_tokenizer("gpt2")
    seq_len = SHAPE["seq"]
    ids = torch.randint(
        0, SHAPE["vocab"], (args.num_seqs, seq_len), generator=torch.Generator().manual_seed(3)
    )

    def forward() -> None:
        with torch.inference_mode():
            model(input_ids=ids.to(args.device))

    def check() -> Any:
        return faithfulness(
            dataset="tinyshakespeare",
            model=model,
            tokenizer=tokenizer,
            num_seqs=args.num_seqs,
            seq_len=seq_len,
        )

    forward()
    took_forward, _ = timed(forward, args.device)
    took, result = timed(check, args.device)
    predictions = args.num_seqs * POSITIONS_PER_SEQ
    print(
        f"\nfaithfulness over {args.num_seqs} × {seq_len} tokens of tinyshakespeare ({predictions} "
        f"predictions: every head and the candidate neurons ablated at each): {took:.1f} s, "
        f"{took / predictions:.2f} s a prediction; a plain forward of the same tokens {took_forward:.2f} s "
        f"({took / took_forward:.0f}×)"
    )
    if args.num_seqs < 16:
        estimate = took / predictions * 16 * POSITIONS_PER_SEQ / 60
        print(f"16 × {seq_len} tokens at that rate: ~{estimate:.0f} min")
    if args.profile:
        profile_prediction(args, model)
    return {
        "num_seqs": args.num_seqs,
        "seq_len": seq_len,
        "predictions": predictions,
        "seconds": took,
        "forward_seconds": took_forward,
        "summary": repr(result),
    }


def profile_prediction(args: argparse.Namespace, model: Any) -> None:
    """Where one faithfulness prediction's time goes (the last position of a 128-token random
    prompt): the additive scores, the exact total and direct effects of every head and the
    candidate neurons, and the ablation curves."""
    from resstream.analysis.attribution.contributions import log_probs_of
    from resstream.analysis.interventions import faithfulness as parts

    view = view_of(model)
    decoder = decoder_of(view)
    lp = log_probs_of(decoder)
    ids = torch.randint(0, SHAPE["vocab"], (1, SHAPE["seq"]), generator=torch.Generator().manual_seed(4))
    run = capture_run(view, ids.to(args.device), attention=False)
    with torch.inference_mode():
        target = int(model(input_ids=ids.to(args.device)).logits[0, -1].argmax())
    readout = Readout(decoder, run.seq_len - 1, target)
    clean = readout.of_run(run)
    settings = parts.Settings(candidates=parts.CORPUS_CANDIDATES)
    took_scores, scores = timed(lambda: parts.all_scores(run, decoder, lp, target), args.device)
    heads = ComponentSpace(view.n_layers, view.n_heads, 0).heads()
    chosen = heads + parts.candidate_neurons(scores.neurons, settings.candidates)
    groups = [[c] for c in chosen]
    took_total, (total, _) = timed(
        lambda: parts.exact_effects(run, readout, clean, groups, settings.batch_size), args.device
    )
    took_direct, _ = timed(lambda: parts.direct_effects(run, readout, clean, chosen), args.device)
    neurons = parts.Level("neuron", tuple(chosen[len(heads) :]), total[len(heads) :], total[len(heads) :], {})
    took_curves, _ = timed(
        lambda: parts.ablation_curves(run, readout, clean, scores.neurons, neurons, settings, None),
        args.device,
    )
    print(
        f"profile of one prediction at position {run.seq_len - 1}: scores (C, DLA, grad×act) "
        f"{took_scores:.1f} s, exact total effects of {len(chosen)} components {took_total:.1f} s, "
        f"direct effects {took_direct:.1f} s, ablation curves {took_curves:.1f} s"
    )


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (fp32 model either way)")
    parser.add_argument("--cuda", action="store_const", const="cuda", dest="device", help="--device cuda")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds after the warm-ups")
    parser.add_argument("--quick", action="store_true", help="1 round, loop on 24 heads, 1 × 128 corpus")
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[12, 24, 48])
    parser.add_argument("--loop-heads", type=int, default=144, help="heads the loop is timed on (scaled)")
    parser.add_argument(
        "--num-seqs",
        type=int,
        help="faithfulness corpus windows (default 16 on a GPU, 2 on a CPU)",
    )
    parser.add_argument("--sections", default="heads,atp,faithfulness")
    parser.add_argument("--profile", action="store_true", help="also profile one resstream call")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.loop_heads, args.num_seqs = 1, min(args.loop_heads, 24), args.num_seqs or 1
    if args.num_seqs is None:
        args.num_seqs = 16 if args.device.startswith("cuda") else 2
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sections = set(args.sections.split(","))
    model = random_gpt2(args.device, n_layer=SHAPE["n_layer"], n_head=SHAPE["n_head"], n_embd=SHAPE["n_embd"])
    ids = torch.randint(0, SHAPE["vocab"], (1, SHAPE["seq"]), generator=torch.Generator().manual_seed(1))
    ids = ids.to(args.device)
    with torch.inference_mode():
        target = int(model(input_ids=ids).logits[0, -1].argmax())
    name = device_name(args.device)
    print(
        f"device {args.device} ({name}), torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}; "
        f"GPT-2-small shape, random weights, fp32, {SHAPE['seq']} tokens, target {target}"
    )
    record: dict[str, Any] = {
        "device": args.device,
        "device_name": name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "target": target,
    }
    if "heads" in sections:
        record["heads"] = heads_section(args, model, ids, target)
        if args.profile:
            profile_heads(args, model, ids, target)
    if "atp" in sections:
        record["atp"] = atp_section(args, model, ids, target)
    if "faithfulness" in sections:
        record["faithfulness"] = faithfulness_section(args, model)
    if args.json:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
