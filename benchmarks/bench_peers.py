"""resstream against TransformerLens and nnsight on their own ground: the same five operations,
side by side in one process, each tool on a deep copy of the same weights (issue 40, item 1).

    /tmp/peers/bin/python benchmarks/bench_peers.py              # all three tools (the side env)
    python benchmarks/bench_peers.py                             # resstream only: the peers skipped
    /tmp/peers/bin/python benchmarks/bench_peers.py --threads 1 --rounds 2 --json $OUT/peers.json
    /tmp/peers/bin/python benchmarks/bench_peers.py --ops lens,dla-heads --no-memory
    /tmp/peers/bin/python benchmarks/bench_peers.py --layers 2 --d-model 128 --vocab 2000 --seq 32 \\
        --patch-seq 8 --rounds 1                                 # a shrunk shape, to try it out
    /tmp/peers/bin/python benchmarks/bench_peers.py --cuda        # the same on a GPU (fp32)

The peers live in a side environment, so that the project's own stays free of them:

    python -m venv /tmp/peers
    /tmp/peers/bin/pip install torch==2.13.0
    /tmp/peers/bin/pip install -e .                # from the repository root
    /tmp/peers/bin/pip install transformer_lens==4.3.0 nnsight
    # → transformer_lens 4.3.0, nnsight 0.8.1, transformers 5.24

A peer that does not import (the main venv) or cannot wrap the model is skipped with one line,
and its columns stay empty. The tokenizer is GPT-2's (`load_tokenizer("gpt2")`, offline with
`RESSTREAM_DATA` set).

Shape: a GPT-2-small-shaped `GPT2LMHeadModel` (`harness.random_gpt2`: 12 layers, d_model 768, 12
heads, vocabulary 50257, random weights from seed 0, fp32, eval; `--layers`, `--d-model`,
`--heads`, `--vocab` shrink it). resstream reads the model itself; TransformerLens gets a
`TransformerBridge` around a deep copy (`harness.transformer_lens_bridge`), nnsight a
`TransformersModel` (its `LanguageModel`, which batches invokes) around another. The peers'
copies have their weights frozen (`requires_grad_(False)`), so that attribution patching's
backward computes the activations' gradients only, as resstream's does, not the weights'.

Inputs: a random text of `--seq` tokens (128) and a corrupted one as long (`atp-heads`), and a
pair of `--patch-seq` tokens (32, `patch-resid`). Each is drawn from the tokens that are a space
and letters (" cat") and encode to themselves alone, so the text decodes from its ids and
re-encodes to exactly them (checked). resstream and the peers take the ids (`GIVE_IDS`; False
hands resstream the text). The target is
the model's own top prediction at the last position.

Operations (each tool does the same work; results checked to agree):

* `lens`: the logit lens, top-1 at every layer 0..L (h_0 = the embedding output, h_l the output
  of block l − 1, before the final norm; each decoded as W_U · ln_f(h_l), so layer L is the
  model's own prediction) and every position. resstream: `lens(ids, top_k=1, ranks=False,
  probabilities=False)` (the top-1 exact in float64; its default also gives the ranks and
  probabilities of the input and next token). TL:
  `run_with_cache` of the residual hooks, `cache.accumulated_resid()`, `apply_ln_to_stack(...,
  recompute_ln=True)` (ln_f applied to each layer's state, TL's logit-lens setting), `@ W_U +
  b_U`, argmax. nnsight: one trace, ln_f and lm_head applied to block 0's input and every
  block's output inside it, argmax saved. Agreement: the cells whose top-1 differs; a differing
  cell is re-scored in float64 from resstream's states and counts as an fp32 near-tie when
  resstream's token is the float64 top-1 and the peer's scores within `NEAR_TIE` of it.
* `dla-heads`: the direct logit attribution of every head at the last position, the final
  norm's scale frozen at the final state h_L (resstream's convention:
  analysis/attribution/readouts.py). resstream: `attribute(ids, sources=False, neurons=False,
  contributions=False)`, the heads' `.dla` (it also computes the layers' scores, the target's
  trajectory and the decomposition's check at every residual point). TL: `run_with_cache` of
  every `hook_z` and `ln_final.hook_scale`,
  `stack_head_results(layer=-1, pos_slice=-1, apply_ln=True)` (centred and divided by the
  cached final scale: the same frozen norm) times ln_f's gain (TL's `apply_ln` leaves it to a
  folded W_U; the bridge is unfolded) dotted with W_U[:, target]. nnsight: one trace saving
  each block's z (`attn.c_proj.input`) and ln_f's input at the last position; the heads'
  outputs z_h · W_O[h] through the same frozen norm, by hand. Agreement: max |Δ DLA|.
* `ablate-heads`: zero-ablate each head (its z at every position), log p(target) at the last
  position. resstream: `ablate(ids, components=["L*.H*"])`, the total path (it also computes
  the logit, rank and KL). TL: one `run_with_hooks` per head, a hook on
  `blocks.l.attn.hook_z` zeroing head h (L·H forwards, full logits). nnsight: traces of
  `--invokes` batched invokes (default: one layer's heads per trace), each zeroing the head's
  slice of `attn.c_proj`'s input. Agreement: max |Δ log p|.
* `patch-resid`: patch the residual stream h_l (the input of block l, l = 0..L−1: TL's
  `resid_pre`) at each position p from the corrupted text, log p(target) at the last position
  (`--patch-seq` tokens, L·T patches). resstream: `patch(text, corrupt=..., components=
  ["L{l}.resid@*" for each l])`, the total path. TL: the corrupted run cached once, then one
  `run_with_hooks` per (l, p) setting `blocks.l.hook_resid_pre[:, p]`. nnsight: the corrupted
  states saved in one trace, then traces of batched invokes (default: one layer's positions per
  trace) setting `transformer.h[l].input[:, p]`. Agreement: max |Δ log p|.
* `atp-heads`: attribution patching of every head from the corrupted text, to first order
  Σ_p ⟨∂ log p / ∂z_h[p], z_h^corrupt[p] − z_h[p]⟩ over every position. resstream:
  `patch(text, corrupt=..., components=["L*.H*"], atp=True, confirm=ATP_CONFIRM)`, every
  head's `screened` estimate (it also estimates every neuron, block output and residual
  state; `confirm=0`: no exact confirmation). TL: the corrupted z's
  cached, then one forward with hooks keeping each `hook_z` and its gradient (backward hooks)
  and one backward. nnsight: one trace of the corrupted text saving z, one of the clean text
  saving z and, under `metric.backward()`, z's gradient. Agreement: max |Δ estimate|.

Timing: per operation, each tool once as a warm-up, then once per round (`--rounds`) in an
order that rotates every round (`harness.interleaved`); the table gives medians, and the ratio
peer ÷ resstream is the median of each round's ratio (`harness.median_ratio`), which cancels a
change of the machine's load between rounds (> 1: resstream faster). Extra peak memory: each
(operation, tool) in a fresh subprocess (`--measure-memory OP/TOOL`, the same shape and flags)
that builds the model, the inputs and the tool's copy, runs the operation once, then reads how
far the resident set peaks above its level during a second call (`harness.peak_growth`; glibc's
mmap threshold at 64 KiB: `harness.fresh_process_peaks`), or the CUDA allocator's peak with
`--cuda` (`harness.cuda_peak_growth`). What the call returns is part of its peak.
"""

from __future__ import annotations

import argparse
import copy
import math
import re
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import resstream
from harness import (
    cuda_peak_growth,
    device_name,
    fresh_process_peaks,
    interleaved,
    load_average,
    load_peer,
    median_ratio,
    medians,
    peak_growth,
    random_gpt2,
    transformer_lens_bridge,
    write_record,
)

OPS = ("lens", "dla-heads", "ablate-heads", "patch-resid", "atp-heads")
TOOLS = ("resstream", "tl", "nnsight")
LABELS = {"resstream": "resstream", "tl": "TL", "nnsight": "nnsight"}
#: The module each peer is imported by, and its package.
PEERS = {
    "tl": ("transformer_lens.model_bridge.sources", "transformer_lens"),
    "nnsight": ("nnsight", "nnsight"),
}
#: resstream is handed the token ids instead of their text (once it takes ids: issue 40, item 4).
GIVE_IDS = True
#: The heads resstream's AtP confirms by exact patching: at least 1 until `confirm=0` (the
#: estimates alone, the peers' work) lands (issue 40, item 4).
ATP_CONFIRM = 0
#: How close (relative to the largest |score|, in float64) a peer's differing top-1 may score
#: to resstream's for the cell to count as an fp32 near-tie.
NEAR_TIE = 1e-5
#: A space and letters: tokens that encode to themselves alone, so random texts round-trip.
WORD = re.compile(r"^ [A-Za-z]+$")
Variant = Callable[[], Tensor]


# ----------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Sample:
    """One random text: its ids (1, T) on the device and the text they decode to."""

    ids: Tensor
    text: str

    @property
    def given(self) -> str | Tensor:
        """What resstream is handed: the text (or the ids, `GIVE_IDS`)."""
        return self.ids if GIVE_IDS else self.text


def word_tokens(tokenizer: Any, vocab: int) -> list[int]:
    """The ids below `vocab` whose text is a space and letters and that encode to themselves."""
    found = []
    for token in range(min(vocab, len(tokenizer))):
        text = tokenizer.decode([token])
        if WORD.match(text) and tokenizer(text, add_special_tokens=False)["input_ids"] == [token]:
            found.append(token)
    if len(found) < 2:
        raise SystemExit(f"--vocab {vocab}: fewer than 2 word tokens below it; give a larger vocabulary")
    return found


def random_sample(tokenizer: Any, pool: list[int], length: int, seed: int, device: str) -> Sample:
    """`length` tokens drawn from `pool` (seeded), their text, and the check that it re-encodes
    to exactly them."""
    picks = torch.randint(0, len(pool), (length,), generator=torch.Generator().manual_seed(seed))
    ids = [pool[int(i)] for i in picks]
    text = tokenizer.decode(ids)
    again = tokenizer(text, add_special_tokens=True)["input_ids"]
    if again != ids:
        raise RuntimeError(f"the random text re-encodes to {len(again)} tokens, not its {length} ids")
    return Sample(torch.tensor([ids], device=device), text)


# ----------------------------------------------------------------------- the setup
@dataclass
class Setup:
    """The model, its tokenizer, the inputs and targets, and the peers' copies (made once)."""

    model: Any
    tokenizer: Any
    device: str
    clean: Sample  # --seq tokens: lens, dla-heads, ablate-heads, atp-heads
    corrupt: Sample  # as long: atp-heads
    short: Sample  # --patch-seq tokens: patch-resid
    short_corrupt: Sample
    invokes: int  # nnsight: interventions per trace (0: one layer's)
    target: int = 0  # the model's top prediction at the last position of `clean`
    short_target: int = 0  # ... of `short`
    peers: dict[str, Any] = field(default_factory=dict)  # tool: its wrapper
    twins: dict[str, Any] = field(default_factory=dict)  # tool: the copy of the model it wraps

    def __post_init__(self) -> None:
        with torch.no_grad():
            self.target = int(self.model(input_ids=self.clean.ids).logits[0, -1].argmax())
            self.short_target = int(self.model(input_ids=self.short.ids).logits[0, -1].argmax())

    @property
    def n_layers(self) -> int:
        return int(self.model.config.n_layer)

    @property
    def n_heads(self) -> int:
        return int(self.model.config.n_head)

    @property
    def d_head(self) -> int:
        return int(self.model.config.n_embd) // self.n_heads

    def peer(self, tool: str) -> Any:
        """The peer's wrapper around its own frozen copy of the model, made on first use."""
        if tool not in self.peers:
            if tool == "tl":
                wrapped = transformer_lens_bridge(self.model)
                self.twins[tool] = wrapped
            else:
                self.twins[tool] = copy.deepcopy(self.model)
                wrapped = nnsight_model(self.twins[tool], self.tokenizer)
            self.twins[tool].requires_grad_(False)
            self.peers[tool] = wrapped
        return self.peers[tool]


def build_setup(args: argparse.Namespace) -> Setup:
    from resstream.data.tokenizer import load_tokenizer

    device = args.device
    model = random_gpt2(
        device, n_layer=args.layers, n_embd=args.d_model, n_head=args.heads, vocab_size=args.vocab
    )
    tokenizer = load_tokenizer("gpt2")
    pool = word_tokens(tokenizer, args.vocab)
    return Setup(
        model,
        tokenizer,
        device,
        clean=random_sample(tokenizer, pool, args.seq, 1, device),
        corrupt=random_sample(tokenizer, pool, args.seq, 2, device),
        short=random_sample(tokenizer, pool, args.patch_seq, 3, device),
        short_corrupt=random_sample(tokenizer, pool, args.patch_seq, 4, device),
        invokes=args.invokes,
    )


def nnsight_model(model: Any, tokenizer: Any) -> Any:
    """nnsight's `TransformersModel` (0.8; `LanguageModel` before it) around `model`: the
    wrapper that batches several invokes into one forward (plain `NNsight` does not)."""
    import nnsight

    if hasattr(nnsight, "TransformersModel"):
        return nnsight.TransformersModel(model, task="text-generation", tokenizer=tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return nnsight.LanguageModel(model, tokenizer=tokenizer)


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def grid(rows: int, cols: int) -> Tensor:
    return torch.full((rows, cols), math.nan, dtype=torch.float64)


def log_p(logits: Tensor, target: int) -> Tensor:
    """log p(target) at the last position of the first sequence."""
    return logits[0, -1].float().log_softmax(-1)[target]


# ----------------------------------------------------------------------- resstream
def resstream_variant(s: Setup, op: str) -> Variant:
    model, tokenizer = s.model, s.tokenizer
    n_layers, n_heads = s.n_layers, s.n_heads

    def lens() -> Tensor:
        result = resstream.lens(
            s.clean.given, model=model, tokenizer=tokenizer, top_k=1, ranks=False, probabilities=False
        )
        return torch.tensor([t.top1 for t in result.trajectories]).T  # (L + 1, T)

    def dla() -> Tensor:
        result = resstream.attribute(
            s.clean.given, model=model, tokenizer=tokenizer, sources=False, neurons=False, contributions=False
        )
        assert result.target_id == s.target, (result.target_id, s.target)
        out = grid(n_layers, n_heads)
        for head in result.heads:
            out[head.layer, head.head] = head.dla
        return out

    def ablate() -> Tensor:
        result = resstream.ablate(s.clean.given, model=model, tokenizer=tokenizer, components=["L*.H*"])
        out = grid(n_layers, n_heads)
        for effect in result.effects:
            if effect.path == "total":
                out[effect.layer, effect.index] = effect.logprob
        return out

    def patch() -> Tensor:
        result = resstream.patch(
            s.short.given,
            corrupt=s.short_corrupt.given,
            model=model,
            tokenizer=tokenizer,
            components=[f"L{layer}.resid@*" for layer in range(n_layers)],
        )
        assert result.target_id == s.short_target, (result.target_id, s.short_target)
        out = grid(n_layers, s.short.ids.shape[1])
        for effect in result.effects:
            if effect.path == "total":
                out[effect.layer, int(effect.component.split("@")[1])] = effect.logprob
        return out

    def atp() -> Tensor:
        result = resstream.patch(
            s.clean.given,
            corrupt=s.corrupt.given,
            model=model,
            tokenizer=tokenizer,
            components=["L*.H*"],
            atp=True,
            confirm=ATP_CONFIRM,
        )
        out = grid(n_layers, n_heads)
        for screened in result.screened:
            out[screened.layer, screened.index] = screened.estimate
        return out

    return {"lens": lens, "dla-heads": dla, "ablate-heads": ablate, "patch-resid": patch, "atp-heads": atp}[
        op
    ]


# ----------------------------------------------------------------------- TransformerLens
def tl_variant(s: Setup, op: str) -> Variant:
    bridge = s.peer("tl")
    n_layers, n_heads = s.n_layers, s.n_heads
    z_hooks = [f"blocks.{layer}.attn.hook_z" for layer in range(n_layers)]
    resid_pre = [f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)]
    gain = bridge.ln_final.weight  # ln_f's γ

    def lens() -> Tensor:
        wanted = {*resid_pre, f"blocks.{n_layers - 1}.hook_resid_post"}
        with torch.no_grad():
            _, cache = bridge.run_with_cache(s.clean.ids, names_filter=lambda name: name in wanted)
            states = cache.accumulated_resid()  # (L + 1, 1, T, d): h_0 .. h_L
            normed = cache.apply_ln_to_stack(states, recompute_ln=True)
            return (normed @ bridge.W_U + bridge.b_U).argmax(-1)[:, 0].cpu()

    def dla() -> Tensor:
        wanted = {*z_hooks, "ln_final.hook_scale"}
        with torch.no_grad():
            logits, cache = bridge.run_with_cache(s.clean.ids, names_filter=lambda name: name in wanted)
            target = int(logits[0, -1].argmax())
            assert target == s.target, (target, s.target)
            heads = cache.stack_head_results(layer=-1, pos_slice=-1, apply_ln=True)  # (L·H, 1, d)
            scores = heads[:, 0] @ (gain * bridge.W_U[:, target])
        return scores.view(n_layers, n_heads).double().cpu()

    def zero_head(z: Tensor, hook: Any, head: int) -> Tensor:
        z[:, :, head] = 0.0
        return z

    def ablate() -> Tensor:
        out = grid(n_layers, n_heads)
        with torch.no_grad():
            for layer in range(n_layers):
                for head in range(n_heads):
                    hooks = [(z_hooks[layer], partial(zero_head, head=head))]
                    logits = bridge.run_with_hooks(s.clean.ids, fwd_hooks=hooks)
                    out[layer, head] = float(log_p(logits, s.target))
        return out

    def patch() -> Tensor:
        length = s.short.ids.shape[1]
        out = grid(n_layers, length)
        with torch.no_grad():
            _, corrupt = bridge.run_with_cache(s.short_corrupt.ids, names_filter=lambda n: n in resid_pre)

            def put(resid: Tensor, hook: Any, layer: int, position: int) -> Tensor:
                resid[:, position] = corrupt[resid_pre[layer]][:, position]
                return resid

            for layer in range(n_layers):
                for position in range(length):
                    hooks = [(resid_pre[layer], partial(put, layer=layer, position=position))]
                    logits = bridge.run_with_hooks(s.short.ids, fwd_hooks=hooks)
                    out[layer, position] = float(log_p(logits, s.short_target))
        return out

    def atp() -> Tensor:
        with torch.no_grad():
            _, corrupt = bridge.run_with_cache(s.corrupt.ids, names_filter=lambda name: name in z_hooks)
        acts: dict[int, Tensor] = {}
        grads: dict[int, Tensor] = {}

        def keep(z: Tensor, hook: Any, layer: int) -> None:
            acts[layer] = z.detach()

        def keep_grad(grad: Tensor, hook: Any, layer: int) -> None:
            grads[layer] = grad.detach()

        def leaf(resid: Tensor, hook: Any) -> Tensor:  # frozen weights: the graph starts at h_0
            return resid.detach().requires_grad_(True)

        bridge.add_hook(resid_pre[0], leaf)
        for layer, name in enumerate(z_hooks):
            bridge.add_hook(name, partial(keep, layer=layer))
            bridge.add_hook(name, partial(keep_grad, layer=layer), dir="bwd")
        try:
            with torch.enable_grad():
                log_p(bridge(s.clean.ids), s.target).backward()
        finally:
            bridge.reset_hooks()
        out = torch.stack(
            [
                ((corrupt[name] - acts[layer]) * grads[layer]).sum(dim=(0, 1, 3))
                for layer, name in enumerate(z_hooks)
            ]
        )
        return out.double().cpu()

    return {"lens": lens, "dla-heads": dla, "ablate-heads": ablate, "patch-resid": patch, "atp-heads": atp}[
        op
    ]


# ----------------------------------------------------------------------- nnsight
def nnsight_variant(s: Setup, op: str) -> Variant:
    lm = s.peer("nnsight")
    n_layers, n_heads, d_head = s.n_layers, s.n_heads, s.d_head
    blocks = lm.transformer.h

    def lens() -> Tensor:
        tops: list[Any] = []
        with torch.no_grad(), lm.trace(s.clean.ids, use_cache=False):
            tops.append(lm.lm_head(lm.transformer.ln_f(blocks[0].input)).argmax(-1).save())
            for layer in range(n_layers):
                out = blocks[layer].output
                state = out[0] if isinstance(out, tuple) else out
                tops.append(lm.lm_head(lm.transformer.ln_f(state)).argmax(-1).save())
        return torch.cat(tops).cpu()  # (L + 1, T)

    def dla() -> Tensor:
        zs: list[Any] = []
        with torch.no_grad(), lm.trace(s.clean.ids, use_cache=False):
            for layer in range(n_layers):
                zs.append(blocks[layer].attn.c_proj.input[0, -1].save())
            final = lm.transformer.ln_f.input[0, -1].save()
            target = lm.lm_head.output[0, -1].argmax().save()
        assert int(target) == s.target, (int(target), s.target)
        model = s.twins["nnsight"]
        ln_f = model.transformer.ln_f
        with torch.no_grad():
            scale = (final.var(unbiased=False) + ln_f.eps).sqrt()
            direction = ln_f.weight * model.lm_head.weight[s.target]
            rows = []
            for layer, z in enumerate(zs):
                w_o = model.transformer.h[layer].attn.c_proj.weight.view(n_heads, d_head, -1)  # Conv1D
                heads = torch.einsum("hd,hdm->hm", z.view(n_heads, d_head), w_o)
                rows.append((heads - heads.mean(-1, keepdim=True)) / scale @ direction)
        return torch.stack(rows).double().cpu()

    def batched(
        runs: list[tuple[int, int]], ids: Tensor, target: int, edit: Callable[[int, int], None], size: int
    ) -> list[float]:
        """log p(target) of each run, `edit(layer, index)` applied, `size` invokes per trace."""
        found: list[Any] = []
        with torch.no_grad():
            for chunk in chunks(runs, size):
                with lm.trace() as tracer:
                    for layer, index in chunk:
                        with tracer.invoke(ids, use_cache=False):
                            edit(layer, index)
                            found.append(lm.lm_head.output[0, -1].log_softmax(-1)[target].save())
        return [float(value) for value in found]

    def ablate() -> Tensor:
        def zero(layer: int, head: int) -> None:
            blocks[layer].attn.c_proj.input[:, :, head * d_head : (head + 1) * d_head] = 0.0

        runs = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
        found = batched(runs, s.clean.ids, s.target, zero, s.invokes or n_heads)
        return torch.tensor(found, dtype=torch.float64).view(n_layers, n_heads)

    def patch() -> Tensor:
        length = s.short.ids.shape[1]
        states: list[Any] = []
        with torch.no_grad(), lm.trace(s.short_corrupt.ids, use_cache=False):
            for layer in range(n_layers):
                states.append(blocks[layer].input.save())

        def put(layer: int, position: int) -> None:
            blocks[layer].input[:, position] = states[layer][:, position]

        runs = [(layer, position) for layer in range(n_layers) for position in range(length)]
        found = batched(runs, s.short.ids, s.short_target, put, s.invokes or length)
        return torch.tensor(found, dtype=torch.float64).view(n_layers, length)

    def atp() -> Tensor:
        corrupt: list[Any] = []
        with torch.no_grad(), lm.trace(s.corrupt.ids, use_cache=False):
            for layer in range(n_layers):
                corrupt.append(blocks[layer].attn.c_proj.input.save())
        clean: list[Any] = []
        grads: list[Any] = []
        with torch.enable_grad(), lm.trace(s.clean.ids, use_cache=False):
            blocks[0].input.requires_grad_(True)  # frozen weights: the graph starts at h_0
            for layer in range(n_layers):
                clean.append(blocks[layer].attn.c_proj.input.save())
            metric = lm.lm_head.output[0, -1].log_softmax(-1)[s.target]
            with metric.backward():
                for layer in reversed(range(n_layers)):
                    grads.append(clean[layer].grad.save())
        grads.reverse()
        rows = [
            ((c - z) * g).detach().view(-1, n_heads, d_head).sum(dim=(0, 2))
            for c, z, g in zip(corrupt, clean, grads, strict=True)
        ]
        return torch.stack(rows).double().cpu()

    return {"lens": lens, "dla-heads": dla, "ablate-heads": ablate, "patch-resid": patch, "atp-heads": atp}[
        op
    ]


MAKERS = {"resstream": resstream_variant, "tl": tl_variant, "nnsight": nnsight_variant}


def make_variants(
    setup: Setup, op: str, tools: list[str]
) -> tuple[dict[str, Variant], dict[str, str], dict[str, str]]:
    """The runnable tools of `op` among `tools`, the reasons for those skipped, and the peers'
    versions."""
    variants: dict[str, Variant] = {}
    skipped: dict[str, str] = {}
    versions: dict[str, str] = {}
    for tool in tools:
        if tool in PEERS:
            found, said = load_peer(*PEERS[tool])
            if found is None:
                skipped[tool] = said
                continue
            versions[PEERS[tool][1]] = said
            try:
                variants[tool] = MAKERS[tool](setup, op)
            except Exception as error:  # installed, but cannot wrap the model: say why, go on
                skipped[tool] = f"{said} cannot wrap the model: {type(error).__name__}: {error}"
        else:
            variants[tool] = MAKERS[tool](setup, op)
    return variants, skipped, versions


# ----------------------------------------------------------------------- agreement
def float64_scores(setup: Setup, cells: list[tuple[int, int]]) -> list[Tensor]:
    """The logit lens's scores of h_l at position p for each cell (l, p), in float64 from
    resstream's own float32 states."""
    from resstream.capture import residual_states
    from resstream.models.adapters import view_of

    model = setup.model
    ln_f = model.transformer.ln_f
    with torch.no_grad():
        states = residual_states(view_of(model), setup.clean.ids)[:, 0].double()
        gain, bias, w_u = ln_f.weight.double(), ln_f.bias.double(), model.lm_head.weight.double()
        normed = [
            torch.nn.functional.layer_norm(states[layer, position], (states.shape[-1],), gain, bias, ln_f.eps)
            for layer, position in cells
        ]
        return [(w_u @ h).cpu() for h in normed]


def lens_agreement(setup: Setup, reference: Tensor, found: Tensor) -> dict[str, Any]:
    """Cells whose top-1 differs from resstream's, and of those the fp32 near-ties (module
    docstring) and the real disagreements."""
    differ = (reference != found).nonzero().tolist()
    ties, real = 0, []
    for (layer, position), scores in zip(differ, float64_scores(setup, differ), strict=True):
        ours, theirs = int(reference[layer, position]), int(found[layer, position])
        gap = float(scores[ours] - scores[theirs]) / max(1.0, float(scores.abs().max()))
        if int(scores.argmax()) == ours and gap <= NEAR_TIE:
            ties += 1
        else:
            real.append({"cell": [layer, position], "resstream": ours, "peer": theirs, "gap": gap})
    return {"cells": reference.numel(), "differ": len(differ), "near_ties": ties, "disagree": real}


def agreement(setup: Setup, op: str, outputs: dict[str, Tensor]) -> dict[str, Any]:
    """Each peer's agreement with resstream on `op` (a missing resstream: nothing)."""
    reference = outputs.get("resstream")
    if reference is None:
        return {}
    found: dict[str, Any] = {}
    for tool, value in outputs.items():
        if tool == "resstream":
            continue
        if op == "lens":
            found[tool] = lens_agreement(setup, reference, value.cpu())
        else:
            found[tool] = {"max_abs_diff": float((value.cpu() - reference).abs().max())}
    return found


def agreement_text(op: str, found: dict[str, Any]) -> str:
    parts = []
    for tool, said in found.items():
        if op == "lens":
            text = f"{said['differ']} of {said['cells']} cells differ"
            if said["differ"]:
                text += f" ({said['near_ties']} fp32 near-ties, {len(said['disagree'])} not)"
            parts.append(f"{LABELS[tool]}: {text}")
        else:
            parts.append(f"{LABELS[tool]}: max abs Δ {said['max_abs_diff']:.1e}")
    return "; ".join(parts) or "–"


# ----------------------------------------------------------------------- memory
def memory_child(args: argparse.Namespace) -> None:
    """In a fresh process: extra peak memory of one (warmed) call of OP/TOOL; one JSON line."""
    import json

    op, tool = args.measure_memory.split("/")
    setup = build_setup(args)
    variants, skipped, _ = make_variants(setup, op, [tool])
    if tool in skipped:
        print(json.dumps({"variant": args.measure_memory, "skipped": skipped[tool]}))
        return
    run = variants[tool]
    run()
    if args.device.startswith("cuda"):
        grown, _ = cuda_peak_growth(run, args.device)
    else:
        grown, _ = peak_growth(run)
    print(json.dumps({"variant": args.measure_memory, "extra_bytes": grown}))


def child_flags(args: argparse.Namespace) -> list[str]:
    """The flags that rebuild this run's setup in a child."""
    flags = [
        *("--layers", str(args.layers), "--d-model", str(args.d_model), "--heads", str(args.heads)),
        *("--vocab", str(args.vocab), "--seq", str(args.seq), "--patch-seq", str(args.patch_seq)),
        *("--invokes", str(args.invokes), "--device", args.device),
    ]
    return flags + (["--threads", str(args.threads)] if args.threads else [])


def extra_peak_memory(args: argparse.Namespace, names: list[str]) -> dict[str, float]:
    """Extra peak memory (bytes) of each OP/TOOL: median over `--memory-repeats` processes."""
    out: dict[str, float] = {}
    for name in names:
        command = [sys.executable, __file__, "--measure-memory", name, *child_flags(args)]
        values, failed = fresh_process_peaks(command, args.memory_repeats)
        if failed is not None:
            print(f"memory of {name}: {failed}")
        if values:
            out[name] = statistics.median(values)
            print(f"extra peak memory of {name}: " + " ".join(f"{v / 1e6:.1f}" for v in values) + " MB")
    return out


# ----------------------------------------------------------------------- running and reporting
def measure(setup: Setup, ops: list[str], tools: list[str], rounds: int) -> dict[str, Any]:
    """Interleaved rounds of every tool on each operation, and each peer's agreement."""
    record: dict[str, Any] = {"seconds": {}, "median_seconds": {}, "agreement": {}, "skipped": {}}
    record["versions"] = {}
    said: set[str] = set()
    for op in ops:
        variants, skipped, versions = make_variants(setup, op, tools)
        record["versions"].update(versions)
        for tool, reason in skipped.items():
            if tool not in said:
                print(f"{LABELS[tool]}: skipped ({reason})")
                said.add(tool)
        print(f"\n{op}:", flush=True)
        seconds, outputs = interleaved(variants, rounds, setup.device, report=".2f")
        record["seconds"][op] = seconds
        record["median_seconds"][op] = medians(seconds)
        record["agreement"][op] = agreement(setup, op, outputs)
        record["skipped"][op] = skipped
        print(f"{op} agreement with resstream: {agreement_text(op, record['agreement'][op])}")
    return record


def spread(values: list[float], fmt: str) -> str:
    """The median, and the range when there are several rounds."""
    mid = format(statistics.median(values), fmt)
    return mid if len(values) == 1 else f"{mid} ({min(values):{fmt}}–{max(values):{fmt}})"


def report(record: dict[str, Any], memory: dict[str, float], tools: list[str]) -> None:
    """The per-round figures and the Markdown tables (time, memory)."""
    seconds = record["seconds"]
    print("\nper-round seconds (interleaved, rotating order):")
    for op, by_tool in seconds.items():
        for tool, values in by_tool.items():
            print(f"  {op:13s} {LABELS[tool]:9s} {' '.join(f'{v:8.3f}' for v in values)}")
    peers = [t for t in tools if t != "resstream"]
    print("\nMarkdown (seconds: median (range) over rounds; ratios: median (range) of per-round ratios):\n")
    head = ["operation", "resstream s", *(f"{LABELS[p]} s" for p in peers)]
    head += [f"{LABELS[p]} ÷ resstream" for p in peers] + ["agreement"]
    print("| " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * (len(head) - 2) + " --- |")
    for op, by_tool in seconds.items():
        cells = [op] + [spread(by_tool[t], ".2f") if t in by_tool else "–" for t in ["resstream", *peers]]
        for peer in peers:
            ratio = median_ratio(by_tool, peer, "resstream")
            if ratio is None:
                cells.append("–")
            else:
                each = [a / b for a, b in zip(by_tool[peer], by_tool["resstream"], strict=True)]
                cells.append(spread(each, ".2f"))
        cells.append(agreement_text(op, record["agreement"][op]))
        print("| " + " | ".join(cells) + " |")
    if memory:
        print("\nextra peak memory (MB, one warmed call in a fresh process):\n")
        print("| operation | " + " | ".join(LABELS[t] for t in tools) + " |")
        print("| --- |" + " ---: |" * len(tools))
        for op in seconds:
            row = [memory.get(f"{op}/{t}") for t in tools]
            print(f"| {op} | " + " | ".join("–" if v is None else f"{v / 1e6:.1f}" for v in row) + " |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--seq", type=int, default=128, help="tokens of the text (default 128)")
    parser.add_argument(
        "--patch-seq", type=int, default=32, help="tokens of patch-resid's texts (default 32)"
    )
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {', '.join(TOOLS)}")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-ups (default 3)")
    parser.add_argument(
        "--invokes", type=int, default=0, help="nnsight: interventions batched per trace (0: one layer's)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (fp32 either way)")
    parser.add_argument("--cuda", action="store_const", const="cuda", dest="device", help="--device cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--no-memory", action="store_true", help="skip the extra-peak-memory subprocesses")
    parser.add_argument("--memory-repeats", type=int, default=1, help="fresh processes per variant (median)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--measure-memory", metavar="OP/TOOL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag, allowed in (("ops", OPS), ("tools", TOOLS)):
        unknown = sorted(set(getattr(args, flag).split(",")) - set(allowed))
        if unknown:
            parser.error(f"--{flag}: unknown {unknown}; allowed: {', '.join(allowed)}")
    if args.seq < 2 or args.patch_seq < 2:
        parser.error("--seq and --patch-seq: at least 2 tokens")
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.measure_memory:
        memory_child(args)
        return
    ops = [op for op in OPS if op in args.ops.split(",")]
    tools = [tool for tool in TOOLS if tool in args.tools.split(",")]
    setup = build_setup(args)
    print(
        f"{args.device} ({device_name(args.device)}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load {load_average():.1f}; GPT-2 shape {args.layers} layers, "
        f"d {args.d_model}, {args.heads} heads, vocab {args.vocab}, random weights, fp32; {args.seq} tokens "
        f"(patch-resid {args.patch_seq}); target {setup.target}; {args.rounds} rounds; resstream given "
        f"{'ids' if GIVE_IDS else 'text'}"
    )
    record = measure(setup, ops, tools, args.rounds)
    for package, version in record["versions"].items():
        print(f"peer {package}: {version}")
    timed = [f"{op}/{tool}" for op in ops for tool in record["seconds"][op]]
    memory = {} if args.no_memory else extra_peak_memory(args, timed)
    record["extra_peak_bytes"] = memory
    report(record, memory, [t for t in tools if any(t in s for s in record["seconds"].values())])
    if args.json:
        write_record(
            args.json,
            {
                "torch": torch.__version__,
                "device_name": device_name(args.device),
                "threads": torch.get_num_threads(),
                "load_average": load_average(),
                "args": vars(args) | {"json": str(args.json)},
                "give_ids": GIVE_IDS,
                **record,
            },
        )


if __name__ == "__main__":
    main()
