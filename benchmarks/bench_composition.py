"""Head composition on a GPT-2-small-shaped model (random weights): the fast form against the
naive d×d products (issue 11, item 6).

    python benchmarks/bench_composition.py            # CPU, ~1 min; --device cuda when present

Prints the seconds of `analysis.memories.composition.composition` for all 9,504 pairs of heads (three
kinds; the baseline timed apart), the seconds per pair of the naive products
‖M_A R‖_F / (‖M_A‖_F ‖R‖_F) with M_A, R formed as d×d matrices (timed on `--naive-pairs`
pairs and extrapolated), their ratio, and the largest difference between the two on those
pairs. A random model's scores should all sit at the random baseline: their range is printed
beside it.
"""

from __future__ import annotations

import argparse

import torch

from harness import random_gpt2, timed
from resstream.analysis.memories.composition import composition, random_baseline
from resstream.models.adapters import view_of


def naive(view, l1: int, h1: int, l2: int, h2: int) -> list[float]:
    """The three scores from the d×d matrices (default convention: each head reads through its
    own ln1, N = C·diag(g), and its write is centred, W_O·C; GPT-2 has LayerNorm)."""
    a, b = view.blocks[l1], view.blocks[l2]
    wa, wb = a.attention_weights(), b.attention_weights()
    C = torch.eye(view.d_model, device=a.W_O.device) - 1.0 / view.d_model
    N_a, N_b = C * a.ln1.weight[None, :], C * b.ln1.weight[None, :]
    M_A = N_a @ wa.W_V[h1] @ a.W_O[h1] @ C
    R_Q = (N_b @ wb.W_Q[h2]) @ (N_b @ wb.W_K[h2]).T
    R_V = N_b @ wb.W_V[h2] @ b.W_O[h2] @ C
    return [
        float(torch.linalg.norm(M_A @ R) / (torch.linalg.norm(M_A) * torch.linalg.norm(R)))
        for R in (R_Q, R_Q.T, R_V)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--naive-pairs", type=int, default=24)
    args = parser.parse_args()
    view = view_of(random_gpt2(args.device, vocab_size=1024, bos_token_id=0, eos_token_id=0))
    with torch.no_grad():
        composition(view, model="warm-up", samples=2)
        fast, result = timed(lambda: composition(view, model="gpt2-small-shaped", samples=2), args.device)
        baseline_seconds, baseline = timed(lambda: random_baseline(768, 64, device=args.device), args.device)
        pairs = result.pairs()
        chosen = pairs[:: max(1, len(pairs) // args.naive_pairs)][: args.naive_pairs]
        took, slow = timed(lambda: [naive(view, *pair) for pair in chosen], args.device)
        per_pair = took / len(chosen)
    differences = [
        abs(slow[i][j] - float(result.scores(kind)[pair]))
        for i, pair in enumerate(chosen)
        for j, kind in enumerate("qkv")
    ]
    scores = torch.cat([result.scores(kind)[~result.scores(kind).isnan()] for kind in "qkv"])
    print(f"device {args.device}, torch threads {torch.get_num_threads()}, {len(pairs)} pairs of heads")
    print(f"fast, all pairs, three kinds: {fast:.2f} s ({fast / len(pairs) * 1e3:.3f} ms a pair)")
    print(f"baseline, 256 draws: {baseline_seconds:.2f} s")
    print(
        f"naive d×d products: {per_pair * 1e3:.1f} ms a pair (over {len(chosen)} pairs), "
        f"{per_pair * len(pairs):.0f} s for all; fast is {per_pair * len(pairs) / fast:.0f}× faster"
    )
    print(f"largest |fast − naive| on those pairs: {max(differences):.2e}")
    print(
        f"random model's scores {float(scores.min()):.4f} … {float(scores.max()):.4f} (mean "
        f"{float(scores.mean()):.4f}); baseline {baseline.mean:.4f} ± {baseline.stderr:.4f}, "
        f"1/√d = {baseline.rms_analytic:.4f}"
    )


if __name__ == "__main__":
    main()
