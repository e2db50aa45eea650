"""Generating continuations: the model's own `generate` where it has one, else a plain loop.

A Hugging Face causal LM generates with its own `generate` (its KV cache, its stopping at
the end-of-text token); any edits the caller installed (`resstream.stream.edited`) act on
every forward it runs. A model without one (resstream's GPT) runs `decode_loop`: at each
step the whole sequence so far is run again (no cache) and the next token chosen by the same
rule. The rule (`Sampling`): greedy (temperature 0: the most probable token; ties to the
lowest id), or sampled from softmax(logits / temperature) cut to the smallest set of tokens
whose probability reaches `top_p`, with `seed` seeding the draws (the global generator for
Hugging Face's `generate`, which draws from it; a generator of its own in `decode_loop`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from resstream.errors import UsageError
from resstream.models.adapters.base import ModelView

#: New tokens per continuation, at most (the context is checked too).
MAX_NEW_TOKENS = 4096


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen (module docstring): `max_new_tokens` per continuation,
    `temperature` (0: greedy), `top_p` (1: the whole distribution), `seed`, and `use_cache`
    (Hugging Face models: generate with the KV cache)."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    use_cache: bool = True

    @property
    def greedy(self) -> bool:
        """Whether the most probable token is always taken."""
        return self.temperature == 0

    def check(self) -> None:
        """UsageError for a value outside its range (naming it and the range)."""
        new = self.max_new_tokens
        if not isinstance(new, int) or isinstance(new, bool) or not 1 <= new <= MAX_NEW_TOKENS:
            raise UsageError(f"`max_new_tokens` {new!r}; allowed: 1..{MAX_NEW_TOKENS}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UsageError(f"`temperature` {self.temperature!r}; allowed: a finite number >= 0 (0: greedy)")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise UsageError(f"`top_p` {self.top_p!r}; allowed: 0 < top_p <= 1")


def check_room(view: ModelView, prompt_tokens: int, sampling: Sampling) -> None:
    """UsageError when a prompt and its new tokens do not fit the model's context."""
    total = prompt_tokens + sampling.max_new_tokens
    if view.max_positions is not None and total > view.max_positions:
        room = view.max_positions - prompt_tokens
        raise UsageError(
            f"a prompt of {prompt_tokens} tokens + `max_new_tokens` {sampling.max_new_tokens} = {total} "
            f"tokens is over the model's context of {view.max_positions}; "
            f"allowed: `max_new_tokens` <= {max(room, 0)}"
        )


def generate_ids(view: ModelView, prompts: Tensor, sampling: Sampling, eos_id: int | None = None) -> Tensor:
    """Prompts (batch, P) with their continuations, (batch, P + new): Hugging Face's
    `generate`, or `decode_loop` for a model without one (module docstring). Positions after
    an end-of-text token hold `eos_id` (Hugging Face pads them with it too)."""
    model = view.model
    if view.family != "resstream" and callable(getattr(model, "generate", None)):
        return _hf_generate(view, prompts, sampling, eos_id)
    return decode_loop(view, prompts, sampling, eos_id)


def _hf_generate(view: ModelView, prompts: Tensor, sampling: Sampling, eos_id: int | None) -> Tensor:
    model: Any = view.model  # a Hugging Face causal LM (`generate_ids` checked it has `generate`)
    options: dict[str, object] = {
        "max_new_tokens": sampling.max_new_tokens,
        "do_sample": not sampling.greedy,
        "use_cache": sampling.use_cache,
        "attention_mask": torch.ones_like(prompts),
        "pad_token_id": eos_id if eos_id is not None else 0,
        "eos_token_id": eos_id,  # None: no token stops a continuation early
    }
    if not sampling.greedy:
        options.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
    else:  # a checkpoint's generation config may ask for sampling: greedy means greedy
        options.update(temperature=None, top_p=None, top_k=None)
    torch.manual_seed(sampling.seed)
    with torch.no_grad():
        out = model.generate(prompts, **options)
    return _padded(out, prompts.shape[1] + sampling.max_new_tokens, eos_id)


def _padded(ids: Tensor, length: int, eos_id: int | None) -> Tensor:
    """`ids` (batch, n ≤ length) filled up to `length` with `eos_id` (a batch that stopped
    early at the end-of-text token)."""
    if ids.shape[1] >= length:
        return ids[:, :length]
    fill = ids.new_full((ids.shape[0], length - ids.shape[1]), 0 if eos_id is None else eos_id)
    return torch.cat([ids, fill], dim=1)


def decode_loop(view: ModelView, prompts: Tensor, sampling: Sampling, eos_id: int | None = None) -> Tensor:
    """Prompts (batch, P) with `max_new_tokens` new tokens each, the whole sequence run again
    at every step (module docstring); a row that produced `eos_id` keeps producing it."""
    generator = torch.Generator(device=prompts.device).manual_seed(sampling.seed)
    ids = prompts
    done = torch.zeros(prompts.shape[0], dtype=torch.bool, device=prompts.device)
    with torch.no_grad():
        for _ in range(sampling.max_new_tokens):
            logits = next_logits(view, ids)
            chosen = choose(logits, sampling, generator)
            if eos_id is not None:
                chosen = torch.where(done, torch.full_like(chosen, eos_id), chosen)
                done |= chosen == eos_id
            ids = torch.cat([ids, chosen[:, None]], dim=1)
    return ids


def next_logits(view: ModelView, ids: Tensor) -> Tensor:
    """The model's logits (batch, vocab) for the token after `ids` (batch, n)."""
    out = view.model(ids) if view.family == "resstream" else view.model(input_ids=ids)
    logits = out[0] if isinstance(out, tuple) else out.logits
    return logits[:, -1].float()


def choose(logits: Tensor, sampling: Sampling, generator: torch.Generator) -> Tensor:
    """The next token of each row (batch,) from its logits (batch, vocab) by `sampling`'s rule."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1:
        probs = nucleus(probs, sampling.top_p)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def nucleus(probs: Tensor, top_p: float) -> Tensor:
    """`probs` (batch, vocab) cut to each row's smallest set of most probable tokens whose
    total reaches `top_p`, renormalised (the most probable token is always kept)."""
    ordered, order = probs.sort(dim=-1, descending=True)
    before = ordered.cumsum(dim=-1) - ordered  # the mass of the tokens ranked above each one
    kept = torch.where(before < top_p, ordered, torch.zeros_like(ordered))
    cut = torch.zeros_like(probs).scatter(-1, order, kept)
    return cut / cut.sum(dim=-1, keepdim=True)


__all__ = [
    "MAX_NEW_TOKENS",
    "Sampling",
    "check_room",
    "choose",
    "decode_loop",
    "generate_ids",
    "next_logits",
    "nucleus",
]
