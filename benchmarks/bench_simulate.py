"""Speed of the attention simulation (`resstream.simulation.simulate`), side by side in one process.

    python benchmarks/bench_simulate.py                 # d = 64, 256, 1024 on 2 threads (~1 min)
    python benchmarks/bench_simulate.py --dims 64 --threads 1
    python benchmarks/bench_simulate.py --with-embeddings   # adds the `embeddings` column (slow)
    python benchmarks/bench_simulate.py --chunks        # chunk-size sweep at d = 64 instead

Workload: 100,000 simulations × 10 tokens × 6 layers, LayerNorm on, no residual, γ = 0 (the
`SimulationConfig` defaults). Variants:

- `chunked`: `simulate` as shipped (Gram sampling, `DEFAULT_CHUNK_SIZE` simulations per chunk).
- `plain`: the same code with every simulation in one chunk (chunk_size = simulations): the
  plain batched version, whose buffers do not fit in cache.
- `loop`: `simulate_reference`, the straightforward per-simulation Python loop in feature
  space, timed on `--loop-simulations` (1,000) simulations, or as many batches of 100 as fit
  in `--loop-budget` seconds, and scaled linearly to the full count.
- `embeddings` (with --with-embeddings): chunked, but drawing the (tokens + 1) × d embeddings
  themselves (sampling="embeddings") instead of their Gram matrix: the cost of explicit
  inputs, which grows with d (the Gram-space layers themselves do not depend on d); at
  d = 1024 that is 1.1·10⁹ normals per run.

Variants run in interleaved rounds (A B C D, then B C D A, ...) so slow drift of a shared
machine hits all alike; each figure is the median over rounds. The load average is printed
before and after: on a shared machine two threads can stall on each other (OpenMP barriers
with a busy core), so compare ratios taken in one run, and rerun with --threads 1 to see it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace

import torch

from harness import load_average, medians, rounds_of, seconds
from resstream.simulation import (
    DEFAULT_CHUNK_SIZE,
    SimulationConfig,
    simulate,
    simulate_reference,
)


def scaled_loop_seconds(config: SimulationConfig, at_most: int, budget: float) -> float:
    """Time of `simulate_reference` per simulation × config.simulations, measured on batches
    of 100 simulations (different seeds) until `at_most` are done or `budget` seconds spent."""
    done, spent = 0, 0.0
    while done < at_most and (done == 0 or spent < budget):
        batch = replace(config, simulations=100, seed=config.seed + done)
        spent += seconds(lambda batch=batch: simulate_reference(batch))
        done += 100
    return spent / done * config.simulations


def dimension_variants(config: SimulationConfig, args: argparse.Namespace) -> dict[str, Callable[[], float]]:
    variants = {
        "chunked": lambda: seconds(lambda: simulate(config)),
        "plain": lambda: seconds(lambda: simulate(replace(config, chunk_size=config.simulations))),
        "loop": lambda: scaled_loop_seconds(config, args.loop_simulations, args.loop_budget),
    }
    if args.with_embeddings:
        explicit = replace(config, sampling="embeddings")
        variants["embeddings"] = lambda: seconds(lambda: simulate(explicit))
    return variants


def compare_dimensions(args: argparse.Namespace) -> None:
    print(
        f"{args.simulations:,} simulations × {args.tokens} tokens × {args.layers} layers, "
        f"LayerNorm, chunk {DEFAULT_CHUNK_SIZE}; loop timed on up to {args.loop_simulations:,} "
        f"simulations ({args.loop_budget:g} s) and scaled; median of {args.rounds} rounds (seconds)"
    )
    extra = f" {'embeddings':>11}" if args.with_embeddings else ""
    print(
        f"{'d':>6} {'chunked':>9} {'plain':>9} {'loop*':>9}{extra} {'plain/chunked':>14} {'loop/chunked':>13}"
    )
    for dim in args.dims:
        config = SimulationConfig(
            layers=args.layers, tokens=args.tokens, dim=dim, simulations=args.simulations
        )
        simulate(replace(config, simulations=2 * DEFAULT_CHUNK_SIZE))  # warm-up
        t = medians(rounds_of(dimension_variants(config, args), args.rounds))
        extra = f" {t['embeddings']:>11.3f}" if args.with_embeddings else ""
        print(
            f"{dim:>6} {t['chunked']:>9.3f} {t['plain']:>9.3f} {t['loop']:>9.1f}{extra}"
            f" {t['plain'] / t['chunked']:>14.2f} {t['loop'] / t['chunked']:>13.0f}",
            flush=True,
        )
    print("* loop: scaled from the timed simulations")


def compare_chunk_sizes(args: argparse.Namespace) -> None:
    config = SimulationConfig(layers=args.layers, tokens=args.tokens, simulations=args.simulations)
    sizes = [512, 1024, 2048, 4096, 8192, 16384, args.simulations]
    simulate(replace(config, simulations=8192))  # warm-up
    variants = {
        str(size): (lambda size=size: seconds(lambda: simulate(replace(config, chunk_size=size))))
        for size in sizes
    }
    t = medians(rounds_of(variants, args.rounds))
    print(f"d = {config.dim}, median of {args.rounds} rounds (seconds)")
    for size in sizes:
        marker = "  <- default" if size == DEFAULT_CHUNK_SIZE else ""
        print(f"chunk {size:>7}: {t[str(size)]:.3f}{marker}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--simulations", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=10)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--loop-simulations", type=int, default=1000)
    parser.add_argument("--loop-budget", type=float, default=5.0, help="seconds per loop timing")
    parser.add_argument("--with-embeddings", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunks", action="store_true", help="sweep chunk sizes at d = 64")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load_average():.2f}")
    if args.chunks:
        compare_chunk_sizes(args)
    else:
        compare_dimensions(args)
    print(f"load average {load_average():.2f}")


if __name__ == "__main__":
    main()
