"""Causal-shift analysis speed: resstream's `shift` against a plain forward pass, a naive logit
lens and TransformerLens, measured side by side in one process.

    python benchmarks/bench_shift.py                      # CPU: times, ratios, extra peak memory, agreement
    /tmp/tlvenv/bin/python benchmarks/bench_shift.py      # same, plus TransformerLens where it imports
    python benchmarks/bench_shift.py --bf16-screen        # adds `shift-bf16` (bf16 screen; slow on AVX2 CPUs)
    python benchmarks/bench_shift.py --cuda               # also the bf16 GPU run against the FLOP floor

Shape: a GPT-2-small-shaped `GPT2LMHeadModel` (12 layers, d_model 768, 12 heads, vocab 50257,
random weights, fp32), one batch of 8 × 128 random token ids, top-k 5, the logit-lens decoder.

Every variant runs once as warm-up, then once per round in interleaved rounds (A B C ..., then
B C ... A, ...), so slow drift of a shared machine hits all of them alike; the reported figure per
variant is the median over rounds. Absolute times are noise on shared machines: read the ratios.

Variants:
- `forward`: the plain Hugging Face forward `model(input_ids=ids)`, including its LM head (fp32
  logits at every position): the yardstick.
- `unembed`: one LM-head matmul (fp32 on a CPU, the model's bf16 on a GPU) over the scored
  positions (B·(T−1) × d × V), the unit of the floor: shift needs L+1 of them on top of a trunk
  forward.
- `shift`: what `resstream.shift` does per batch: `residual_states` + a new
  `AlignmentAccumulator` (top-k 5, logit lens, screen precision "auto" = fp32 on CPU) +
  `update` + `result` (model loading excluded).
- `shift-bf16`: the same with `low_precision=torch.bfloat16` (opt-in: `--bf16-screen`).
- `shift-selecting`, `shift-sync-free`: `shift` with the rank scheme forced (`sync_free=False`:
  the selecting scheme the CPU uses by default; `True`: the fixed-shape one CUDA uses by default).

`--profile` runs each `shift*` variant once more under `torch.profiler` and prints its top
operations by time and the operations that make the host wait for the device (`aten::item`,
`aten::_local_scalar_dense`, `aten::nonzero`, device-to-host copies, stream synchronisations):
where the time goes, before (selecting) and after (sync-free).
- `naive`: `residual_states`, then for every layer its fp32 logits ln_f(h_l) @ W_U.T (+ b_U),
  softmax over the vocabulary, top-5, and the membership of t_i and t_{i+1} (match rates only:
  no cosines or projections).
- `transformer_lens`: a TransformerLens `TransformerBridge` around a copy of the same weights,
  `run_with_cache`, `cache.accumulated_resid(apply_ln=True)`, `bridge.unembed`, softmax, top-5,
  membership. Skipped, with the reason, where TransformerLens does not import.

Extra peak memory: each variant in a fresh subprocess (`--measure-memory VARIANT`) that builds the
model and inputs, returns freed heap pages to the OS (`malloc_trim`), resets the peak RSS
(`/proc/self/clear_refs`), runs the variant once and reads the new peak (VmHWM) minus the resident
set before the run; median over `--memory-repeats` processes.

Agreement: the per-position top-5 membership of t_i and t_{i+1} at every layer, from resstream's
exact rank scheme (`resstream.analysis.decoding.ranks`, through the accumulator's decoder), against the
fp32 naive version and TransformerLens; disagreements are re-checked against fp64 exact ranks
(`exact_ranks`).

One file on purpose, longer than the ~500 lines we aim for: it is run with one command and
copied to a GPU machine with only `harness.py` (the timing and memory helpers every benchmark
shares) beside it; its sections (setup, variants, measuring, memory children, agreement,
reports) are marked.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from harness import (
    cuda_peak_growth,
    interleaved,
    medians,
    peak_growth,
    random_gpt2,
    round_ratios,
    seconds,
    sync,
)
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.decoding.ranks import exact_ranks
from resstream.analysis.shift.alignment import AlignmentAccumulator, AlignmentResult
from resstream.capture import residual_states
from resstream.models.adapters.base import ModelView
from resstream.models.adapters.registry import view_of
from resstream.training.loop import PEAK_FLOPS

SHAPE = {
    "n_layer": 12,
    "n_embd": 768,
    "n_head": 12,
    "vocab_size": 50257,
    "n_positions": 1024,
    "batch": 8,
    "seq": 128,
}
TOP_K = 5
ALL_VARIANTS = (
    "forward",
    "unembed",
    "shift",
    "shift-bf16",
    "shift-selecting",
    "shift-sync-free",
    "naive",
    "transformer_lens",
)
TARGETS = {"shift_vs_forward": 2.5, "tl_vs_shift": 3.5, "extra_peak_gb": 0.25, "gpu_vs_floor": 1.5}

Membership = tuple[Tensor, Tensor]  # in-hits, out-hits: bool (L+1, B, T-1) each
Variant = Callable[[], Any]


# ----------------------------------------------------------------------- setup
@dataclass
class Setup:
    model: torch.nn.Module
    view: ModelView
    ids: Tensor

    @property
    def device(self) -> torch.device:
        return self.ids.device


def build_setup(device: torch.device, dtype: torch.dtype, batch: int, seq: int) -> Setup:
    """The random-weight GPT-2-small-shaped model and a seeded batch of random token ids."""
    shape = {key: SHAPE[key] for key in ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions")}
    model = random_gpt2(device, dtype, **shape)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SHAPE["vocab_size"], (batch, seq), generator=generator).to(device)
    return Setup(model, view_of(model), ids)


def load_transformer_lens() -> tuple[Any, str]:
    """TransformerLens's `build_bridge_from_module`, or None and the reason it is unavailable."""
    try:
        import transformer_lens
        from transformer_lens.model_bridge.sources import build_bridge_from_module
    except ImportError as error:
        return None, f"{type(error).__name__}: {error}"
    return build_bridge_from_module, f"transformer_lens {getattr(transformer_lens, '__version__', '?')}"


# ----------------------------------------------------------------------- variants
def memberships(top: Tensor, ids: Tensor) -> Membership:
    """Membership of t_i and t_{i+1} in top-k index lists `top` (..., B, T, k), positions 0..T-2."""
    top = top[..., :-1, :]
    return (top == ids[:, :-1, None]).any(-1), (top == ids[:, 1:, None]).any(-1)


def make_forward(setup: Setup) -> Variant:
    def run() -> None:
        with torch.inference_mode():
            setup.model(input_ids=setup.ids)

    return run


def make_unembed(setup: Setup) -> Variant:
    w = setup.view.W_U.detach()  # fp32 on the CPU, the model's bf16 on a GPU
    x = torch.randn(
        setup.ids.shape[0] * (setup.ids.shape[1] - 1), setup.view.d_model, device=setup.device, dtype=w.dtype
    )

    def run() -> None:
        with torch.inference_mode():
            x @ w.T

    return run


def new_accumulator(
    view: ModelView, low_precision: Any = "auto", sync_free: Any = "auto"
) -> AlignmentAccumulator:
    return AlignmentAccumulator(
        num_layers=view.n_layers,
        top_k=TOP_K,
        decoder=decoder_of(view, "logit-lens"),
        W_E=view.W_E.detach(),
        W_U=view.W_U.detach(),
        low_precision=low_precision,
        sync_free=sync_free,
    )


def make_shift(setup: Setup, low_precision: Any = "auto", sync_free: Any = "auto") -> Variant:
    def run() -> AlignmentResult:
        with torch.inference_mode():
            accumulator = new_accumulator(setup.view, low_precision, sync_free)
            states = residual_states(setup.view, setup.ids)
            accumulator.update(states, setup.ids)
            return accumulator.result("bench")

    return run


def make_naive(setup: Setup) -> Variant:
    view = setup.view
    w = view.W_U.detach().float()
    b = None if view.b_U is None else view.b_U.detach().float()

    def run() -> Membership:
        with torch.inference_mode():
            states = residual_states(view, setup.ids)
            tops = []
            for h in states:
                logits = view.final_norm(h).float() @ w.T
                if b is not None:
                    logits += b
                tops.append(logits.softmax(-1).topk(TOP_K, dim=-1).indices)
            return memberships(torch.stack(tops), setup.ids)

    return run


def make_transformer_lens(setup: Setup, build_bridge: Callable[..., Any]) -> Variant:
    """The TransformerLens pipeline on a bridge around a copy of the model (the bridge rewires
    the module tree it wraps, and may switch it to eager attention)."""
    twin = copy.deepcopy(setup.model)
    bridge = build_bridge(twin, "GPT2LMHeadModel", hf_config=twin.config)
    bridge.eval()

    def run() -> Membership:
        with torch.inference_mode():
            _, cache = bridge.run_with_cache(setup.ids)
            resid = cache.accumulated_resid(apply_ln=True)  # (L+1, B, T, d)
            logits = bridge.unembed(resid).float()
            return memberships(logits.softmax(-1).topk(TOP_K, dim=-1).indices, setup.ids)

    return run


def make_variants(setup: Setup, names: list[str]) -> tuple[dict[str, Variant], dict[str, str]]:
    """The runnable variants among `names`, and the reasons for those skipped."""
    variants: dict[str, Variant] = {}
    skipped: dict[str, str] = {}
    for name in names:
        if name == "forward":
            variants[name] = make_forward(setup)
        elif name == "unembed":
            variants[name] = make_unembed(setup)
        elif name == "shift":
            variants[name] = make_shift(setup)
        elif name == "shift-bf16":
            variants[name] = make_shift(setup, torch.bfloat16)
        elif name in ("shift-selecting", "shift-sync-free"):
            variants[name] = make_shift(setup, sync_free=name == "shift-sync-free")
        elif name == "naive":
            variants[name] = make_naive(setup)
        elif name == "transformer_lens":
            build_bridge, reason = load_transformer_lens()
            if build_bridge is None:
                skipped[name] = reason
                continue
            try:
                variants[name] = make_transformer_lens(setup, build_bridge)
            except (
                AttributeError,
                KeyError,
                RuntimeError,
                TypeError,
                ValueError,
            ) as error:  # installed, unusable
                skipped[name] = f"{reason} imports but cannot wrap the model: {type(error).__name__}: {error}"
    return variants, skipped


# ----------------------------------------------------------------------- measuring
HOST_WAITS = (
    "_local_scalar_dense",
    "nonzero",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "Memcpy DtoH",
)


def profile_variants(variants: dict[str, Variant], device: torch.device) -> None:
    """Each `shift*` variant once under torch.profiler: its top operations and host waits."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for name, run in variants.items():
        if not name.startswith("shift"):
            continue
        run()  # warm
        sync(device)
        with profile(activities=activities) as prof:
            run()
            sync(device)
        events = prof.key_averages()
        waits = {e.key: e.count for e in events if any(w in e.key for w in HOST_WAITS)}
        print(f"\nprofile of {name} on {device.type}: host waits {waits or 'none'}")
        print(events.table(sort_by=sort, row_limit=12))


measure = interleaved  # by this name: bench_revisions' child calls it in every revision's copy


def memory_child(name: str, threads: int) -> None:
    """In a fresh process: extra peak RSS of one call of variant `name`; prints one JSON line."""
    torch.set_num_threads(threads)
    setup = build_setup(torch.device("cpu"), torch.float32, SHAPE["batch"], SHAPE["seq"])
    variants, skipped = make_variants(setup, [name])
    if name in skipped:
        print(json.dumps({"variant": name, "skipped": skipped[name]}))
        return
    grown, _ = peak_growth(variants[name])
    print(json.dumps({"variant": name, "extra_gb": grown / 1e9}))


def extra_peak_memory(names: list[str], threads: int, repeats: int) -> dict[str, float]:
    """Extra peak RSS (GB) of each variant: median over `repeats` fresh subprocesses, run one at
    a time (the peak moves by ~0.1 GB between processes with what glibc's malloc reuses)."""
    out: dict[str, float] = {}
    for name in names:
        values = []
        for _ in range(repeats):
            done = subprocess.run(
                [sys.executable, __file__, "--measure-memory", name, "--threads", str(threads)],
                capture_output=True,
                text=True,
                check=False,
            )
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                print(
                    f"memory of {name}: subprocess failed ({done.returncode}): {done.stderr.strip()[-500:]}"
                )
                break
            record = json.loads(lines[-1])
            if "extra_gb" not in record:
                break
            values.append(record["extra_gb"])
        if values:
            out[name] = statistics.median(values)
            print(
                f"extra peak memory of {name} (GB), {len(values)} processes: "
                f"{' '.join(f'{v:.3f}' for v in values)}"
            )
    return out


# ----------------------------------------------------------------------- agreement
def shift_memberships(setup: Setup) -> tuple[Membership, AlignmentAccumulator]:
    """Per-position top-k membership from the accumulator's exact rank scheme (the scheme that
    `AlignmentAccumulator.update` runs; its rates come out of `result`)."""
    view, ids = setup.view, setup.ids
    accumulator = new_accumulator(view)
    targets = torch.stack([ids[:, :-1].reshape(-1), ids[:, 1:].reshape(-1)], dim=1)
    ins, outs = [], []
    with torch.inference_mode():
        states = residual_states(view, ids)
        for h in states:
            ranks, _ = accumulator.scorer.ranks(h[:, :-1].reshape(-1, view.d_model), targets, TOP_K)
            hits = (ranks < TOP_K).reshape(*ids[:, :-1].shape, 2)
            ins.append(hits[..., 0])
            outs.append(hits[..., 1])
    return (torch.stack(ins), torch.stack(outs)), accumulator


def explain_disagreements(
    setup: Setup, reference: Membership, other: Membership, limit: int = 10
) -> list[str]:
    """For positions where `other` differs from the exact `reference`: fp64 rank and fp32 gap."""
    view, ids = setup.view, setup.ids
    lines = []
    decoder = decoder_of(view, "logit-lens")  # the one definition of scores; ranks by brute force
    with torch.inference_mode():
        states = residual_states(view, ids)
        for which, (ref, oth) in enumerate(zip(reference, other, strict=True)):
            for layer, bi, ti in torch.nonzero(ref != oth).tolist()[:limit]:
                token = int(ids[bi, ti + which])
                h = states[layer, bi, ti][None]
                x = decoder.inputs(h)
                rank = int(
                    exact_ranks(x, decoder.matrix, decoder.bias, torch.tensor([token], device=x.device))[0]
                )
                logits = decoder.logits(h)[0]
                kth = logits.topk(TOP_K + 1).values
                lines.append(
                    f"layer {layer} seq {bi} pos {ti} {'t_i+1' if which else 't_i'}: fp64 rank {rank}, "
                    f"reference says {bool(ref[layer, bi, ti])}; fp32 logit {float(logits[token]):.6g}, "
                    f"{TOP_K}th/{TOP_K + 1}th fp32 logits {float(kth[-2]):.6g}/{float(kth[-1]):.6g}"
                )
    return lines


def agreement(setup: Setup, outputs: dict[str, Any]) -> None:
    """Per-position membership of `shift`'s rank scheme against the other variants' outputs."""
    reference, accumulator = shift_memberships(setup)
    n = reference[0].numel()
    layers = reference[0].shape[0]
    stats = accumulator.scorer.engine.stats
    print(
        f"\nagreement of top-{TOP_K} membership: {layers} layers x {n // layers} positions x 2 targets "
        f"(t_i, t_i+1) = {2 * n} memberships"
    )
    print(
        f"  screen: {stats.rows} queries, {stats.rescored_rows} re-scored rows, "
        f"{stats.rescored_entries} entries re-scored in fp64, {stats.heavy_rows} heavy rows"
    )
    result = outputs.get("shift")
    if result is not None:
        rates_in = tuple(float(v) for v in reference[0].double().flatten(1).mean(1))
        rates_out = tuple(float(v) for v in reference[1].double().flatten(1).mean(1))
        same = all(
            math.isclose(a, c, abs_tol=1e-12)
            for a, c in zip(rates_in + rates_out, result.in_match + result.out_match, strict=True)
        )
        print(f"  shift's AlignmentResult rates == per-position exact memberships: {same}")
        print(f"  in_match  {[round(v, 4) for v in result.in_match]}")
        print(f"  out_match {[round(v, 4) for v in result.out_match]}")
    for name in ("naive", "transformer_lens"):
        if name not in outputs:
            continue
        other = outputs[name]
        diff = int((reference[0] != other[0]).sum() + (reference[1] != other[1]).sum())
        share = 100 * (1 - diff / (2 * n))
        print(f"  {name} vs shift: {diff} of {2 * n} memberships differ ({share:.4f}% equal)")
        for line in explain_disagreements(setup, reference, other):
            print(f"    {line}")


# ----------------------------------------------------------------------- FLOPs
def flops(batch: int, seq: int) -> dict[str, float]:
    """Matmul FLOPs of one forward, one unembedding of the scored positions, and shift's floor."""
    d, layers, vocab = SHAPE["n_embd"], SHAPE["n_layer"], SHAPE["vocab_size"]
    tokens = batch * seq
    trunk = 2 * 12 * d * d * layers * tokens  # qkv 3d², proj d², mlp 8d² per layer
    attention = 4 * layers * batch * seq * seq * d  # QKᵀ and AV, full (unmasked) squares
    lm_head = 2 * tokens * d * vocab
    unembed = 2 * batch * (seq - 1) * d * vocab
    return {
        "trunk": trunk + attention,
        "lm_head": lm_head,
        "unembed": unembed,
        "forward": trunk + attention + lm_head,
        "shift_floor": trunk + attention + (layers + 1) * unembed,
    }


def print_flops(batch: int, seq: int) -> None:
    f = flops(batch, seq)
    print(
        f"\nFLOPs (matmuls only): trunk {f['trunk'] / 1e9:.1f} G, LM head {f['lm_head'] / 1e9:.1f} G, "
        f"one unembedding of the {batch}x{seq - 1} scored positions {f['unembed'] / 1e9:.1f} G"
    )
    print(
        f"forward = trunk + LM head = {f['forward'] / 1e9:.1f} G; shift floor = trunk + "
        f"{SHAPE['n_layer'] + 1} unembeddings = {f['shift_floor'] / 1e9:.1f} G"
    )
    print(
        f"arithmetic floor of shift / forward at one matmul speed: {f['shift_floor'] / f['forward']:.2f}x "
        f"(target <= {TARGETS['shift_vs_forward']}x)"
    )


# ----------------------------------------------------------------------- reports
def report(
    rounds: dict[str, list[float]], memory: dict[str, float], skipped: dict[str, str], batch: int, seq: int
) -> None:
    """Medians, per-round times, ratios against the targets, the floor, and a Markdown table."""
    f = flops(batch, seq)
    times = medians(rounds)
    print("\nper-round seconds (interleaved, rotating order):")
    for name, values in rounds.items():
        print(f"  {name:18s} {' '.join(f'{v:8.2f}' for v in values)}")
    pairs = [("shift", "forward"), ("naive", "shift"), ("transformer_lens", "shift")]
    present = [(a, b) for a, b in pairs if a in rounds and b in rounds]
    within = [f"{a}/{b} {statistics.median(round_ratios(rounds, a, b)):.2f}x" for a, b in present]
    if within:
        print(f"median of per-round ratios: {', '.join(within)}")
    print(f"\n{'variant':18s} {'ms':>10s} {'÷ forward':>10s} {'extra peak GB':>14s}")
    for name, t in times.items():
        ratio = t / times["forward"] if "forward" in times else math.nan
        print(f"{name:18s} {t * 1e3:10.1f} {ratio:10.2f} {memory.get(name, math.nan):14.3f}")
    for name, reason in skipped.items():
        print(f"{name:18s} skipped: {reason}")
    if "transformer_lens" in skipped:
        print(f"TransformerLens: not installable here ({skipped['transformer_lens']})")
    if "shift" in times and "forward" in times:
        print(
            f"shift / forward: {times['shift'] / times['forward']:.2f}x "
            f"(target <= {TARGETS['shift_vs_forward']}x)"
        )
    if "shift" in times and "naive" in times:
        print(f"naive / shift: {times['naive'] / times['shift']:.2f}x")
    if "shift" in times and "transformer_lens" in times:
        print(
            f"TransformerLens / shift: {times['transformer_lens'] / times['shift']:.2f}x "
            f"(target >= {TARGETS['tl_vs_shift']}x)"
        )
    if "shift" in memory:
        print(f"shift extra peak memory: {memory['shift']:.3f} GB (target <= {TARGETS['extra_peak_gb']} GB)")
    if {"forward", "unembed", "shift"} <= set(times):
        # measured floor: a forward's trunk (forward minus its LM head) + L+1 unembeddings
        trunk_time = times["forward"] - times["unembed"] * f["lm_head"] / f["unembed"]
        floor = trunk_time + (SHAPE["n_layer"] + 1) * times["unembed"]
        print(
            f"estimated time floor (forward - its LM head + {SHAPE['n_layer'] + 1} unembeddings) "
            f"{floor * 1e3:.1f} ms: "
            f"floor / forward {floor / times['forward']:.2f}x, shift / floor {times['shift'] / floor:.2f}x"
        )
        print(f"unembedding matmul: {f['unembed'] / times['unembed'] / 1e9:.1f} GFLOP/s")
    print("\nMarkdown:\n")
    print("| variant | ms | ÷ forward | ÷ shift | extra peak memory (GB) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, t in times.items():
        fwd = f"{t / times['forward']:.2f}" if "forward" in times else ""
        sh = f"{t / times['shift']:.2f}" if "shift" in times else ""
        mem = f"{memory[name]:.3f}" if name in memory else "–"
        print(f"| {name} | {t * 1e3:.1f} | {fwd} | {sh} | {mem} |")
    for name, reason in skipped.items():
        print(f"| {name} | skipped: {reason} | | | |")


def cpu_benchmark(args: argparse.Namespace, names: list[str]) -> None:
    torch.set_num_threads(args.threads)
    setup = build_setup(torch.device("cpu"), torch.float32, SHAPE["batch"], SHAPE["seq"])
    variants, skipped = make_variants(setup, names)
    print(
        f"CPU, {args.threads} threads, torch {torch.__version__}, shape {SHAPE}, top-{TOP_K}, "
        f"{args.rounds} rounds; variants {list(variants)}"
    )
    for name, reason in skipped.items():
        print(f"{name}: skipped ({reason})")
    took = seconds(lambda: new_accumulator(setup.view))
    print(f"AlignmentAccumulator construction (part of `shift`): {took * 1e3:.0f} ms")
    rounds, outputs = measure(variants, rounds=args.rounds, device=setup.device)
    agreement(setup, outputs)
    if args.profile:
        profile_variants(variants, setup.device)
    memory = {} if args.no_memory else extra_peak_memory(list(variants), args.threads, args.memory_repeats)
    print_flops(SHAPE["batch"], SHAPE["seq"])
    report(rounds, memory, skipped, SHAPE["batch"], SHAPE["seq"])


def cuda_benchmark(args: argparse.Namespace, names: list[str]) -> None:
    """bf16 model on the GPU: times, peak allocated memory, and shift against the FLOP floor."""
    device = torch.device("cuda")
    setup = build_setup(device, torch.bfloat16, args.cuda_batch, SHAPE["seq"])
    variants, skipped = make_variants(setup, [n for n in names if n != "shift-bf16"])
    rounds, _ = measure(variants, rounds=args.cuda_rounds, device=device)
    if args.profile:
        profile_variants(variants, device)
    times = medians(rounds)
    memory: dict[str, float] = {}
    for name, run in variants.items():
        memory[name] = cuda_peak_growth(run, device)[0] / 1e9
    name = torch.cuda.get_device_name(device)
    peak = args.peak_flops or next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    print(f"\n{name}, bf16 model, batch {args.cuda_batch} x {SHAPE['seq']}, {args.cuda_rounds} rounds")
    report(rounds, memory, skipped, args.cuda_batch, SHAPE["seq"])
    if peak and "shift" in times:
        floor = flops(args.cuda_batch, SHAPE["seq"])["shift_floor"] / peak
        print(
            f"shift {times['shift'] * 1e3:.2f} ms vs FLOP floor {floor * 1e3:.3f} ms at {peak / 1e12:.0f} "
            f"TFLOP/s bf16: {times['shift'] / floor:.2f}x (target <= {TARGETS['gpu_vs_floor']}x)"
        )
    elif "shift" in times:
        print(f"no known bf16 peak for {name}: pass --peak-flops")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--variants",
        default="forward,unembed,shift,naive,transformer_lens",
        help=f"comma-separated, from {','.join(ALL_VARIANTS)}",
    )
    parser.add_argument("--bf16-screen", action="store_true", help="add shift-bf16 (bf16 screening matmul)")
    parser.add_argument("--no-memory", action="store_true", help="skip the extra-peak-memory subprocesses")
    parser.add_argument("--memory-repeats", type=int, default=1, help="fresh processes per variant (median)")
    parser.add_argument("--cuda", action="store_true", help="also run on the GPU with a bf16 model")
    parser.add_argument("--cuda-batch", type=int, default=SHAPE["batch"])
    parser.add_argument("--cuda-rounds", type=int, default=10)
    parser.add_argument("--peak-flops", type=float, default=0.0, help="bf16 peak FLOP/s of the GPU")
    parser.add_argument("--profile", action="store_true", help="torch.profiler tables of the shift variants")
    parser.add_argument("--measure-memory", metavar="VARIANT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_memory:
        memory_child(args.measure_memory, args.threads)
        return
    names = [n for n in args.variants.split(",") if n]
    if args.bf16_screen and "shift-bf16" not in names:
        names.append("shift-bf16")
    unknown = sorted(set(names) - set(ALL_VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; allowed: {', '.join(ALL_VARIANTS)}")
    cpu_benchmark(args, names)
    if args.cuda:
        if torch.cuda.is_available():
            cuda_benchmark(args, names)
        else:
            print("--cuda: no CUDA device here; GPU run skipped")


if __name__ == "__main__":
    main()
