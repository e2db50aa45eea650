"""Benchmark `attribute` on a GPT-2-small-shaped model (random weights, vocab 50257), fp32.

Side by side in one run:
* one position, every level on (all 12 × 3072 neurons scored exactly) against its arithmetic
  floor — the projection of every value vector into the vocabulary, L·d_ff·V·d multiply-adds,
  timed as the bare matrix products — and against the straightforward loop (one final norm +
  unembedding + log-softmax per neuron), timed on `--loop-neurons` neurons and scaled to all;
* corpus mode on `--num-seqs` × `--seq-len` tokens against one plain forward of the same
  tokens, with the extra peak memory (RSS) of the attribution.

    python benchmarks/bench_attribute.py [--num-seqs 64] [--seq-len 128] [--batch-size 8] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial

import torch

from harness import peak_growth, random_gpt2, round_ratios, rounds_of, seconds
from resstream.analysis.attribution.contributions import log_probs_of
from resstream.analysis.attribution.corpus import attribute_batches
from resstream.analysis.attribution.scores import Levels, attribute_position
from resstream.analysis.decoding.decoder import decoder_of
from resstream.capture import block_internals
from resstream.models.adapters import view_of


def floor_seconds(view, lp, device: str) -> float:
    """The bare vocabulary projection of every layer's value vectors (L·d_ff·V·d multiply-adds)."""

    def run() -> None:
        for block in view.blocks:
            W_out = block.mlp_weights().W_out.detach()
            for start in range(0, W_out.shape[0], 512):
                torch.addmm(lp.offset, W_out[start : start + 512], lp.weighted.T)

    return seconds(run, device)


def loop_seconds_per_neuron(view, decoder, internals, position: int, target: int, count: int) -> float:
    rec = internals.blocks[0]
    x = rec.block_output[0, position]
    W_out = view.blocks[0].mlp_weights().W_out.detach()
    m = rec.coefficients[0, position]

    def loop() -> None:
        with torch.no_grad():
            for k in range(count):
                decoder.logits(x + m[k] * W_out[k]).log_softmax(-1)[target]

    return seconds(loop, x.device) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--loop-neurons", type=int, default=64)
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds of the one-position timings"
    )
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    model = random_gpt2(args.device)
    view = view_of(model)
    decoder = decoder_of(view)
    lp = log_probs_of(decoder)
    ids = torch.randint(0, 50257, (1, args.seq_len), generator=torch.Generator().manual_seed(1))
    internals = block_internals(view, ids, attention=True)
    position, target = args.seq_len - 1, 13
    n_neurons = sum(b.mlp_weights().d_ff for b in view.blocks)
    print(f"device {args.device}, threads {torch.get_num_threads()}, GPT-2 small shape, {n_neurons} neurons")
    generator = torch.Generator().manual_seed(10)
    batches = [
        torch.randint(
            0, 50257, (min(args.batch_size, args.num_seqs - start), args.seq_len), generator=generator
        )
        for start in range(0, args.num_seqs, args.batch_size)
    ]
    before = seconds(lambda: [model.transformer(b.to(args.device)) for b in batches], args.device)
    work = partial(
        attribute_batches, view, decoder, batches, partial(block_internals, view), top=20, candidates=64
    )
    grown, corpus = peak_growth(lambda: seconds(work, args.device))
    after = seconds(lambda: [model.transformer(b.to(args.device)) for b in batches], args.device)
    forward = (before + after) / 2
    print(
        f"corpus {args.num_seqs} x {args.seq_len}: {corpus:.1f} s vs plain forward {forward:.2f} s "
        f"(mean of before and after) = {corpus / forward:.0f}x; peak RSS grew by {grown / 2**20:.0f} MB "
        f"(over the model and one sequence's internals)"
    )
    one, loop = "one position", f"loop (from {args.loop_neurons} neurons)"
    measures = {  # each times itself: the loop is scaled from its sample of neurons
        one: lambda: seconds(
            lambda: attribute_position(view, internals, decoder, position, target, levels=Levels(top=20)),
            args.device,
        ),
        "floor": lambda: floor_seconds(view, lp, args.device),
        loop: lambda: (
            loop_seconds_per_neuron(view, decoder, internals, position, target, args.loop_neurons) * n_neurons
        ),
    }
    times = rounds_of(measures, args.rounds, report=".1f")
    print(
        f"one position, every level: median {statistics.median(times[one]):.1f} s = "
        f"{statistics.median(round_ratios(times, one, 'floor')):.2f}x the floor "
        f"(L·d_ff·V·d value-vector projection); "
        f"{statistics.median(round_ratios(times, loop, one)):.1f}x faster than the loop"
    )


if __name__ == "__main__":
    with torch.no_grad():
        main()
