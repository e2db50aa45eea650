"""What a model or a training run will cost, estimated from its config before anything is built.

* Parameters are counted analytically (`parameter_count`, exact for resstream's GPT: a test
  compares it with `GPT.num_params`), so a config of 10⁹ layers is judged without building it.
* Memory (`model_bytes`, `training_bytes`) is what must exist at once: the weights in float32
  (and, to train, their gradients and AdamW's two moments: 4 copies), the Python objects of
  every block (`BLOCK_OVERHEAD_BYTES`), rotary tables, and the activations one micro-batch
  keeps for the backward pass (`ACTIVATION_VALUES_PER_WIDTH` per layer, and the logits). The
  figures are measured and rounded down, so that the estimate stays below the real peak (94%
  of it for GPT-2 small compiled on an H100): a refusal means the run surely cannot fit.
* Time (`training_seconds`) is a lower bound too: training FLOPs (`flops_per_token`: 6·N per
  token and the attention term) and evaluation FLOPs at an optimistic peak rate
  (`PEAK_FLOPS_BOUND`), and never less than `MIN_STEP_SECONDS` per step.

`check_training_budget` refuses, with one line naming the values responsible, a run that
cannot fit in the memory of its device or would run for longer than
`resstream.resources.MAX_RUN_SECONDS`, and a CPU thread count far above the CPUs there are.
`check_model_fits` does the same for building a model to analyse it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from resstream.devices import resolve_device
from resstream.resources import (
    MAX_RUN_SECONDS,
    check_duration,
    check_fits,
    check_threads,
    format_duration,
)
from resstream.training.config import ModelConfig, TrainConfig

FLOAT32_BYTES = 4
#: Float32 copies of every parameter while training with AdamW: weights, gradients, 2 moments.
TRAINING_COPIES = 4
#: Memory of one block beyond its tensors (module objects, parameter headers): 32-35 KB measured.
BLOCK_OVERHEAD_BYTES = 32_000
#: Bytes per requested vocabulary entry that the `tokenizers` BPE trainer allocates before it
#: looks at the corpus (measured: 4.8 GB at 2·10⁸ entries, 17.7 GB at 3·10⁸, 70 GB at 10⁹).
BPE_BYTES_PER_ENTRY = 60
#: Values one token keeps for the backward pass per layer and unit of `d_model`, and per
#: vocabulary entry (the logits and their log-softmax). Measured on an H100 in bfloat16 with
#: GPT-2-small shapes (benchmarks/bench_budget.py): 17.5 per layer and width, 3 per entry
#: compiled, 7 eager; the smaller figures are used so that the estimate stays below the peak.
ACTIVATION_VALUES_PER_WIDTH = 16
ACTIVATION_VALUES_PER_VOCAB_ENTRY = 3
#: FLOP/s no device of the type exceeds today, so that time estimates are lower bounds
#: (measured: 4e14 for GPT-2 small on an H100, compiled; 2e11 on 2 CPU cores).
PEAK_FLOPS_BOUND = {"cuda": 5e15, "mps": 1e14, "cpu": 2e13}
#: The least time one training step takes whatever the model (Python loop, kernel launches;
#: measured: 5 ms for a 2-layer model on an H100 and on 16 CPU cores, 20 ms on 2 cores).
MIN_STEP_SECONDS = 1e-4


@dataclasses.dataclass(frozen=True)
class Cost:
    """A part of an estimate and the config values that drive it (name, value)."""

    amount: float
    drivers: tuple[tuple[str, int], ...]


def named_drivers(cost: Cost, *, most: int = 2, marked: bool = True) -> str:
    """The (at most `most`) largest values behind `cost`, as a message starts them:
    ```n_layer` 1000000000 and `d_model` 16`` (`marked`: names are parameters, backticked;
    otherwise they are keys of a saved file)."""
    ranked = sorted(cost.drivers, key=lambda pair: -pair[1])[:most]
    return " and ".join(f"`{name}` {value}" if marked else f"{name} {value}" for name, value in ranked)


def parameter_count(model: ModelConfig, vocab_size: int | None = None) -> int:
    """Parameters of resstream's GPT with `model`'s shape (`vocab_size`: the resolved
    vocabulary, default `model.vocab_size`); tied embeddings counted once."""
    return int(sum(cost.amount for cost in _parameter_costs(model, vocab_size)))


def _parameter_costs(model: ModelConfig, vocab_size: int | None) -> list[Cost]:
    """Parameters per part: blocks (with the gate), token embeddings, position embeddings."""
    d, m, layers, bias = model.d_model, model.mlp_width, model.n_layer, int(model.bias)
    vocab = model.vocab_size if vocab_size is None else vocab_size
    norm = {"layernorm": d * (1 + bias), "rmsnorm": d, "none": 0}[model.norm]
    attention = 4 * d * d + 4 * d * bias
    mlp = 2 * d * m + (m + d) * bias
    gate = {"learned": layers, "router": (d + 1) * layers}.get(model.gate, 0)
    final_norm = norm if model.norm_position == "pre" else 0
    width = [("d_model", d)] + ([("d_mlp", m)] if model.d_mlp else [])
    positions = model.block_size * d if model.pos_emb == "learned" else 0
    return [
        Cost(layers * (attention + mlp + 2 * norm) + gate + final_norm, (("n_layer", layers), *width)),
        Cost(vocab * d, (("vocab_size", vocab), ("d_model", d))),
        Cost(positions, (("block_size", model.block_size), ("d_model", d))),
    ]


def _structure_costs(model: ModelConfig) -> list[Cost]:
    """Bytes beyond the parameters: block objects and rotary tables (one per layer)."""
    head_dim = model.d_model // model.n_head
    rotary = model.n_layer * model.block_size * head_dim * FLOAT32_BYTES if model.pos_emb == "rotary" else 0
    return [
        Cost(model.n_layer * BLOCK_OVERHEAD_BYTES, (("n_layer", model.n_layer),)),
        Cost(rotary, (("block_size", model.block_size), ("n_layer", model.n_layer))),
    ]


def model_bytes(model: ModelConfig, vocab_size: int | None = None, *, copies: int = 1) -> list[Cost]:
    """Bytes of a built model (float32), per part; `copies` float32 copies of each parameter."""
    params = [
        Cost(cost.amount * FLOAT32_BYTES * copies, cost.drivers)
        for cost in _parameter_costs(model, vocab_size)
    ]
    return params + _structure_costs(model)


def training_vocab(config: TrainConfig) -> tuple[str, int]:
    """The vocabulary a run will have as far as the config tells, and the field that sets it:
    a BPE tokenizer trained to `bpe_vocab_size` entries gives at most that many, and a
    `vocab_size` > 0 pads the vocabulary to it (`resstream.training.preparation.resolve_vocab`)."""
    bpe = config.tokenizer.bpe_vocab_size if config.tokenizer.tokenizer == "bpe" else 0
    if bpe > config.model.vocab_size:
        return "bpe_vocab_size", bpe
    return "vocab_size", config.model.vocab_size


def training_bytes(config: TrainConfig, device: torch.device, world: int = 1) -> list[Cost]:
    """Bytes one process holds at once while training (module docstring), per part."""
    name, vocab = training_vocab(config)
    model, run = config.model, config.run
    parts = [_renamed(cost, "vocab_size", name) for cost in model_bytes(model, vocab, copies=TRAINING_COPIES)]
    micro = max(run.batch_size // (run.grad_accum * world), 1)
    tokens_bytes = micro * model.block_size * (2 if _amp_bf16(config, device) else FLOAT32_BYTES)
    batch = (("batch_size", run.batch_size), ("block_size", model.block_size))
    per_layer = ACTIVATION_VALUES_PER_WIDTH * model.d_model
    return [
        *parts,
        Cost(
            tokens_bytes * model.n_layer * per_layer,
            (("n_layer", model.n_layer), ("d_model", model.d_model), *batch),
        ),
        Cost(tokens_bytes * vocab * ACTIVATION_VALUES_PER_VOCAB_ENTRY, (*batch, (name, vocab))),
    ]


def _renamed(cost: Cost, old: str, new: str) -> Cost:
    return Cost(cost.amount, tuple((new if name == old else name, value) for name, value in cost.drivers))


def _amp_bf16(config: TrainConfig, device: torch.device) -> bool:
    """Whether the run computes in bfloat16 (`Trainer._amp_dtype`)."""
    dtype = config.run.dtype
    return dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda")


def flops_per_token(model: ModelConfig, vocab_size: int | None = None) -> float:
    """Training FLOPs per token (forward + backward) of resstream's GPT: 6·N + 12·L·d·T (PaLM
    appendix B), N the parameters without the position embeddings."""
    learned_positions = model.block_size * model.d_model if model.pos_emb == "learned" else 0
    non_embedding = parameter_count(model, vocab_size) - learned_positions
    return 6 * non_embedding + 12 * model.n_layer * model.d_model * model.block_size


def training_seconds(config: TrainConfig, device: torch.device, world: int = 1) -> list[Cost]:
    """A lower bound on the time of the whole run in seconds: training steps, evaluations."""
    _, vocab = training_vocab(config)
    run, model = config.run, config.model
    tokens_per_step = run.batch_size * model.block_size
    rate = PEAK_FLOPS_BOUND.get(device.type, PEAK_FLOPS_BOUND["cpu"]) * world
    train_flops = flops_per_token(model, vocab) * tokens_per_step
    step = max(train_flops / rate, MIN_STEP_SECONDS)
    evaluations = run.max_steps // run.eval_interval + 1
    forward_flops = evaluations * run.eval_batches * train_flops / 3
    return [
        Cost(run.max_steps * step, (("max_steps", run.max_steps),)),
        Cost(forward_flops / rate, (("eval_batches", run.eval_batches),)),
    ]


def check_training_budget(config: TrainConfig, device: torch.device | None = None, *, world: int = 1) -> None:
    """Refuse (UsageError, one line) a run that cannot fit in `device`'s memory (default: the
    config's device), would take longer than `MAX_RUN_SECONDS`, or asks for far more CPU
    threads than there are CPUs. `world`: processes sharing the batch (torchrun)."""
    device = resolve_device(config.run.device) if device is None else device
    check_threads("threads", config.run.threads)
    _check_bpe_trainer(config)
    costs = training_bytes(config, device, world)
    check_fits(
        named_drivers(largest(costs)),
        sum(cost.amount for cost in costs),
        device,
        purpose="to train (float32 weights, gradients and AdamW moments, and activations)",
    )
    _check_training_time(config, device, world)


def _check_bpe_trainer(config: TrainConfig) -> None:
    if config.tokenizer.tokenizer != "bpe":
        return
    size = config.tokenizer.bpe_vocab_size
    check_fits(f"`bpe_vocab_size` {size}", size * BPE_BYTES_PER_ENTRY, purpose="for the BPE trainer's tables")


def _check_training_time(config: TrainConfig, device: torch.device, world: int) -> None:
    training, evaluation = costs = training_seconds(config, device, world)
    total, run = training.amount + evaluation.amount, config.run
    if training.amount >= evaluation.amount:
        steps_allowed = int(MAX_RUN_SECONDS * run.max_steps / total)
        allowed = f"`max_steps` <= {steps_allowed}" if steps_allowed >= 1 else ""
        basis = f"{format_duration(total / run.max_steps)} per step at least, on {device.type}"
    else:
        evaluations = run.max_steps // run.eval_interval + 1
        allowed = ""
        basis = f"{evaluations} evaluations of {run.eval_batches} batches, on {device.type}"
    check_duration(named_drivers(largest(costs), most=1), total, basis=basis, allowed=allowed)


def check_model_fits(model: ModelConfig, source: str, device: str | torch.device = "cpu") -> None:
    """Refuse (UsageError) building a model of shape `model`, read from the file `source`,
    that cannot fit: its float32 weights and block objects on the host, where it is built,
    and its weights on a CUDA `device` it then moves to. The message names the file's keys
    (not parameters: no flag of the running command set them)."""
    costs = model_bytes(model)
    what = f"{source} with {named_drivers(largest(costs), marked=False)}"
    purpose = "for the weights (float32)"
    check_fits(what, sum(cost.amount for cost in costs), "cpu", purpose=purpose)
    if torch.device(device).type == "cuda":
        check_fits(what, parameter_count(model) * FLOAT32_BYTES, device, purpose=purpose)


def largest(costs: Sequence[Cost]) -> Cost:
    """The largest part of an estimate."""
    return max(costs, key=lambda cost: cost.amount)
