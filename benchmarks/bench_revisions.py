"""`shift` (or `simulate`) of one git revision against another, measured side by side here.

    python benchmarks/bench_revisions.py --base 896a7d7            # base revision vs the working tree
    python benchmarks/bench_revisions.py --base A --head B --processes 8
    python benchmarks/bench_revisions.py --base /path/to/tree   # an exported tree: git archive REV
    python benchmarks/bench_revisions.py --base 0739c62 --workload simulate --threads 1

Each revision is checked out into a temporary git worktree (the working tree itself stands
for `--head` when none is given); a directory given instead of a revision is used as it is
(where there is no git history, e.g. on a remote machine). Fresh processes alternate between
the two revisions (base, head, head, base, ...), so drift of a shared machine falls on both
alike; each process imports its revision's `resstream` (PYTHONPATH) and its revision's
`benchmarks/bench_shift.py`, builds the GPT-2-small-shaped model and batch there, and times
the `forward` and `shift` variants (`bench_shift.measure`: one warm-up, then interleaved
rounds, median), on the CPU with an fp32 model or, with `--device cuda`, on the GPU with a
bf16 model as `bench_shift.py --cuda` does. Printed: per process its shift/forward ratio,
then the median head/base ratio of shift/forward (the machine-independent figure) and of raw
shift time over adjacent pairs.

`--workload simulate` times `resstream.simulation.simulate` with the default `SimulationConfig`
(100,000 simulations × 10 tokens × 6 layers, LayerNorm, γ = 0) instead: one small warm-up, then
the median of `--rounds` runs per process; printed is the raw head/base time over adjacent
pairs (no machine-independent denominator exists for it, so the alternation carries the load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, statistics, sys, torch
sys.path.insert(0, sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
import bench_shift as b
device = torch.device(sys.argv[4])
dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # as bench_shift --cuda
setup = b.build_setup(device, dtype, b.SHAPE["batch"], b.SHAPE["seq"])
variants, _ = b.make_variants(setup, ["forward", "shift"])
times, _ = b.measure(variants, rounds=int(sys.argv[3]), device=device)
print(json.dumps({name: statistics.median(values) for name, values in times.items()}))
"""

CHILD_SIMULATE = """
import json, statistics, sys, time, torch
torch.set_num_threads(int(sys.argv[2]))
from resstream.simulation import SimulationConfig, simulate
simulate(SimulationConfig(simulations=1000))  # warm-up
times = []
for _ in range(int(sys.argv[3])):
    start = time.perf_counter()
    simulate(SimulationConfig())
    times.append(time.perf_counter() - start)
print(json.dumps({"simulate": statistics.median(times)}))
"""

CHILDREN = {"shift": CHILD, "simulate": CHILD_SIMULATE}


def checkout(revision: str, into: Path) -> Path:
    """A detached worktree of `revision` at `into` (an existing directory: itself)."""
    if Path(revision).is_dir():
        return Path(revision).resolve()
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(into), revision], check=True
    )
    return into


def time_revision(
    tree: Path, threads: int, rounds: int, device: str, workload: str = "shift"
) -> dict[str, float]:
    """Median seconds of the workload's variants (`forward` and `shift`, or `simulate`) in a
    fresh process running `tree`'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILDREN[workload],
            str(tree / "benchmarks"),
            str(threads),
            str(rounds),
            device,
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--head", help="the revision measured (default: the working tree)")
    parser.add_argument("--processes", type=int, default=6, help="processes per revision")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per process")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (fp32 model) or cuda (bf16 model)")
    parser.add_argument("--workload", choices=sorted(CHILDREN), default="shift", help="what is timed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"base": checkout(args.base, Path(scratch) / "base")}
        trees["head"] = checkout(args.head, Path(scratch) / "head") if args.head else ROOT
        try:
            runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
            for index in range(args.processes):
                order = ("base", "head") if index % 2 == 0 else ("head", "base")
                for name in order:
                    timing = time_revision(trees[name], args.threads, args.rounds, args.device, args.workload)
                    runs[name].append(timing)
                    print(f"{name} process {len(runs[name])}: " + describe(timing))
        finally:
            for name in ("base", "head"):
                if trees[name].is_relative_to(scratch):
                    subprocess.run(
                        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees[name])]
                    )
    report(runs, args)


def describe(timing: dict[str, float]) -> str:
    """One process's times (and shift/forward where both were timed)."""
    text = ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in timing.items())
    if "forward" in timing:
        text += f", shift/forward {timing['shift'] / timing['forward']:.2f}x"
    return text


def report(runs: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    if args.workload == "simulate":
        pairs = [h["simulate"] / b["simulate"] for h, b in zip(runs["head"], runs["base"], strict=True)]
        print(
            f"\nraw simulate time head/base over adjacent pairs: median {statistics.median(pairs):.3f} "
            f"(min {min(pairs):.3f}, max {max(pairs):.3f}, {len(pairs)} pairs)"
        )
        return
    ratio = {name: [r["shift"] / r["forward"] for r in timings] for name, timings in runs.items()}
    relative = statistics.median(ratio["head"]) / statistics.median(ratio["base"])
    pairs = [h["shift"] / b["shift"] for h, b in zip(runs["head"], runs["base"], strict=True)]
    head = args.head or "working tree"
    print(
        f"\nshift/forward: base {args.base} {statistics.median(ratio['base']):.2f}x, "
        f"head {head} {statistics.median(ratio['head']):.2f}x -> head/base {relative:.3f}"
    )
    print(
        f"raw shift time head/base over adjacent pairs: median {statistics.median(pairs):.3f} "
        f"(min {min(pairs):.3f}, max {max(pairs):.3f}, {len(pairs)} pairs)"
    )


if __name__ == "__main__":
    main()
