"""Reading named activations: `resstream.trace` against a plain forward, TransformerLens's
`run_with_cache` and nnsight's `trace(...).save()`, side by side in one process.

    python benchmarks/bench_trace.py                  # CPU; peers skipped where they do not import
    /tmp/tlvenv/bin/python benchmarks/bench_trace.py  # with TransformerLens and nnsight (docs/benchmarks.md)
    python benchmarks/bench_trace.py --rounds 3 --batch 4 --seq 64 --no-memory
    python benchmarks/bench_trace.py --profile        # where trace-1's time goes beyond the forward

Shape: a GPT-2-small-shaped `GPT2LMHeadModel` (`harness.random_gpt2`: 12 layers, d_model 768, 12
heads, vocabulary 50257, random weights, fp32, eval), one batch of `--batch` × `--seq` random
token ids (8 × 128), every variant under `torch.no_grad()`. The activation the peers read is
`--name` (L6.resid = h_6, the output of block 5: TransformerLens's `blocks.5.hook_resid_post`,
nnsight's `transformer.h[5].output`).

Variants (each once as warm-up, then once per round in rotating order; medians over rounds):
- `forward`: the Hugging Face trunk `model.transformer(input_ids=ids, use_cache=False)` — the
  forward `trace` runs itself (no LM head, no KV cache): the yardstick;
- `forward-lm`: the whole model `model(input_ids=ids, use_cache=False)`, LM head included — what
  the peers run;
- `trace-1`: `resstream.trace(model, ids, [--name])`; target ≤ 1.1× forward;
- `trace-some`: `resstream.trace` of `--some` (a residual state, a head's z, a layer's neurons,
  an MLP output);
- `tl-cache`: TransformerLens's `run_with_cache(ids)` (every hook: the full cache) on a
  `TransformerBridge` around a copy of the model (`build_bridge_from_module`: no Hub access);
- `tl-filter`: the same with `names_filter` of the one hook;
- `nnsight`: `NNsight(copy)`, `with m.trace(ids, use_cache=False): m.transformer.h[l].output.save()`
  (the whole model, as a user wraps it);
- `nnsight-trunk`: the same on `NNsight(copy.transformer)` (no LM head, as `trace` runs).
A peer that does not import, or cannot wrap the model offline, is skipped with its reason.

Agreement: every variant that reads `--name` against `trace-1`'s tensor (max |Δ|), and
`trace-1` against Hugging Face's own `output_hidden_states`.

Extra peak memory: each variant in a fresh subprocess (`--measure-memory VARIANT`, the same
shape) that builds the model, the inputs and the variant (a peer's copy of the model included),
runs it once, then hands freed heap pages back to the OS (`malloc_trim`), resets the peak RSS
(`/proc/self/clear_refs`), runs it again and reads the new peak (VmHWM) minus the resident set
before it (`harness.peak_growth`). The child runs with glibc's mmap threshold at 64 KiB
(`MALLOC_MMAP_THRESHOLD_`), so a freed tensor leaves the resident set and the peak follows the
live tensors. What the call returns (the activations) is part of its peak.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import resstream
from harness import (
    device_name,
    fresh_process_peaks,
    interleaved,
    load_average,
    load_peer,
    median_ratio,
    medians,
    peak_growth,
    random_gpt2,
    timed,
    transformer_lens_bridge,
    write_record,
)

ALL_VARIANTS = (
    "forward",
    "forward-lm",
    "trace-1",
    "trace-some",
    "tl-cache",
    "tl-filter",
    "nnsight",
    "nnsight-trunk",
)
#: Variants whose output is the activation `--name` (compared with trace-1's).
READS_NAME = ("trace-1", "tl-cache", "tl-filter", "nnsight", "nnsight-trunk")
DEFAULT_SOME = "L3.resid,L3.H2,L5.N*,L4.mlp"
TARGET_TRACE_1 = 1.1  # trace-1 ÷ forward, at most
Variant = Callable[[], Any]


@dataclass
class Setup:
    model: Any
    ids: Tensor
    name: str  # the one activation, L{l}.resid
    some: list[str]

    @property
    def layer(self) -> int:
        """l of the residual state h_l that `name` reads (the output of block l − 1)."""
        return int(self.name.split(".")[0][1:])


def build_setup(args: argparse.Namespace) -> Setup:
    """The random-weight model of the shape the flags give and one seeded batch of ids."""
    model = random_gpt2(
        "cpu", n_layer=args.layers, n_embd=args.d_model, n_head=args.heads, vocab_size=args.vocab
    )
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator)
    setup = Setup(model, ids, args.name, [n for n in args.some.split(",") if n])
    if not (setup.name.endswith(".resid") and 1 <= setup.layer <= args.layers):
        raise SystemExit(f"--name {args.name}: give L<l>.resid with 1 <= l <= {args.layers}")
    return setup


# ----------------------------------------------------------------------- variants
def make_forward(setup: Setup, lm_head: bool) -> Variant:
    module = setup.model if lm_head else setup.model.transformer

    def run() -> None:
        with torch.no_grad():
            module(input_ids=setup.ids, use_cache=False)

    return run


def make_trace(setup: Setup, names: list[str]) -> Variant:
    def run() -> Any:
        traced = resstream.trace(setup.model, setup.ids, names, batch_size=setup.ids.shape[0])
        return traced[names[0]] if len(names) == 1 else traced

    return run


def make_transformer_lens(setup: Setup, full_cache: bool) -> Variant:
    """`run_with_cache` on a TransformerBridge around a copy of the model."""
    bridge = transformer_lens_bridge(setup.model)
    hook = f"blocks.{setup.layer - 1}.hook_resid_post"

    def run() -> Tensor:
        with torch.no_grad():
            if full_cache:
                _, cache = bridge.run_with_cache(setup.ids)
            else:
                _, cache = bridge.run_with_cache(setup.ids, names_filter=lambda name: name == hook)
        return cache[hook]

    return run


def make_nnsight(setup: Setup, trunk: bool) -> Variant:
    """nnsight's trace of block l − 1's output, `.save()`d, on a copy of the model (the whole
    model, or its trunk)."""
    nnsight, _ = load_peer("nnsight", "nnsight")
    twin = copy.deepcopy(setup.model)
    wrapped = nnsight.NNsight(twin.transformer if trunk else twin)
    block = setup.layer - 1

    def run() -> Tensor:
        with torch.no_grad(), wrapped.trace(setup.ids, use_cache=False):
            blocks = wrapped.h if trunk else wrapped.transformer.h
            saved = blocks[block].output.save()
        out = saved[0] if isinstance(saved, tuple) else saved
        return getattr(out, "value", out)

    return run


PEERS = {
    "tl-cache": ("transformer_lens.model_bridge.sources", "transformer_lens"),
    "tl-filter": ("transformer_lens.model_bridge.sources", "transformer_lens"),
    "nnsight": ("nnsight", "nnsight"),
    "nnsight-trunk": ("nnsight", "nnsight"),
}


def make_variants(
    setup: Setup, names: list[str]
) -> tuple[dict[str, Variant], dict[str, str], dict[str, str]]:
    """The runnable variants among `names`, the reasons for those skipped, and the peers' versions."""
    variants: dict[str, Variant] = {}
    skipped: dict[str, str] = {}
    versions: dict[str, str] = {}
    for name in names:
        if name in ("forward", "forward-lm"):
            variants[name] = make_forward(setup, name == "forward-lm")
        elif name == "trace-1":
            variants[name] = make_trace(setup, [setup.name])
        elif name == "trace-some":
            variants[name] = make_trace(setup, setup.some)
        elif name in PEERS:
            found, said = load_peer(*PEERS[name])
            if found is None:
                skipped[name] = said
                continue
            versions[PEERS[name][1]] = said
            try:
                if name.startswith("tl-"):
                    variants[name] = make_transformer_lens(setup, name == "tl-cache")
                else:
                    variants[name] = make_nnsight(setup, name == "nnsight-trunk")
            except Exception as error:  # installed, but cannot wrap the model: say why, go on
                skipped[name] = f"{said} cannot wrap the model offline: {type(error).__name__}: {error}"
    return variants, skipped, versions


# ----------------------------------------------------------------------- agreement
def hf_state(setup: Setup) -> Tensor:
    """h_l as Hugging Face itself returns it (`output_hidden_states`)."""
    with torch.no_grad():
        out = setup.model.transformer(input_ids=setup.ids, use_cache=False, output_hidden_states=True)
    return out.hidden_states[setup.layer]


def differences(setup: Setup, outputs: dict[str, Any]) -> dict[str, float]:
    """Max |Δ| of every variant that reads `--name` against trace-1's tensor, and of trace-1
    against Hugging Face's hidden state (key "hf")."""
    reference = outputs.get("trace-1")
    if reference is None:
        reference = make_trace(setup, [setup.name])()
    found = {"hf": float((reference - hf_state(setup)).abs().max())}
    for name in READS_NAME:
        if name in outputs:
            found[name] = float((outputs[name].float() - reference).abs().max())
    return found


# ----------------------------------------------------------------------- memory
def memory_child(args: argparse.Namespace) -> None:
    """In a fresh process: extra peak RSS of one (warmed) call of a variant; one JSON line."""
    setup = build_setup(args)
    variants, skipped, _ = make_variants(setup, [args.measure_memory])
    if args.measure_memory in skipped:
        print(json.dumps({"variant": args.measure_memory, "skipped": skipped[args.measure_memory]}))
        return
    run = variants[args.measure_memory]
    run()
    grown, _ = peak_growth(run)
    print(json.dumps({"variant": args.measure_memory, "extra_bytes": grown}))


def shape_flags(args: argparse.Namespace) -> list[str]:
    """The flags that rebuild this run's setup in a child."""
    return [
        *("--layers", str(args.layers), "--d-model", str(args.d_model), "--heads", str(args.heads)),
        *("--vocab", str(args.vocab), "--batch", str(args.batch), "--seq", str(args.seq)),
        *("--name", args.name, "--some", args.some),
    ]


def extra_peak_memory(args: argparse.Namespace, names: list[str]) -> dict[str, float]:
    """Extra peak RSS (bytes) of each variant: median over `--memory-repeats` fresh processes."""
    out: dict[str, float] = {}
    for name in names:
        command = [sys.executable, __file__, "--measure-memory", name, *shape_flags(args)]
        values, failed = fresh_process_peaks(command, args.memory_repeats)
        if failed is not None:
            print(f"memory of {name}: {failed}")
        if values:
            out[name] = statistics.median(values)
            print(
                f"extra peak memory of {name} (MB), {len(values)} processes: "
                + " ".join(f"{v / 1e6:.1f}" for v in values)
            )
    return out


# ----------------------------------------------------------------------- profile
def profile_trace(setup: Setup) -> None:
    """Where trace-1's time goes beyond the forward: its set-up steps timed alone, then the top
    functions of one call by cumulative time (cProfile)."""
    import cProfile
    import pstats

    from resstream.models.adapters import view_of
    from resstream.stream.sites import parse_sites, space_of

    took_view, view = timed(lambda: view_of(setup.model))
    took_sites, _ = timed(lambda: parse_sites([setup.name], space_of(view)))
    trace_1, forward = make_trace(setup, [setup.name]), make_forward(setup, False)
    trace_1()
    took_trace, _ = timed(trace_1)
    took_forward, _ = timed(forward)
    print(
        f"\nprofile: trace-1 {took_trace * 1e3:.1f} ms, forward {took_forward * 1e3:.1f} ms; of trace-1's "
        f"set-up, view_of {took_view * 1e3:.2f} ms, parse_sites {took_sites * 1e3:.2f} ms"
    )
    profiler = cProfile.Profile()
    profiler.runcall(trace_1)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(18)


# ----------------------------------------------------------------------- running and reporting
def measure(setup: Setup, names: list[str], rounds: int) -> dict[str, Any]:
    """Interleaved rounds of the variants among `names`, their agreement, and a record of both."""
    variants, skipped, versions = make_variants(setup, names)
    for name, reason in skipped.items():
        print(f"{name}: skipped ({reason})")
    seconds, outputs = interleaved(variants, rounds, "cpu", report=".3f")
    return {
        "seconds": seconds,
        "median_seconds": medians(seconds),
        "max_abs_diff": differences(setup, outputs),
        "skipped": skipped,
        "versions": versions,
    }


def cell(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def report(record: dict[str, Any], memory: dict[str, float]) -> None:
    """The per-round figures, the targets and a Markdown table."""
    seconds, diffs = record["seconds"], record["max_abs_diff"]
    times = record["median_seconds"]
    print("\nper-round seconds (interleaved, rotating order):")
    for name, values in seconds.items():
        print(f"  {name:14s} {' '.join(f'{v:8.3f}' for v in values)}")
    print(f"trace-1 vs Hugging Face's own hidden state h_l: max |Δ| {diffs['hf']:.2e}")
    ratio = median_ratio(seconds, "trace-1", "forward")
    if ratio is not None:
        verdict = "met" if ratio <= TARGET_TRACE_1 else "MISSED"
        print(
            f"trace-1 ÷ forward (median of per-round ratios): {ratio:.3f} "
            f"(target ≤ {TARGET_TRACE_1}: {verdict})"
        )
    for peer in ("tl-cache", "tl-filter", "nnsight", "nnsight-trunk"):
        ratio = median_ratio(seconds, peer, "trace-1")
        if ratio is not None:
            print(f"{peer} ÷ trace-1 (median of per-round ratios): {ratio:.2f} (> 1: trace-1 faster)")
    if "tl-cache" in memory and "trace-1" in memory:
        print(
            f"extra peak memory: trace-1 {memory['trace-1'] / 1e6:.1f} MB, run_with_cache's full cache "
            f"{memory['tl-cache'] / 1e6:.1f} MB"
        )
    print("\nMarkdown:\n")
    print("| variant | ms | ÷ forward | ÷ trace-1 | extra peak memory (MB) | max abs Δ vs trace-1 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, took in times.items():
        fwd = median_ratio(seconds, name, "forward")
        tr1 = median_ratio(seconds, name, "trace-1")
        mem = memory.get(name)
        diff = diffs.get(name) if name != "trace-1" else diffs["hf"]
        note = " (vs HF hidden_states)" if name == "trace-1" else ""
        print(
            f"| {name} | {took * 1e3:.1f} | {cell(fwd, '.2f')} | {cell(tr1, '.2f')} | "
            f"{cell(None if mem is None else mem / 1e6, '.1f')} | {cell(diff, '.1e')}{note} |"
        )
    for name, reason in record["skipped"].items():
        print(f"| {name} | skipped: {reason} | | | | |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=8, help="texts in the one batch (default 8)")
    parser.add_argument("--seq", type=int, default=128, help="tokens per text (default 128)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument(
        "--name", default="L6.resid", help="the one activation, L<l>.resid (default L6.resid)"
    )
    parser.add_argument("--some", default=DEFAULT_SOME, help=f"trace-some's names (default {DEFAULT_SOME})")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-ups (default 3)")
    parser.add_argument("--variants", default=",".join(ALL_VARIANTS), help="comma-separated")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--no-memory", action="store_true", help="skip the extra-peak-memory subprocesses")
    parser.add_argument("--memory-repeats", type=int, default=1, help="fresh processes per variant (median)")
    parser.add_argument("--profile", action="store_true", help="where trace-1's time goes (cProfile)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--measure-memory", metavar="VARIANT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.variants.split(",")) - set(ALL_VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; allowed: {', '.join(ALL_VARIANTS)}")
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.measure_memory:
        memory_child(args)
        return
    names = [n for n in args.variants.split(",") if n]
    setup = build_setup(args)
    print(
        f"CPU ({device_name('cpu')}), torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load {load_average():.1f}; GPT-2 shape {args.layers} layers, d {args.d_model}, {args.heads} heads, "
        f"vocab {args.vocab}, random weights, fp32; ids {args.batch} x {args.seq}; {args.rounds} rounds; "
        f"--name {args.name}, --some {args.some}"
    )
    record = measure(setup, names, args.rounds)
    for package, version in record["versions"].items():
        print(f"peer {package}: {version}")
    if args.profile:
        profile_trace(setup)
    timed_names = list(record["seconds"])
    memory = {} if args.no_memory else extra_peak_memory(args, timed_names)
    record["extra_peak_bytes"] = memory
    report(record, memory)
    if args.json:
        write_record(
            args.json, {"torch": torch.__version__, "args": vars(args) | {"json": str(args.json)}, **record}
        )


if __name__ == "__main__":
    main()
