"""The measurements behind the constants of the up-front budget checks (issue 9).

    python benchmarks/bench_budget.py                  # CPU (and CUDA when present), ~2 min
    python benchmarks/bench_budget.py --skip-training

Prints, per device:

- simulation: work units per second of `resstream.simulation.simulate` for several
  (tokens, layers), with work as `resstream.simulation.config.simulation_work` counts it; the
  fastest rate seen is what `WORK_RATE_BOUND` must stay above (time estimates are lower
  bounds);
- training: seconds per step of a tiny model (the floor `MIN_STEP_SECONDS` must stay below)
  and of a GPT-2-small-shaped model (FLOP/s reached, which `PEAK_FLOPS_BOUND` must exceed),
  with the peak memory torch allocated next to `training_bytes` (which must stay below it on
  CUDA, where the allocator's peak is measurable);
- memory: what `resstream.resources.available_bytes` reports.
"""

from __future__ import annotations

import argparse
import tempfile
from functools import partial
from pathlib import Path

import torch

from harness import seconds
from resstream.resources import available_bytes, format_bytes, usable_cpus
from resstream.simulation import SimulationConfig, simulate
from resstream.simulation.config import simulation_work
from resstream.training.budget import training_bytes, training_seconds
from resstream.training.config import build_config
from resstream.training.loop import Trainer

SIMULATIONS = ((10, 6, 100_000), (32, 6, 10_000), (64, 12, 2_000), (128, 4, 1_000), (256, 2, 200))
TRAIN_SHAPES = {
    "tiny": {"n_layer": 2, "n_head": 2, "d_model": 16, "block_size": 16, "batch_size": 4},
    "gpt2-small": {"n_layer": 12, "n_head": 12, "d_model": 768, "block_size": 1024, "batch_size": 8},
}


def bench_simulation(device: str) -> None:
    best = 0.0
    for tokens, layers, sims in SIMULATIONS:
        config = SimulationConfig(tokens=tokens, layers=layers, simulations=sims, device=device)
        simulate(SimulationConfig(tokens=tokens, layers=layers, simulations=64, device=device))
        took = seconds(lambda config=config: simulate(config), device)
        rate = simulation_work(config) / took
        best = max(best, rate)
        print(f"  simulate n={tokens:4d} L={layers:3d} sims={sims:7d}: {took:6.2f} s, {rate:.3g} units/s")
    print(f"  fastest simulation rate on {device}: {best:.3g} units/s")


def bench_training(device: str, workdir: Path) -> None:
    corpus = workdir / "corpus.txt"
    words = [
        "the",
        "residual",
        "stream",
        "carries",
        "each",
        "token",
        "forward",
        "while",
        "attention",
        "mixes",
        "positions",
    ]
    corpus.write_text(
        "\n".join(" ".join(words[(i + j) % len(words)] for j in range(40)) for i in range(20_000))
    )
    for name, shape in TRAIN_SHAPES.items():
        values = {
            **shape,
            "dataset": str(corpus),
            "bpe_vocab_size": 4096,
            "device": device,
            "max_steps": 10**6,
            "cache_dir": str(workdir / "cache"),
            "compile": "off",
        }
        config = build_config(values)
        trainer = Trainer(config, workdir / f"run-{name}-{device}", progress=False)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        times = [seconds(partial(one_step, trainer, step), device) for step in range(8)]
        step = min(times[2:])
        flops = trainer.model.flops_per_token() * config.run.batch_size * config.model.block_size / step
        estimate = sum(c.amount for c in training_bytes(trainer.config, trainer.device))
        bound = training_seconds(trainer.config, trainer.device)[0].amount / config.run.max_steps
        line = f"  train {name:10s}: {step * 1e3:8.2f} ms/step (estimated >= {bound * 1e3:.3g} ms)"
        line += f", {flops:.3g} FLOP/s"
        if device.startswith("cuda"):
            peak = torch.cuda.max_memory_allocated()
            line += f"; peak allocated {format_bytes(peak)}, estimated {format_bytes(estimate)}"
        print(line)
        del trainer


def one_step(trainer: Trainer, step: int) -> None:
    """One training step and its optimiser step."""
    trainer.train_step(step)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-simulation", action="store_true")
    args = parser.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"{usable_cpus()} usable CPUs, {torch.get_num_threads()} torch threads")
    for device in devices:
        print(f"{device}: {format_bytes(available_bytes(device))} available")
        if not args.skip_simulation:
            bench_simulation(device)
        if not args.skip_training:
            with tempfile.TemporaryDirectory() as workdir:
                bench_training(device, Path(workdir))


if __name__ == "__main__":
    main()
