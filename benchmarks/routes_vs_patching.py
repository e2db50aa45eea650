"""Does the cheap route graph find what matters? Issue 27, item 4: route measures against exact
interventions, per head, for the built-in reference model.

`--num-prompts` windows of `--seq-len` tokens of `--dataset` (the built-in corpus, shakespeare)
sampled with `--seed` as every corpus command samples them, each decoded to text; the
prediction at the last position, of the model's own top token. Per prompt and head, through the
public API (the reference model loaded once and passed to each call):

* route measures, `resstream.routes(text)`: `flow` — `RoutesResult.head_flow`, the share of the
  prediction's state that passes through the head along all paths (no threshold); `kept edges`
  — the summed importance of the head's edges on the route kept above `--threshold` (0 for a
  head off the route);
* additive scores for reference, `resstream.attribute(text)`: |C| (the head's log-probability
  contribution) and |DLA| (its direct logit attribution), both at the prediction;
* the exact effect, `resstream.ablate(text, components=["L*.H*"], mode=M)` for each of
  `--modes` (zero by default): every head ablated alone at every position, along the total path
  (and the direct path), measured two ways: |Δ log p| of the model's prediction, and the KL
  divergence of the next-token distribution from the clean one (a change of the whole
  prediction, which suits the route's measures: they choose no token).

Agreement per prompt: Spearman's ρ between a measure and |effect| over the heads (average ranks
for ties: `resstream.analysis.interventions.atp.spearman`, the project's one definition), and the
top-k overlap (of the k heads with the largest |effect|, the share among the measure's top k:
`faithfulness.top_k_overlap`). Reported: the mean over prompts with its 95% t-interval (a prompt
where a measure is constant — no head on the kept route — ranks nothing and is left out of both;
the `prompts` column counts those kept), and the pooled ρ over every (prompt, head) pair.

    python benchmarks/routes_vs_patching.py                       # 20 prompts × 24 tokens, ~30 s
    python benchmarks/routes_vs_patching.py --num-prompts 100 --modes zero,mean
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import resstream
from harness import write_record
from resstream.analysis.interventions.atp import spearman
from resstream.analysis.interventions.faithfulness import top_k_overlap
from resstream.analysis.routes import DEFAULT_THRESHOLD
from resstream.api.inputs import CorpusRequest, sample_corpus
from resstream.api.tokenizers import tokenizer_of
from resstream.io import jsonable
from resstream.models import LoadedModel, load_model
from resstream.simulation.intervals import sample_interval

#: Route measures and additive scores, in the table's order.
MEASURES = ("flow", "kept edges", "|C|", "|DLA|")
PATHS = ("total", "direct")
#: The effect metrics: name in the table -> `Effect` field (magnitudes are compared).
EFFECTS = {"|Δ log p|": "d_logprob", "KL": "kl"}


@dataclass
class Prompt:
    """One prompt's per-head measures and effects, flattened layer by layer ((L·H,) float64)."""

    text: str
    prediction: str
    measures: dict[str, torch.Tensor] = field(default_factory=dict)
    effects: dict[tuple[str, str, str], torch.Tensor] = field(default_factory=dict)  # mode, path, effect


def prompts_of(loaded: LoadedModel, args: argparse.Namespace) -> tuple[list[str], int]:
    """The sampled windows as texts, and how many re-encode to other tokens than sampled
    (the API encodes the text; every measure of a prompt sees the same tokens either way)."""
    tokenizer = tokenizer_of(loaded)
    request = CorpusRequest(args.dataset, args.num_prompts, args.seq_len, args.seed, None)
    sample, _ = sample_corpus(request, tokenizer, loaded.view.W_U.shape[0])
    texts, changed = [], 0
    for ids in sample.sequences:
        text = tokenizer.decode(ids.tolist(), skip_special_tokens=True)
        changed += tokenizer(text, add_special_tokens=True)["input_ids"] != ids.tolist()
        texts.append(text)
    return texts, changed


def head_grid(pairs: Sequence[tuple[int, int, float]], n_layers: int, n_heads: int) -> torch.Tensor:
    """(layer, head, value) triples as a flat (L·H,) float64 tensor; every head must appear once."""
    grid = torch.full((n_layers * n_heads,), math.nan, dtype=torch.float64)
    for layer, head, value in pairs:
        grid[layer * n_heads + head] = value
    if bool(grid.isnan().any()):
        raise RuntimeError("a head is missing from the result")
    return grid


def measure_prompt(loaded: LoadedModel, text: str, args: argparse.Namespace) -> Prompt:
    """Every measure and exact effect of one prompt (module docstring)."""
    route = resstream.routes(text, model=loaded, threshold=args.threshold)
    n_layers, n_heads = route.n_layers, route.n_heads
    flow = [
        (layer, head, value) for layer, row in enumerate(route.head_flow) for head, value in enumerate(row)
    ]
    kept = torch.zeros(n_layers * n_heads, dtype=torch.float64)
    for edge in route.edges:
        if edge.kind == "head" and edge.head is not None:
            kept[edge.layer * n_heads + edge.head] += edge.importance
    scores = resstream.attribute(text, model=loaded, sources=False, neurons=False)
    if scores.target != route.prediction:
        raise RuntimeError(f"attribute's target {scores.target!r} is not the route's {route.prediction!r}")
    prompt = Prompt(text, route.prediction)
    prompt.measures = {
        "flow": head_grid(flow, n_layers, n_heads),
        "kept edges": kept,
        "|C|": head_grid([(h.layer, h.head, abs(h.contribution)) for h in scores.heads], n_layers, n_heads),
        "|DLA|": head_grid([(h.layer, h.head, abs(h.dla)) for h in scores.heads], n_layers, n_heads),
    }
    for mode in args.modes:
        ablated = resstream.ablate(text, model=loaded, components=["L*.H*"], mode=mode, direct=True)
        if ablated.target != route.prediction:
            raise RuntimeError(f"ablate's target {ablated.target!r} is not the route's {route.prediction!r}")
        for path in PATHS:
            chosen = ablated.select(kind="head", path=path)
            for effect, name in EFFECTS.items():
                found = [(e.layer, e.index, getattr(e, name)) for e in chosen]
                prompt.effects[(mode, path, effect)] = head_grid(found, n_layers, n_heads)
    return prompt


@dataclass(frozen=True)
class Agreement:
    """One measure against one (mode, path, effect) of effects over the prompts."""

    measure: str
    mode: str
    path: str
    effect: str
    rho: float
    low: float
    high: float
    prompts: int
    pooled: float
    overlap: float

    def row(self) -> str:
        interval = "–" if math.isnan(self.low) else f"[{_signed(self.low)}, {_signed(self.high)}]"
        overlap = "–" if math.isnan(self.overlap) else f"{self.overlap:.2f}"
        return (
            f"{self.measure:<11} {self.mode:<9} {self.path:<7} {self.effect:<10} {_signed(self.rho):>7} "
            f"{interval:>16} "
            f"{self.prompts:>7} {_signed(self.pooled):>9} {overlap:>9}"
        )


def _signed(value: float) -> str:
    """`value` as +0.00, or – for nan."""
    return "–" if math.isnan(value) else f"{value:+.2f}"


def agreement(prompts: Sequence[Prompt], measure: str, effect_of: tuple[str, str, str], k: int) -> Agreement:
    """Spearman ρ per prompt (mean, 95% t-interval, prompts kept), pooled ρ, mean top-k overlap
    of `measure` against the effects `effect_of` (mode, path, effect)."""
    rhos, overlaps, xs, ys = [], [], [], []
    for prompt in prompts:
        score, effect = prompt.measures[measure], prompt.effects[effect_of]
        rho = spearman(score.tolist(), effect.abs().tolist())
        if rho is not None:  # a constant measure ranks nothing: neither ρ nor a top k
            rhos.append(rho)
            overlaps.append(top_k_overlap(score, effect, k))
        xs += score.tolist()
        ys += effect.abs().tolist()
    found = sample_interval(rhos, bounds=(-1.0, 1.0)) if rhos else None
    pooled = spearman(xs, ys)
    return Agreement(
        measure,
        *effect_of,
        rho=math.nan if found is None else found.value,
        low=math.nan if found is None else found.low,
        high=math.nan if found is None else found.high,
        prompts=len(rhos),
        pooled=math.nan if pooled is None else pooled,
        overlap=sum(overlaps) / len(overlaps) if overlaps else math.nan,
    )


def report(prompts: Sequence[Prompt], args: argparse.Namespace) -> list[Agreement]:
    """The agreement table, printed (module docstring)."""
    rows = [
        agreement(prompts, measure, (mode, path, effect), args.top_k)
        for mode in args.modes
        for effect in EFFECTS
        for path in PATHS
        for measure in MEASURES
    ]
    header = (
        f"{'measure':<11} {'ablation':<9} {'path':<7} {'effect':<10} {'ρ mean':>7} {'95% interval':>16} "
        f"{'prompts':>7} {'pooled ρ':>9} {f'top-{args.top_k}':>9}"
    )
    print("\nSpearman ρ of each measure with the heads' effects (magnitudes) over the heads of a prompt")
    print(header)
    for index, row in enumerate(rows):
        if index and index % len(MEASURES) == 0:
            print()
        print(row.row())
    heads = len(prompts[0].measures["flow"])
    print(f"(chance: ρ 0, top-{args.top_k} overlap {min(args.top_k, heads) / heads:.2f} of {heads} heads)")
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=20, help="corpus windows (default 20)")
    parser.add_argument("--seq-len", type=int, default=24, help="tokens per window (default 24)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--dataset", default="shakespeare", help="corpus (default: the built-in one)")
    parser.add_argument(
        "--modes", default="zero", help="ablation modes, comma-separated: zero, mean, resample"
    )
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="τ of the kept route")
    parser.add_argument("--top-k", type=int, default=3, help="k of the top-k overlap (default 3)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if args.num_prompts < 1 or args.seq_len < 2 or args.top_k < 1 or not args.modes:
        parser.error("--num-prompts and --top-k must be positive, --seq-len at least 2, --modes not empty")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    loaded = load_model(None)
    view = loaded.view
    texts, changed = prompts_of(loaded, args)
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpu; model {loaded.name} "
        f"({view.n_layers} layers × {view.n_heads} heads = {view.n_layers * view.n_heads} heads, "
        f"d {view.d_model}, {next(loaded.model.parameters()).dtype}); {len(texts)} windows of "
        f"{args.seq_len} tokens of {args.dataset!r} (seed {args.seed}), {changed} re-encoded "
        f"differently; prediction: the model's top token at the last position; τ = {args.threshold:g}; "
        f"ablation: {', '.join(args.modes)}"
    )
    prompts = [measure_prompt(loaded, text, args) for text in texts]
    rows = report(prompts, args)
    took = time.perf_counter() - start
    print(f"\n{len(prompts)} prompts in {took:.0f} s")
    if args.json:
        record: dict[str, Any] = {
            "model": loaded.name,
            "num_prompts": len(prompts),
            "seq_len": args.seq_len,
            "seed": args.seed,
            "threshold": args.threshold,
            "modes": args.modes,
            "reencoded_differently": changed,
            "agreement": [asdict(row) for row in rows],
            "seconds": took,
        }
        write_record(args.json, jsonable(record))


if __name__ == "__main__":
    main()
