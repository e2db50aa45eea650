"""Information-flow routes on a GPT-2-small-shaped model (random weights, fp32): issue 27, item 5.

`transformers.GPT2Config()` (12 layers, 12 heads, d 768, vocabulary 50257; `--layers` changes
the depth), eval mode, one random prompt of `--seq-len` tokens (128), the route of the prediction
at its last position. Side by side in one run, every variant once as warm-up, then once per round
in rotating order (`--rounds`), medians:

* `forward`: a plain forward `model(ids)` (full logits) under `torch.inference_mode()` — the
  yardstick; `trunk forward`: `model.transformer(ids)` (no logits), for reference;
* `whole route`: `block_internals(view, ids, attention=True)` + `flow_importances(view,
  internals)` + `route_edges(imp, T − 1, 0.04)` — what `resstream.routes` computes before it
  describes the nodes; target ≤ 3× the forward;
* its parts, each timed alone on the previous part's output: `internals` (one recorded
  forward with attention probabilities), `importances` (every node's proximity importances,
  `--budget` bytes of source proximities at a time), `edges` (the route kept above τ).

Ratios to the forward: of the medians (the headline), the median of each round's own ratio
(robust to the machine's load changing between rounds), and of the fastest round of each (the
least disturbed, on a shared machine). The 1-minute load average is printed beside them.

Peak memory of the importance pass (CPU): each row in a fresh subprocess (`--memory-probe`)
that builds the model and the recorded internals, hands freed heap pages back to the OS
(`malloc_trim`), resets the peak resident set (`/proc/self/clear_refs`), runs `flow_importances`
once and reads the new peak (VmHWM) minus the resident set before it. The child runs with
glibc's mmap threshold fixed at 64 KiB (`MALLOC_MMAP_THRESHOLD_`), so every tensor buffer larger
than that is its own mapping, returned to the OS when freed: the resident set then follows the
live tensor bytes instead of what malloc kept from earlier allocations. A calibration line shows
the method reading a tensor of known size. (`tracemalloc` cannot do this: torch allocates tensor
memory outside Python's allocator.) The rows vary the depth and the budget: a pass that held
every layer's terms would grow with the layers; one that holds a layer at a time grows only by
the result it returns (L·T·H·T float32). Beside them, what `flow_importances` says it holds per
layer (its module docstring): `vectors`, the layer's (H, T, d) float32 source vectors, and
`block`, the (H, N, T) float32 source proximities of the N query positions `--budget` groups
together; and what materialising the (H, T, T, d) terms of one layer, and of all layers, takes.
On CUDA the allocator's own peak (`torch.cuda.max_memory_allocated`) is read in-process instead.

    python benchmarks/bench_routes.py                      # CPU, ~1 min on 2 cores
    python benchmarks/bench_routes.py --quick              # 2 layers, 32 tokens, 1 round
    python benchmarks/bench_routes.py --device cuda --json $OUT/bench_routes.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from harness import (
    cuda_peak_growth,
    device_name,
    interleaved,
    load_average,
    medians,
    peak_growth,
    random_gpt2,
    round_ratios,
    write_record,
)
from resstream.analysis.routes import DEFAULT_MEMORY_BUDGET, DEFAULT_THRESHOLD, flow_importances, route_edges
from resstream.capture import block_internals
from resstream.models.adapters import view_of

#: The issue's target: the whole route graph in at most this many plain forwards.
TARGET_RATIO = 3.0
#: glibc's mmap threshold in the memory probes (bytes): larger buffers are their own mappings.
MMAP_THRESHOLD = 64 * 1024
#: Size of the tensor the memory probe calibrates itself on.
CALIBRATION_BYTES = 256 * 2**20
MIB = 2**20


# ---------------------------------------------------------------- setup


def random_prompt(seq_len: int, vocab: int, device: str) -> torch.Tensor:
    """(1, seq_len) random token ids (seed 1)."""
    ids = torch.randint(0, vocab, (1, seq_len), generator=torch.Generator().manual_seed(1))
    return ids.to(device)


# ---------------------------------------------------------------- timing


def timing_section(args: argparse.Namespace, model: Any, ids: torch.Tensor) -> dict[str, Any]:
    """The whole route and its parts against a plain forward, interleaved (module docstring)."""
    view = view_of(model)
    target = ids.shape[1] - 1
    internals = block_internals(view, ids, attention=True)
    imp = flow_importances(view, internals, memory_budget=args.budget)

    def forward() -> Any:
        with torch.inference_mode():
            return model(ids)

    def trunk() -> Any:
        with torch.inference_mode():
            return model.transformer(ids)

    def whole() -> Any:
        recorded = block_internals(view, ids, attention=True)
        found = flow_importances(view, recorded, memory_budget=args.budget)
        return route_edges(found, target, args.threshold)

    variants: dict[str, Callable[[], Any]] = {
        "forward": forward,
        "trunk forward": trunk,
        "whole route": whole,
        "internals": lambda: block_internals(view, ids, attention=True),
        "importances": lambda: flow_importances(view, internals, memory_budget=args.budget),
        "edges": lambda: route_edges(imp, target, args.threshold),
    }
    load_before = load_average()
    seconds, _ = interleaved(variants, args.rounds, args.device, report=".3f")
    load_after = load_average()
    middle = medians(seconds)
    yardstick = middle["forward"]
    edges = route_edges(imp, target, args.threshold)
    heads = sum(1 for k in range(len(edges)) if edges.kind(k) == "head")
    print(
        f"\nroute of the prediction at position {target}, τ = {args.threshold:g}: {len(edges)} edges "
        f"({heads} through heads); medians of {args.rounds} rounds"
    )
    fastest = {name: min(times) for name, times in seconds.items()}
    per_round = {name: statistics.median(round_ratios(seconds, name, "forward")) for name in seconds}
    print(
        f"{'variant':<16} {'s (median)':>11} {'÷ forward':>10} {'per-round ÷':>12} "
        f"{'s (fastest)':>12} {'÷ forward':>10}"
    )
    for name, value in middle.items():
        print(
            f"{name:<16} {value:>11.4f} {value / yardstick:>10.2f} {per_round[name]:>12.2f} "
            f"{fastest[name]:>12.4f} {fastest[name] / fastest['forward']:>10.2f}"
        )
    parts = middle["internals"] + middle["importances"] + middle["edges"]
    ratio = middle["whole route"] / yardstick
    verdict = "met" if ratio <= TARGET_RATIO else f"MISSED by {ratio / TARGET_RATIO:.2f}×"
    print(f"sum of the parts {parts:.4f} s = {parts / yardstick:.2f}× the forward (medians)")
    print(
        f"whole route: {ratio:.2f}× a plain forward (medians; target ≤ {TARGET_RATIO:g}×: {verdict}); "
        f"median of the per-round ratios {per_round['whole route']:.2f}×, fastest rounds "
        f"{fastest['whole route'] / fastest['forward']:.2f}×"
    )
    if not args.device.startswith("cuda"):
        busy = max(load_before, load_after) > (os.cpu_count() or 1)
        print(
            f"load average {load_before:.1f} → {load_after:.1f} on {os.cpu_count()} cores"
            + (
                ": cores oversubscribed, the variants slowed unevenly (see the rounds); rerun quiet"
                + (" or with --threads 1" if torch.get_num_threads() > 1 else "")
                if busy
                else ""
            )
        )
    return {
        "seconds": seconds,
        "median_seconds": middle,
        "ratio_whole_to_forward": ratio,
        "ratios_to_forward": {name: value / yardstick for name, value in middle.items()},
        "median_per_round_ratios": per_round,
        "fastest_seconds": fastest,
        "edges": len(edges),
        "head_edges": heads,
        "load_average": [load_before, load_after],
    }


# ---------------------------------------------------------------- memory


def term_bytes(layers: int, heads: int, seq_len: int, d_model: int) -> int:
    """Bytes of `layers` layers' (H, T, T, d) float32 attention terms."""
    return layers * heads * seq_len * seq_len * d_model * 4


def block_bytes(heads: int, seq_len: int, budget: int) -> int:
    """Bytes of the largest (H, N, T) float32 block of source proximities the budget allows (N
    query positions, at least one and at most T), as `flow_importances` groups them."""
    per_query = heads * seq_len * 4
    return max(1, min(seq_len, budget // per_query)) * per_query


def vector_bytes(heads: int, seq_len: int, d_model: int) -> int:
    """Bytes of one layer's (H, T, d) float32 source vectors."""
    return heads * seq_len * d_model * 4


def result_bytes(layers: int, heads: int, seq_len: int) -> int:
    """Bytes of the importances returned: (L, T, H, T) heads and four (L, T) float32 tensors."""
    return (layers * seq_len * heads * seq_len + 4 * layers * seq_len) * 4


def memory_probe(args: argparse.Namespace) -> None:
    """In a fresh process: the calibration and the peak growth of one importance pass; prints
    one JSON line."""
    calibration, _ = peak_growth(lambda: torch.ones(CALIBRATION_BYTES // 4).sum())
    model = random_gpt2("cpu", n_layer=args.layers)
    view = view_of(model)
    ids = random_prompt(args.seq_len, model.config.vocab_size, "cpu")
    internals = block_internals(view, ids, attention=True)
    grown, imp = peak_growth(lambda: flow_importances(view, internals, memory_budget=args.budget))
    print(json.dumps({"calibration": calibration, "peak": grown, "layers": imp.n_layers}))


def probe_in_child(args: argparse.Namespace, layers: int, budget: int) -> dict[str, Any]:
    """Run `memory_probe` in a fresh process (module docstring) and read its JSON line."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--memory-probe",
        "--layers",
        str(layers),
        "--seq-len",
        str(args.seq_len),
        "--budget",
        str(budget),
    ]
    env = dict(
        os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD), OMP_NUM_THREADS=str(torch.get_num_threads())
    )
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cuda_peak(args: argparse.Namespace, layers: int, budget: int) -> dict[str, Any]:
    """The CUDA allocator's peak above its level before one importance pass."""
    model = random_gpt2(args.device, n_layer=layers)
    view = view_of(model)
    internals = block_internals(
        view, random_prompt(args.seq_len, model.config.vocab_size, args.device), attention=True
    )
    grown, _ = cuda_peak_growth(partial(flow_importances, view, internals, memory_budget=budget), args.device)
    del model, view, internals
    torch.cuda.empty_cache()
    return {"calibration": None, "peak": grown, "layers": layers}


def memory_rows(args: argparse.Namespace, heads: int) -> list[tuple[int, int]]:
    """(layers, budget) of each memory row: the full depth, a shallow model at the same budget,
    and the full depth with blocks of T/16 query positions (at least one)."""
    small = block_bytes(heads, args.seq_len, heads * args.seq_len * 4 * max(1, args.seq_len // 16))
    rows = [
        (args.layers, args.budget),
        (min(2, args.layers), args.budget),
        (args.layers, small),
    ]
    return list(dict.fromkeys(rows))


def memory_section(args: argparse.Namespace, heads: int, d_model: int) -> dict[str, Any]:
    """Peak memory of the importance pass per (layers, budget) row (module docstring)."""
    on_cuda = args.device.startswith("cuda")
    if not on_cuda and not Path("/proc/self/clear_refs").exists():
        print("\nmemory: skipped (needs Linux's /proc/self/clear_refs)")
        return {"skipped": "no /proc/self/clear_refs"}
    T = args.seq_len
    found = []
    for layers, budget in memory_rows(args, heads):
        row = cuda_peak(args, layers, budget) if on_cuda else probe_in_child(args, layers, budget)
        row |= {
            "budget": budget,
            "result": result_bytes(layers, heads, T),
            "block": block_bytes(heads, T, budget),
            "vectors": vector_bytes(heads, T, d_model),
        }
        found.append(row)
    how = "CUDA allocator peak" if on_cuda else "peak RSS growth (VmHWM − VmRSS before, fresh process)"
    print(f"\npeak memory of flow_importances, {T} tokens, {heads} heads, d {d_model}: {how}")
    if found[0]["calibration"] is not None:
        seen = found[0]["calibration"] / MIB
        print(f"calibration: a {CALIBRATION_BYTES / MIB:.0f} MiB tensor reads as {seen:.0f} MiB")
    print(
        f"{'layers':>6} {'budget MiB':>11} {'vectors MiB':>12} {'block MiB':>10} {'result MiB':>11} "
        f"{'peak MiB':>9}"
    )
    for row in found:
        print(
            f"{row['layers']:>6} {row['budget'] / MIB:>11.2f} {row['vectors'] / MIB:>12.1f} "
            f"{row['block'] / MIB:>10.2f} {row['result'] / MIB:>11.1f} {row['peak'] / MIB:>9.1f}"
        )
    beyond = [row["peak"] - row["result"] for row in found]
    listed = ", ".join(
        f"{extra / MIB:.1f} MiB ({row['layers']} layers, budget {row['budget'] / MIB:.3g} MiB)"
        for extra, row in zip(beyond, found, strict=True)
    )
    print(f"peak beyond the result returned: {listed}")
    one_layer = term_bytes(1, heads, T, d_model)
    all_layers = term_bytes(args.layers, heads, T, d_model)
    print(
        f"materialised (H, T, T, d) float32 terms: one layer {one_layer / MIB:.0f} MiB, "
        f"all {args.layers} layers {all_layers / MIB:.0f} MiB; the largest peak beyond the result is "
        f"{max(beyond) / one_layer:.1%} of one layer's, {max(beyond) / all_layers:.2%} of all layers'"
    )
    return {
        "rows": found,
        "one_layer_terms": one_layer,
        "all_layer_terms": all_layers,
    }


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--layers", type=int, default=12, help="layers of the GPT-2-small shape (default 12)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after the warm-ups (default 5)")
    parser.add_argument(
        "--budget", type=int, default=DEFAULT_MEMORY_BUDGET, help="flow_importances' memory_budget, bytes"
    )
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="τ of route_edges")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--quick", action="store_true", help="2 layers, 32 tokens, 1 round")
    parser.add_argument("--skip-memory", action="store_true", help="timings only")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.seq_len, args.rounds = min(args.layers, 2), min(args.seq_len, 32), 1
    if args.seq_len < 1 or args.layers < 1 or args.rounds < 1 or args.budget < 1:
        parser.error("--seq-len, --layers, --rounds and --budget must be positive")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        memory_probe(args)
        return
    model = random_gpt2(args.device, n_layer=args.layers)
    config = model.config
    ids = random_prompt(args.seq_len, config.vocab_size, args.device)
    name = device_name(args.device)
    print(
        f"device {args.device} ({name}), torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"dtype {next(model.parameters()).dtype}; GPT-2-small shape ({config.n_layer} layers, "
        f"{config.n_head} heads, d {config.n_embd}), random weights, {args.seq_len} tokens, "
        f"memory_budget {args.budget / MIB:g} MiB"
    )
    record: dict[str, Any] = {
        "device": args.device,
        "device_name": name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "layers": config.n_layer,
        "seq_len": args.seq_len,
        "budget": args.budget,
        "timing": timing_section(args, model, ids),
    }
    del model
    if not args.skip_memory:
        record["memory"] = memory_section(args, config.n_head, config.n_embd)
    if args.json:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
