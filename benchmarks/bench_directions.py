"""Directions at every layer from 2 × 256 texts against the forwards that read their states.

    python benchmarks/bench_directions.py                       # reference model, CPU
    python benchmarks/bench_directions.py --model gpt2-small    # GPT-2 small's shape, random weights
    python benchmarks/bench_directions.py --model gpt2-small --device cuda

The texts are the built-in concept comedy-tragedy (256 passages a set). Two variants, timed in
interleaved rounds on one model held in memory: `forwards`, the forward passes alone that
`resstream.directions` runs (the same batches of right-padded texts, shortest first, each
recording h_0..h_L with `resstream.capture.residual_states`), and `directions`, the whole call
(tokenisation, those forwards, the reduction by the position rule and every method at every
layer). The target (issue): directions ≤ 1.3 × forwards. GPT-2 small's shape reads the
reference model's tokenizer (vocabulary 4096).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

import resstream
from harness import interleaved, random_gpt2, round_ratios, write_record
from resstream.api.directions import _encoded, contrast_texts
from resstream.capture import residual_states
from resstream.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("reference", "gpt2-small"), default="reference")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--position", choices=("last", "mean"), default="last")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    reference = load_model(None, device=args.device)
    tokenizer = reference.tokenizer
    model = (
        reference.model if args.model == "reference" else random_gpt2(args.device, vocab_size=len(tokenizer))
    )
    view = resstream.models.view_of(model)
    texts = contrast_texts(None, None, concept="comedy-tragedy")
    encoded = _encoded(tokenizer, texts, view)
    batches = _batches(encoded, args.batch_size, masked=view.family != "resstream")

    def forwards() -> None:
        for ids, mask in batches:
            residual_states(view, ids, mask)

    def directions() -> resstream.analysis.steering.DirectionsResult:
        return resstream.directions(
            model,
            texts.positive,
            texts.negative,
            position=args.position,
            tokenizer=tokenizer,
            batch_size=args.batch_size,
        )

    times, results = interleaved({"forwards": forwards, "directions": directions}, args.rounds, args.device)
    ratios = round_ratios(times, "directions", "forwards")
    tokens = sum(len(ids) for ids, _ in encoded)
    print(
        f"{args.model} ({view.n_layers} layers, d {view.d_model}) on {args.device}, torch threads "
        f"{torch.get_num_threads()}: {len(encoded)} texts, {tokens} tokens, batch {args.batch_size}, "
        f"position {args.position}"
    )
    for name, values in times.items():
        listed = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {name:<10} median {statistics.median(values):.3f} s  ({listed})")
    listed = ", ".join(f"{r:.2f}" for r in ratios)
    print(
        f"  directions / forwards: median {statistics.median(ratios):.2f} (per round {listed}); target <= 1.3"
    )
    print(f"  best: {results['directions'].best()}")
    if args.json:
        write_record(
            args.json, {"model": args.model, "device": args.device, "times": times, "ratios": ratios}
        )


def _batches(encoded, batch_size: int, masked: bool) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The batches `resstream.directions` runs: shortest first, right-padded, with the mask of
    the real tokens where the model takes one."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    found = []
    for start in range(0, len(order), batch_size):
        chunk = [encoded[i][0] for i in order[start : start + batch_size]]
        ids = torch.zeros((len(chunk), max(len(t) for t in chunk)), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, text in enumerate(chunk):
            ids[row, : len(text)], mask[row, : len(text)] = text, 1
        found.append((ids, mask if masked else None))
    return found


if __name__ == "__main__":
    main()
