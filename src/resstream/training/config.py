"""Typed training configuration: dataclasses, presets, YAML files and command-line flags.

A config has four sections. `model`, `data` and `tokenizer` fix what a checkpoint means:
resuming with any of them changed is refused. `optim` and `run` may change between runs.

Every field can be set three ways, later ones winning: a preset, a YAML file (sections as
mappings, or flat keys), and flat overrides by field name (the command line's flags,
`resstream.cli.train`). Field names are unique across sections so a flat name is enough.

One idea at 500 lines: the config's schema (sections, fields and their help), its named values
(presets), the one path every source of values takes into a config (`flatten`, `coerce`,
`build_config`) and the values it allows (`RANGES`, `validate`) change together whenever a
field is added, so they stay side by side.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from resstream.errors import UsageError, closest, short_reason

GateKind = Literal["none", "fixed", "learned", "router"]
NormKind = Literal["layernorm", "rmsnorm", "none"]
NormPosition = Literal["pre", "post"]
PosEmbKind = Literal["learned", "rotary", "none"]


def about(description: str) -> dict[str, str]:
    """A config field's metadata: its one-line description (shown by `resstream train --help`)."""
    return {"help": description}


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the GPT-2-style decoder and of its residual gate."""

    #: The family key under which the analysis adapters know resstream's GPT (like a Hugging
    #: Face config's model_type); a class constant, not a field of saved configs.
    model_type: ClassVar[str] = "resstream"

    n_layer: int = field(default=4, metadata=about("Transformer blocks."))
    n_head: int = field(default=4, metadata=about("Attention heads per block (must divide d_model)."))
    d_model: int = field(default=128, metadata=about("Width of the residual stream."))
    d_mlp: int = field(default=0, metadata=about("Hidden width of the MLP (0: 4 x d_model)."))
    block_size: int = field(
        default=128, metadata=about("Context length in tokens (training windows, positions).")
    )
    vocab_size: int = field(
        default=0, metadata=about("Embedding rows (0: the tokenizer's size; more pads it).")
    )
    norm: NormKind = field(default="layernorm", metadata=about("Normalisation: layernorm, rmsnorm or none."))
    norm_position: NormPosition = field(
        default="pre", metadata=about("pre (norm before attention/MLP) or post (after the sum).")
    )
    pos_emb: PosEmbKind = field(
        default="learned", metadata=about("Positional embeddings: learned, rotary or none.")
    )
    bias: bool = field(default=True, metadata=about("Biases in linear layers and norms."))
    dropout: float = field(default=0.0, metadata=about("Dropout probability in training."))
    gate: GateKind = field(
        default="none", metadata=about("Residual gate: none, fixed (alpha at cut_layer), learned, router.")
    )
    alpha: float = field(
        default=0.5, metadata=about("fixed gate: identity-path scale at cut_layer, in (0, 1].")
    )
    cut_layer: int = field(
        default=-1, metadata=about("fixed gate: the layer it scales (-1: the middle layer).")
    )
    gate_strength: float = field(
        default=0.5, metadata=about("learned/router: s in alpha_l = 1 - s * p_l, in (0, 1).")
    )

    @property
    def mlp_width(self) -> int:
        """Hidden width of the MLP."""
        return self.d_mlp or 4 * self.d_model

    @property
    def resolved_cut_layer(self) -> int:
        """`cut_layer`, with -1 resolved to the middle layer."""
        return self.n_layer // 2 if self.cut_layer == -1 else self.cut_layer


@dataclass(frozen=True)
class DataConfig:
    """Where the training tokens come from."""

    dataset: str = field(
        default="shakespeare", metadata=about("Training corpus: a named corpus or a .txt/.jsonl path.")
    )
    val_fraction: float = field(
        default=0.1, metadata=about("Last fraction of the token stream held out for validation.")
    )


@dataclass(frozen=True)
class TokenizerConfig:
    """Which tokenizer: a Hugging Face name/directory, or `bpe` trained on the corpus."""

    tokenizer: str = field(
        default="bpe",
        metadata=about("bpe (trained on the corpus) or a Hugging Face tokenizer name/directory."),
    )
    bpe_vocab_size: int = field(default=4096, metadata=about("Vocabulary size of the bpe tokenizer."))


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup and cosine decay."""

    lr: float = field(default=3e-3, metadata=about("Peak learning rate (AdamW)."))
    min_lr: float = field(default=3e-4, metadata=about("Learning rate at the end of the cosine decay."))
    gate_lr: float = field(default=1e-2, metadata=about("Learning rate of the gate's parameters."))
    weight_decay: float = field(default=0.1, metadata=about("AdamW weight decay of the weight matrices."))
    beta1: float = field(default=0.9, metadata=about("AdamW beta1."))
    beta2: float = field(default=0.95, metadata=about("AdamW beta2."))
    warmup_steps: int = field(default=20, metadata=about("Steps of linear learning-rate warmup."))
    grad_clip: float = field(default=1.0, metadata=about("Gradient-norm clipping (0: off)."))


@dataclass(frozen=True)
class RunConfig:
    """How long, how big a batch, where and how often."""

    max_steps: int = field(default=200, metadata=about("Optimizer steps."))
    batch_size: int = field(default=16, metadata=about("Sequences per optimizer step, over all processes."))
    grad_accum: int = field(default=1, metadata=about("Micro-batches per step (gradient accumulation)."))
    seed: int = field(default=0, metadata=about("Seed of initialisation and data order."))
    eval_interval: int = field(default=50, metadata=about("Steps between validation losses."))
    eval_batches: int = field(default=8, metadata=about("Batches in each validation loss."))
    checkpoint_interval: int = field(default=100, metadata=about("Steps between checkpoints."))
    log_interval: int = field(default=1, metadata=about("Steps between metrics.jsonl records."))
    device: str = field(default="auto", metadata=about("auto, cpu, cuda or cuda:N."))
    dtype: Literal["auto", "float32", "bfloat16"] = field(
        default="auto", metadata=about("Autocast dtype: auto (bfloat16 on CUDA), float32, bfloat16.")
    )
    compile: Literal["auto", "on", "off"] = field(
        default="auto", metadata=about("torch.compile: auto (on CUDA), on, off.")
    )
    peak_flops: float = field(
        default=0.0, metadata=about("Peak FLOP/s for the MFU estimate (0: a known GPU's peak).")
    )
    threads: int = field(default=0, metadata=about("torch CPU threads (0: torch's default)."))
    data_dir: str | None = field(
        default=None, metadata=about("Local corpora (else env RESSTREAM_DATA, then Hugging Face).")
    )
    cache_dir: str | None = field(
        default=None, metadata=about("Token caches (else env RESSTREAM_CACHE, then ~/.cache/resstream).")
    )


@dataclass(frozen=True)
class TrainConfig:
    """A whole training run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain-data form (what run.json and checkpoints store)."""
        return dataclasses.asdict(self)


SECTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainConfig))
#: Sections whose change makes a checkpoint incompatible.
IDENTITY_SECTIONS: tuple[str, ...] = ("model", "data", "tokenizer")

#: GPT-2 small (124M parameters, tied embeddings) with the GPT-2 tokenizer and the AdamW
#: settings of its reproductions: the sections the `paper` and `gpt2-124m` presets share.
_GPT2_SMALL: dict[str, dict[str, Any]] = {
    "model": {"n_layer": 12, "n_head": 12, "d_model": 768, "block_size": 1024, "vocab_size": 50304},
    "tokenizer": {"tokenizer": "gpt2"},
    "optim": {"lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 700, "weight_decay": 0.1},
}
#: Their run: 19,073 steps of 512 sequences (10B tokens of 1024), checkpoints every 1000 steps.
_GPT2_SMALL_RUN: dict[str, Any] = {
    "max_steps": 19073,
    "batch_size": 512,
    "checkpoint_interval": 1000,
    "eval_batches": 20,
}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # The shipped built-in model: trains on the built-in corpus in < 15 min on 2 CPU cores.
    "reference": {
        "model": {"n_layer": 6, "n_head": 4, "d_model": 128, "block_size": 128},
        "tokenizer": {"tokenizer": "bpe", "bpe_vocab_size": 4096},
        "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 100},
        "run": {
            "max_steps": 1500,
            "batch_size": 16,
            "eval_interval": 250,
            "checkpoint_interval": 250,
            "log_interval": 10,
        },
    },
    # A seconds-long run for smoke tests and demos.
    "tiny": {
        "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "block_size": 32},
        "tokenizer": {"tokenizer": "bpe", "bpe_vocab_size": 512},
        "optim": {"warmup_steps": 2},
        "run": {
            "max_steps": 20,
            "batch_size": 8,
            "eval_interval": 10,
            "eval_batches": 2,
            "checkpoint_interval": 10,
        },
    },
    # Laptop-scale sweeps: small enough to train L + 2 models in minutes.
    "laptop": {
        "model": {"n_layer": 4, "n_head": 4, "d_model": 64, "block_size": 64},
        "tokenizer": {"tokenizer": "bpe", "bpe_vocab_size": 2048},
        "optim": {"lr": 3e-3, "warmup_steps": 20},
        "run": {
            "max_steps": 300,
            "batch_size": 16,
            "eval_interval": 100,
            "eval_batches": 16,
            "checkpoint_interval": 300,
        },
    },
    # The residual-attenuation paper's protocol: GPT-2-style, 12 layers, 124M parameters (tied
    # embeddings), 10B tokens of FineWeb-Edu sample-10BT (19,073 steps of 512 x 1024 tokens),
    # bf16 autocast, torch.compile and fused AdamW on CUDA (the `auto` settings); made for
    # torchrun on 8 GPUs (micro-batch 512 / (4 x 8) = 16 sequences per GPU). `resstream
    # reproduce --scale paper` points `dataset` at its sharded token store.
    "paper": {
        **_GPT2_SMALL,
        "data": {"dataset": "fineweb-edu-10bt", "val_fraction": 0.0005},
        "run": {**_GPT2_SMALL_RUN, "grad_accum": 4, "eval_interval": 1000, "log_interval": 10},
    },
    # GPT-2 small (124M) on one GPU with the GPT-2 tokenizer.
    "gpt2-124m": {
        **_GPT2_SMALL,
        "data": {"dataset": "fineweb-edu"},
        "run": {**_GPT2_SMALL_RUN, "grad_accum": 8, "eval_interval": 500},
    },
}


def _field_index() -> dict[str, tuple[str, dataclasses.Field[Any]]]:
    """Flat field name -> (section, field)."""
    index: dict[str, tuple[str, dataclasses.Field[Any]]] = {}
    defaults = TrainConfig()
    for section in dataclasses.fields(TrainConfig):
        for fld in dataclasses.fields(getattr(defaults, section.name)):
            index[fld.name] = (section.name, fld)
    return index


FIELDS = _field_index()


def description(name: str) -> str:
    """The one-line description of config field `name`."""
    return FIELDS[name][1].metadata["help"]


def preset_values(name: str) -> dict[str, Any]:
    """The value of field `name` in each preset that sets it."""
    values = {}
    for preset, sections in PRESETS.items():
        section = sections.get(FIELDS[name][0], {})
        if name in section:
            values[preset] = section[name]
    return values


def _field_type(section: str, name: str) -> Any:
    cls = type(getattr(TrainConfig(), section))
    return typing.get_type_hints(cls)[name]


def coerce(name: str, value: Any) -> Any:
    """Convert `value` (from YAML or a flag string) to the type of field `name`."""
    section, _ = FIELDS[name]
    hint = _field_type(section, name)
    args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        if str(value) not in args:
            raise UsageError(
                f"`{name}`: {value!r} is not allowed{closest(str(value), args)}; allowed: {', '.join(args)}"
            )
        return str(value)
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        if value is None or str(value).lower() in ("none", "null", ""):
            return None
        hint = next(a for a in args if a is not type(None))
    try:
        if hint is bool:
            return _to_bool(value)
        if hint is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if hint is float:
            result = float(value)
            if not math.isfinite(result):
                raise ValueError
            return result
        return str(value)
    except (TypeError, ValueError):
        raise UsageError(f"`{name}`: {value!r} is not a valid {hint.__name__}") from None


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def unknown_key_error(key: str, where: str) -> UsageError:
    """The error for a config key that does not exist, with the closest known one."""
    return UsageError(f"unknown config key {key!r} in {where}{closest(key, FIELDS)}")


def flatten(tree: dict[str, Any], where: str) -> dict[str, Any]:
    """Accept sectioned or flat mappings and return flat field -> value."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        key = str(key).replace("-", "_")
        if key in SECTIONS and isinstance(value, dict):
            for sub_key, sub_value in value.items():
                sub_key = str(sub_key).replace("-", "_")
                if sub_key not in FIELDS or FIELDS[sub_key][0] != key:
                    raise unknown_key_error(f"{key}.{sub_key}", where)
                flat[sub_key] = sub_value
        elif key in FIELDS:
            flat[key] = value
        else:
            raise unknown_key_error(key, where)
    return flat


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a flat mapping (keys checked, values not yet coerced)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"config file {str(path)!r} does not exist")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UsageError(f"config file {str(path)!r} is not valid YAML: {short_reason(exc)}") from None
    if not isinstance(tree, dict):
        raise UsageError(f"config file {str(path)!r} must hold a mapping, not {type(tree).__name__}")
    return flatten(tree, "YAML")


def build_config(*layers: dict[str, Any], preset: str | None = None) -> TrainConfig:
    """Build a validated config from an optional preset and flat override mappings."""
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise UsageError(
                f"unknown preset {preset!r}{closest(preset, PRESETS)}; allowed: {', '.join(PRESETS)}"
            )
        values.update(flatten(PRESETS[preset], "preset"))
    for layer in layers:
        values.update(layer)
    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for name, value in values.items():
        sections[FIELDS[name][0]][name] = coerce(name, value)
    defaults = TrainConfig()
    config = TrainConfig(
        **{name: dataclasses.replace(getattr(defaults, name), **sections[name]) for name in SECTIONS}
    )
    validate(config)
    return config


def from_dict(tree: dict[str, Any], source: str | None = None) -> TrainConfig:
    """Rebuild a config saved with `TrainConfig.to_dict` (checkpoints, run.json).

    `source` names the file it was read from: a bad value is then reported as that file's,
    by its key rather than as a parameter (no flag of the running command set it).
    """
    try:
        return build_config(flatten(tree, "saved config"))
    except UsageError as exc:
        if source is None:
            raise
        plain = _MARKED.sub(r"\1", str(exc))
        raise UsageError(f"{source} holds a bad config: {plain}") from None


#: A parameter name marked in a message (see `resstream.errors`).
_MARKED = re.compile(r"`([a-z_][a-z0-9_]*)`")


@dataclass(frozen=True)
class Bounds:
    """The values a numeric field allows: from `low` to `high`, either end open or closed,
    and what a special value means (`note`, shown in the refusal)."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def allows(self, value: float) -> bool:
        """Whether `value` lies inside."""
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        low, high = _bound_text(self.low), _bound_text(self.high)
        text = f"{'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        return f"{text} ({self.note})" if self.note else text


def _bound_text(value: float) -> str:
    """A bound as people read it: a large power of two as 2**k, floats short."""
    if isinstance(value, int) and value >= 2**20 and value & (value - 1) == 0:
        return f"2**{value.bit_length() - 1}"
    return f"{value:g}" if isinstance(value, float) else str(value)


#: Sizes and counts have no upper bound here: what limits them is the machine's memory and
#: time, judged by `resstream.training.budget` before a run starts.
_COUNT = math.inf
#: Token ids are stored as uint32 (`resstream.data.tokens`).
_MAX_VOCAB = 2**32
#: AdamW moves every weight by about `lr` per step, so far smaller rates already diverge (and
#: the run says so); above ~3e38 `lr` is not even a float32 and torch fails outright. The
#: bound leaves room to provoke a divergence on purpose.
MAX_LR = 1e6
#: Seeds are customary 32-bit numbers; the batch generator is seeded with
#: seed * 1_000_003 + step, which must stay below 2**64 (`resstream.training.data`).
MAX_SEED = 2**32

#: The range of every int and float field (`cut_layer` depends on `n_layer`: see `validate`).
RANGES: dict[str, Bounds] = {
    "n_layer": Bounds(1, _COUNT, high_open=True),
    "n_head": Bounds(1, _COUNT, high_open=True),
    "d_model": Bounds(1, _COUNT, high_open=True),
    "d_mlp": Bounds(0, _COUNT, high_open=True, note="0: 4 x `d_model`"),
    "block_size": Bounds(1, _COUNT, high_open=True),
    "vocab_size": Bounds(0, _MAX_VOCAB, note="0: the tokenizer's size"),
    "dropout": Bounds(0.0, 1.0, high_open=True),
    "alpha": Bounds(0.0, 1.0, low_open=True),
    "gate_strength": Bounds(0.0, 1.0, low_open=True, high_open=True),
    "val_fraction": Bounds(0.0, 0.5, low_open=True),
    "bpe_vocab_size": Bounds(258, _MAX_VOCAB, note="256 bytes + the eos token + 1 merge at least"),
    "lr": Bounds(0.0, MAX_LR, low_open=True),
    "min_lr": Bounds(0.0, MAX_LR),
    "gate_lr": Bounds(0.0, MAX_LR),
    "weight_decay": Bounds(0.0, math.inf, high_open=True),
    "beta1": Bounds(0.0, 1.0, high_open=True),
    "beta2": Bounds(0.0, 1.0, high_open=True),
    "warmup_steps": Bounds(0, _COUNT, high_open=True),
    "grad_clip": Bounds(0.0, math.inf, high_open=True, note="0 disables clipping"),
    "max_steps": Bounds(1, _COUNT, high_open=True),
    "batch_size": Bounds(1, _COUNT, high_open=True),
    "grad_accum": Bounds(1, _COUNT, high_open=True),
    "seed": Bounds(0, MAX_SEED, high_open=True),
    "eval_interval": Bounds(1, _COUNT, high_open=True),
    "eval_batches": Bounds(1, _COUNT, high_open=True),
    "checkpoint_interval": Bounds(1, _COUNT, high_open=True),
    "log_interval": Bounds(1, _COUNT, high_open=True),
    "peak_flops": Bounds(0.0, math.inf, high_open=True, note="0: a known GPU's peak"),
    "threads": Bounds(0, _COUNT, high_open=True, note="0: torch's default"),
}


def check_ranges(config: TrainConfig) -> None:
    """Refuse the first numeric field outside its `RANGES` entry, naming the range."""
    for name, bounds in RANGES.items():
        value = getattr(getattr(config, FIELDS[name][0]), name)
        if not bounds.allows(value):
            raise UsageError(f"`{name}` {value} is outside {bounds}")


def validate(config: TrainConfig) -> None:
    """Refuse values that no model or run can use, with a one-line message: every number
    outside its range (`RANGES`), then the rules that tie fields together."""
    check_ranges(config)
    m, o, r = config.model, config.optim, config.run
    if m.d_model % m.n_head:
        raise UsageError(f"`d_model` {m.d_model} must be divisible by `n_head` {m.n_head}")
    if m.pos_emb == "rotary" and (m.d_model // m.n_head) % 2:
        raise UsageError(f"rotary embeddings need an even head size, got {m.d_model // m.n_head}")
    if m.gate == "fixed" and not 0 <= m.resolved_cut_layer < m.n_layer:
        raise UsageError(f"`cut_layer` {m.cut_layer} is outside [0, {m.n_layer}) for {m.n_layer} layers")
    if r.batch_size % r.grad_accum:
        raise UsageError(f"`batch_size` {r.batch_size} must be divisible by `grad_accum` {r.grad_accum}")
    if o.min_lr > o.lr:
        raise UsageError(f"`min_lr` {o.min_lr} must be <= `lr` {o.lr}")


def identity_diff(old: TrainConfig, new: TrainConfig) -> list[str]:
    """Fields of the checkpoint-defining sections that differ, as 'section.field: old -> new'."""
    diffs = []
    for section in IDENTITY_SECTIONS:
        a, b = getattr(old, section), getattr(new, section)
        for fld in dataclasses.fields(a):
            if getattr(a, fld.name) != getattr(b, fld.name):
                diffs.append(f"{section}.{fld.name}: {getattr(a, fld.name)!r} -> {getattr(b, fld.name)!r}")
    return diffs
