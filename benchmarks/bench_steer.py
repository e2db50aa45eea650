"""Steering and generation: Hugging Face's `generate` under `resstream.edited` against the same
call without edits, and `resstream.directions` against the forwards it has to run, side by side.

    python benchmarks/bench_steer.py                           # both sections, GPT-2-small shape
    python benchmarks/bench_steer.py --sections generate --rounds 5
    python benchmarks/bench_steer.py --sections directions --texts 64   # a CPU-sized directions run

Model: a GPT-2-small-shaped `GPT2LMHeadModel` (`harness.random_gpt2`: 12 layers, d_model 768, 12
heads, vocabulary 50257, random weights, fp32, eval). Its generation config's end-of-text token
is cleared, so that nothing stops a continuation early: every call makes `--new-tokens` tokens
(the shapes are asserted). Texts are spelled in a word-level tokenizer the benchmark builds, one
word per token id ("t0" … "t50256"), so that a text of n random ids is exactly those n tokens and
every variant of a section runs the same ids.

Generation (`--prompts` 8 prompts of `--prompt-tokens` 16 random ids, `--new-tokens` 64, greedy,
KV cache):
- `hf-generate`: `model.generate(ids, attention_mask=1, max_new_tokens=64, min_new_tokens=64,
  do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)` — the yardstick;
- `steered`: the same call inside `resstream.edited(model, [resstream.Add("L6.resid", v,
  coef=4.0)])`, v a seeded random unit vector; target ≤ 1.05× hf-generate;
- `resstream-generate`: `resstream.generate(model, prompts, edits=[the same Add],
  max_new_tokens=64, tokenizer=..., compare=False)` end to end (texts in, continuations out);
  its new tokens must equal `steered`'s.

Directions (2 × `--texts` texts, 256 a set by default, of `--text-tokens` 64 random ids each):
- `forwards`: the forwards `resstream.directions` runs, `resstream.capture.residual_states(view,
  ids, mask)` over batches of its batch size (16) of the same ids (mask: every token real, as
  `directions` passes it) — the yardstick;
- `directions`: `resstream.directions(model, positive, negative, tokenizer=...)` (position
  "last"; DiffMean, PCA and the probe at each of the 13 layers, with their held-out AUCs);
  target ≤ 1.3× forwards. Skipped with a message where `resstream.directions` does not import.

Each variant runs once as warm-up (`directions` on a quarter of the texts), then once per round
in rotating order (`--rounds`); figures are medians, and ratios the median of each round's own.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import resstream
from harness import device_name, interleaved, load_average, medians, random_gpt2, round_ratios, write_record
from resstream.capture import residual_states
from resstream.models.adapters import view_of

TARGETS = {"steered": 1.05, "directions": 1.3}
SITE = "L6.resid"  # where the steering vector is added (--site)
COEF = 4.0
Variant = Callable[[], Any]


def word_tokenizer(vocab: int) -> Any:
    """A fast tokenizer of one word per id ("t0", "t1", …; whitespace between words)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins the words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0")


def spelled(ids: Tensor) -> list[str]:
    """Each row of ids as a text of the word tokenizer."""
    return [" ".join(f"t{int(i)}" for i in row) for row in ids]


def random_ids(rows: int, tokens: int, vocab: int, seed: int) -> Tensor:
    return torch.randint(0, vocab, (rows, tokens), generator=torch.Generator().manual_seed(seed))


def build_model(args: argparse.Namespace) -> Any:
    """The random-weight model, its end-of-text token cleared (nothing stops a continuation)."""
    model = random_gpt2(
        "cpu", n_layer=args.layers, n_embd=args.d_model, n_head=args.heads, vocab_size=args.vocab
    )
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def steering_edit(model: Any, site: str = SITE, seed: int = 3) -> Any:
    """resstream.Add(site, v, coef=COEF), v a seeded random unit vector of the model's width."""
    v = torch.randn(model.config.n_embd, generator=torch.Generator().manual_seed(seed))
    return resstream.Add(site, v / v.norm(), coef=COEF)


# ----------------------------------------------------------------------- generation
def hf_generate(model: Any, ids: Tensor, new: int) -> Tensor:
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            eos_token_id=None,
        )
    assert out.shape == (ids.shape[0], ids.shape[1] + new), tuple(out.shape)
    return out


def generation_variants(
    model: Any, ids: Tensor, new: int, end_to_end: bool, site: str = SITE
) -> dict[str, Variant]:
    """hf-generate, steered and (with `end_to_end`) resstream-generate of prompts `ids`."""
    edit = steering_edit(model, site)
    tokenizer = word_tokenizer(model.config.vocab_size)
    prompts = spelled(ids)

    def steered() -> Tensor:
        with resstream.edited(model, [edit]):
            return hf_generate(model, ids, new)

    def generated() -> Tensor:
        result = resstream.generate(
            model,
            prompts,
            edits=[edit],
            max_new_tokens=new,
            tokenizer=tokenizer,
            compare=False,
            batch_size=ids.shape[0],
        )
        found = torch.tensor([list(c.steered_ids) for c in result.continuations])
        assert found.shape == (ids.shape[0], new), tuple(found.shape)
        return found

    variants: dict[str, Variant] = {"hf-generate": lambda: hf_generate(model, ids, new), "steered": steered}
    if end_to_end:
        variants["resstream-generate"] = generated
    return variants


def generation_section(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    ids = random_ids(args.prompts, args.prompt_tokens, args.vocab, seed=1)
    variants = generation_variants(model, ids, args.new_tokens, not args.no_end_to_end, args.site)
    print(
        f"\ngeneration: {args.prompts} prompts x {args.prompt_tokens} tokens, {args.new_tokens} new tokens, "
        f"greedy, KV cache; steering Add({args.site!r}, unit v, coef={COEF})"
    )
    seconds, outputs = interleaved(variants, args.rounds, "cpu", report=".2f")
    prompt = ids.shape[1]
    plain, steered = outputs["hf-generate"][:, prompt:], outputs["steered"][:, prompt:]
    changed = int((plain != steered).sum())
    print(f"steering changed {changed} of {plain.numel()} new tokens (0 would mean the edit did nothing)")
    same = None
    if "resstream-generate" in outputs:
        same = bool(torch.equal(outputs["resstream-generate"], steered))
        print(f"resstream-generate's new tokens == steered's: {same}")
    ratios = {
        name: statistics.median(round_ratios(seconds, name, "hf-generate"))
        for name in seconds
        if name != "hf-generate"
    }
    table(
        "generation",
        seconds,
        "hf-generate",
        ratios,
        {"steered": TARGETS["steered"], "resstream-generate": TARGETS["steered"]},
    )
    return {
        "seconds": seconds,
        "median_seconds": medians(seconds),
        "ratios": ratios,
        "changed_tokens": changed,
        "end_to_end_equal": same,
    }


# ----------------------------------------------------------------------- directions
def directions_function() -> tuple[Any, str]:
    """`resstream.directions` and its batch size, or None and why it is unavailable."""
    try:
        from resstream.api.directions import BATCH_SIZE, directions
    except ImportError as error:
        return None, f"resstream.directions does not import yet ({type(error).__name__}: {error})"
    return (directions, BATCH_SIZE), ""


def forwards(model: Any, ids: Tensor, batch_size: int) -> int:
    """The forwards `directions` runs: every layer's residual states, batch by batch."""
    view = view_of(model)
    layers = 0
    with torch.no_grad():
        for start in range(0, ids.shape[0], batch_size):
            chunk = ids[start : start + batch_size]
            layers = residual_states(view, chunk, torch.ones_like(chunk)).shape[0]
    return layers


def directions_variants(
    model: Any, ids: Tensor, directions: Callable[..., Any], batch_size: int
) -> tuple[dict[str, Variant], dict[str, Variant]]:
    """The two variants and their warm-ups (directions on a quarter of each set)."""
    texts = spelled(ids)
    half = len(texts) // 2
    tokenizer = word_tokenizer(model.config.vocab_size)

    def run(positive: Sequence[str], negative: Sequence[str]) -> Any:
        return directions(model, positive, negative, tokenizer=tokenizer, batch_size=batch_size)

    quarter = max(3, half // 4)
    variants = {
        "forwards": lambda: forwards(model, ids, batch_size),
        "directions": lambda: run(texts[:half], texts[half:]),
    }
    warm_ups = {
        "forwards": lambda: forwards(model, ids[:batch_size], batch_size),
        "directions": lambda: run(texts[:quarter], texts[half : half + quarter]),
    }
    return variants, warm_ups


def directions_section(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    found, reason = directions_function()
    ids = random_ids(2 * args.texts, args.text_tokens, args.vocab, seed=2)
    print(f"\ndirections: 2 x {args.texts} texts of {args.text_tokens} random tokens")
    if found is None:
        print(f"directions: skipped — {reason}")
        return {"skipped": reason}
    directions, batch_size = found
    variants, warm_ups = directions_variants(model, ids, directions, batch_size)
    seconds, outputs = interleaved(variants, args.rounds, "cpu", warm_ups=warm_ups, report=".2f")
    result = outputs["directions"]
    print(f"batch size {batch_size}; result: {result!r}"[:400])
    ratios = {"directions": statistics.median(round_ratios(seconds, "directions", "forwards"))}
    table("directions", seconds, "forwards", ratios, {"directions": TARGETS["directions"]})
    return {
        "seconds": seconds,
        "median_seconds": medians(seconds),
        "ratios": ratios,
        "batch_size": batch_size,
    }


# ----------------------------------------------------------------------- reporting
def table(
    what: str,
    seconds: dict[str, list[float]],
    yardstick: str,
    ratios: dict[str, float],
    targets: dict[str, float],
) -> None:
    """Per-round seconds, the verdicts and a Markdown table of one section."""
    print(f"\n{what}: per-round seconds (interleaved, rotating order)")
    for name, values in seconds.items():
        print(f"  {name:20s} {' '.join(f'{v:8.2f}' for v in values)}")
    for name, ratio in ratios.items():
        if name in targets:
            verdict = "met" if ratio <= targets[name] else "MISSED"
            within = f"target ≤ {targets[name]}: {verdict}"
            print(f"{name} ÷ {yardstick} (median of per-round ratios): {ratio:.3f} ({within})")
    print(f"\n| variant | s | ÷ {yardstick} |\n| --- | ---: | ---: |")
    for name, took in medians(seconds).items():
        ratio = 1.0 if name == yardstick else ratios[name]
        print(f"| {name} | {took:.2f} | {ratio:.3f} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--sections", default="generate,directions", help="generate, directions (both)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--prompts", type=int, default=8, help="prompts generated together (default 8)")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--site", default=SITE, help=f"where the vector is added (default {SITE})")
    parser.add_argument("--no-end-to-end", action="store_true", help="leave out resstream-generate")
    parser.add_argument("--texts", type=int, default=256, help="texts a set for directions (default 256)")
    parser.add_argument("--text-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-ups (default 3)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sections = set(args.sections.split(","))
    model = build_model(args)
    print(
        f"CPU ({device_name('cpu')}), torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load {load_average():.1f}; GPT-2 shape {args.layers} layers, d {args.d_model}, {args.heads} heads, "
        f"vocab {args.vocab}, random weights, fp32; {args.rounds} rounds"
    )
    record: dict[str, Any] = {"torch": torch.__version__, "args": vars(args) | {"json": str(args.json)}}
    if "generate" in sections:
        record["generate"] = generation_section(args, model)
    if "directions" in sections:
        record["directions"] = directions_section(args, model)
    if args.json:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
