"""Typed config: presets, YAML, flags, coercion and the refusal of bad values."""

from __future__ import annotations

import re

import pytest
import torch

from resstream import resources
from resstream.errors import UsageError
from resstream.training.budget import check_training_budget, flops_per_token, parameter_count
from resstream.training.config import (
    FIELDS,
    PRESETS,
    RANGES,
    TrainConfig,
    build_config,
    from_dict,
    identity_diff,
    load_yaml,
)


def test_defaults_build_and_round_trip():
    config = build_config()
    assert config == TrainConfig()
    assert from_dict(config.to_dict()) == config


@pytest.mark.parametrize("preset", [None, *sorted(PRESETS)])
def test_every_preset_warms_up_for_a_small_part_of_its_steps(preset):
    """Warmup that lasts the whole run (tiny had 20 of 20 steps) never reaches the peak rate."""
    config = build_config(preset=preset)
    assert 1 <= config.optim.warmup_steps <= config.run.max_steps // 5, (preset, config.optim.warmup_steps)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_is_valid(preset):
    config = build_config(preset=preset)
    assert from_dict(config.to_dict()) == config


def test_later_layers_win_and_values_are_coerced():
    config = build_config({"n_layer": "6", "lr": "1e-3"}, {"n_layer": 8, "bias": "false"}, preset="tiny")
    assert config.model.n_layer == 8
    assert config.optim.lr == 1e-3
    assert config.model.bias is False
    assert config.model.d_model == PRESETS["tiny"]["model"]["d_model"]


def test_yaml_accepts_sections_and_flat_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  n_layer: 5\n  gate: learned\nlr: 0.002\nrun:\n  max_steps: 7\n")
    config = build_config(load_yaml(path))
    assert (config.model.n_layer, config.model.gate, config.optim.lr, config.run.max_steps) == (
        5,
        "learned",
        0.002,
        7,
    )


def test_unknown_yaml_key_suggests_the_closest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  n_layr: 5\n")
    with pytest.raises(UsageError, match=r"unknown config key 'model.n_layr'"):
        load_yaml(path)
    path.write_text("n_layr: 5\n")
    with pytest.raises(UsageError, match=r"'n_layr'.*did you mean 'n_layer'"):
        load_yaml(path)


def test_unknown_saved_key_is_named_as_saved():
    """A saved config's keys are field names, not flags (flags are checked by the CLI)."""
    expected = r"^unknown config key 'model.n_layr' in saved config \(did you mean 'n_layer'\?\)$"
    with pytest.raises(UsageError, match=expected):
        from_dict({"model": {"n_layr": 5}})


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_yaml(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(UsageError, match="must hold a mapping"):
        load_yaml(listing)


@pytest.mark.parametrize("alpha", [0.0, -0.5, 1.01])
def test_alpha_outside_unit_interval_is_refused(alpha):
    with pytest.raises(UsageError, match=r"`alpha` .* outside \(0, 1\]"):
        build_config({"gate": "fixed", "alpha": alpha})


@pytest.mark.parametrize("cut", [4, 10, -2])
def test_cut_layer_outside_range_is_refused(cut):
    with pytest.raises(UsageError, match=r"`cut_layer` .* outside \[0, 4\)"):
        build_config({"gate": "fixed", "cut_layer": cut, "n_layer": 4})


def test_cut_layer_minus_one_means_middle_layer():
    assert build_config({"n_layer": 6}).model.resolved_cut_layer == 3


@pytest.mark.parametrize(
    ("values", "pattern"),
    [
        ({"gate": "fancy"}, r"`gate`: 'fancy' is not allowed.*allowed: none, fixed, learned, router"),
        ({"n_layer": "two"}, r"`n_layer`: 'two' is not a valid int"),
        ({"n_layer": 2.5}, r"`n_layer`: 2.5 is not a valid int"),
        ({"lr": "nan"}, r"`lr`: 'nan' is not a valid float"),
        ({"bias": "maybe"}, r"`bias`: 'maybe' is not a valid bool"),
        ({"d_model": 30, "n_head": 4}, r"`d_model` 30 must be divisible by `n_head` 4"),
        ({"batch_size": 6, "grad_accum": 4}, r"`batch_size` 6 must be divisible by `grad_accum` 4"),
        ({"gate_strength": 1.0}, r"`gate_strength` 1.0 is outside \(0, 1\)"),
        ({"val_fraction": 0.9}, r"`val_fraction` 0.9 is outside"),
        ({"max_steps": 0}, r"^`max_steps` 0 is outside \[1, inf\)$"),
    ],
)
def test_bad_values_are_refused_with_their_flag(values, pattern):
    with pytest.raises(UsageError, match=pattern):
        build_config(values)


def test_unknown_preset_suggests():
    with pytest.raises(UsageError, match=r"unknown preset 'refrence'.*did you mean 'reference'"):
        build_config(preset="refrence")


def test_identity_diff_lists_model_data_tokenizer_changes_only():
    old = build_config()
    new = build_config({"n_layer": 6, "dataset": "x.txt", "lr": 1.0e-3, "max_steps": 9})
    diffs = identity_diff(old, new)
    assert diffs == ["model.n_layer: 4 -> 6", "data.dataset: 'shakespeare' -> 'x.txt'"]


# ----------------------------------------------------------------------- ranges of numbers
#: Fields whose values are not numbers, or whose range depends on other fields.
NOT_RANGED = {"cut_layer"}


def test_every_numeric_field_has_a_range():
    """One declarative table holds the range of every int and float field."""
    numeric = {
        name
        for name, (section, _) in FIELDS.items()
        if type(getattr(getattr(TrainConfig(), section), name)) in (int, float)
    }
    assert numeric - NOT_RANGED == set(RANGES)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"beta1": 2}, r"^`beta1` 2.0 is outside \[0, 1\)$"),
        ({"beta1": -1}, r"^`beta1` -1.0 is outside \[0, 1\)$"),
        ({"beta2": 1.0}, r"^`beta2` 1.0 is outside \[0, 1\)$"),
        ({"seed": 2**64}, r"^`seed` 18446744073709551616 is outside \[0, 2\*\*32\)$"),
        ({"seed": -1}, r"^`seed` -1 is outside \[0, 2\*\*32\)$"),
        ({"lr": 1e38}, r"^`lr` 1e\+38 is outside \(0, 1e\+06\]"),
        ({"lr": 0}, r"^`lr` 0.0 is outside \(0, 1e\+06\]"),
        ({"gate_lr": 1e7}, r"^`gate_lr` 10000000.0 is outside \[0, 1e\+06\]$"),
        ({"min_lr": -1e-3}, r"^`min_lr` -0.001 is outside \[0, 1e\+06\]"),
        ({"weight_decay": -0.1}, r"^`weight_decay` -0.1 is outside \[0, inf\)$"),
        ({"grad_clip": -1}, r"^`grad_clip` -1.0 is outside \[0, inf\) \(0 disables clipping\)$"),
        ({"peak_flops": -1}, r"^`peak_flops` -1.0 is outside \[0, inf\) \(0: a known GPU's peak\)$"),
        ({"warmup_steps": -1}, r"^`warmup_steps` -1 is outside \[0, inf\)$"),
        ({"n_layer": 0}, r"^`n_layer` 0 is outside \[1, inf\)$"),
        ({"d_model": -8}, r"^`d_model` -8 is outside \[1, inf\)$"),
        ({"vocab_size": -5}, r"^`vocab_size` -5 is outside \[0, 2\*\*32\] \(0: the tokenizer's size\)$"),
        ({"vocab_size": 2**32 + 1}, r"^`vocab_size` 4294967297 is outside \[0, 2\*\*32\]"),
        ({"bpe_vocab_size": 100}, r"^`bpe_vocab_size` 100 is outside \[258, 2\*\*32\]"),
        ({"d_mlp": -1}, r"^`d_mlp` -1 is outside \[0, inf\) \(0: 4 x `d_model`\)$"),
        ({"threads": -1}, r"^`threads` -1 is outside \[0, inf\) \(0: torch's default\)$"),
        ({"eval_batches": 0}, r"^`eval_batches` 0 is outside \[1, inf\)$"),
        ({"dropout": 1.0}, r"^`dropout` 1.0 is outside \[0, 1\)$"),
        ({"val_fraction": 0}, r"^`val_fraction` 0.0 is outside \(0, 0.5\]$"),
    ],
)
def test_numbers_outside_their_range_are_refused_with_the_range(values, message):
    with pytest.raises(UsageError, match=message):
        build_config(values)


def test_a_saved_config_with_a_number_out_of_range_is_refused():
    with pytest.raises(UsageError, match=r"^`vocab_size` -5 is outside"):
        from_dict({"model": {"vocab_size": -5}})


def test_min_lr_above_lr_is_refused():
    with pytest.raises(UsageError, match=r"^`min_lr` 0.1 must be <= `lr` 0.01$"):
        build_config({"lr": 0.01, "min_lr": 0.1})


@pytest.mark.parametrize(
    "values", [{"lr": 1e6, "min_lr": 0}, {"beta1": 0.0, "beta2": 0.999}, {"seed": 2**32 - 1}]
)
def test_numbers_at_the_edges_of_their_ranges_pass(values):
    build_config(values)


# ------------------------------------------------------------------- what a config costs
@pytest.fixture
def machine_of_12gb(monkeypatch):
    """The host has 12.3 GB available, whatever this machine has."""
    monkeypatch.setattr(resources, "host_available_bytes", lambda: 12_300_000_000)


TINY = {"n_layer": 2, "n_head": 2, "d_model": 16, "block_size": 16, "bpe_vocab_size": 300, "batch_size": 4}


@pytest.mark.parametrize(
    "shape",
    [
        {},
        {"bias": False, "d_mlp": 24, "gate": "learned"},
        {"norm": "rmsnorm", "pos_emb": "rotary", "gate": "router"},
        {"norm": "none", "pos_emb": "none", "gate": "fixed", "norm_position": "post"},
        {"norm_position": "post", "n_layer": 3, "d_model": 24, "n_head": 3, "block_size": 7},
    ],
)
def test_parameter_count_is_exact_without_building_the_model(shape):
    from resstream.training.model import GPT

    model = build_config({**TINY, **shape, "vocab_size": 301}).model
    built = GPT(model)
    assert parameter_count(model) == built.num_params()
    attention = 12 * model.n_layer * model.d_model * model.block_size
    assert flops_per_token(model) == 6 * built.num_params(include_embeddings=False) + attention


def test_presets_fit_a_big_gpu(monkeypatch):
    """A real config (GPT-2 small on one 80 GB GPU) passes: the estimate only refuses the absurd."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (79_000_000_000, 80_000_000_000))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for preset in PRESETS:
        world = 8 if preset == "paper" else 1  # paper: made for torchrun on 8 GPUs
        check_training_budget(build_config(preset=preset), torch.device("cuda", 0), world=world)


def test_presets_fit_this_machine_on_the_cpu():
    for preset in ("tiny", "laptop", "reference"):
        check_training_budget(build_config(preset=preset), torch.device("cpu"))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"n_layer": 1_000_000_000},
            r"^`n_layer` 1000000000 and `d_model` 16 needs ~150.0 TB to train \(.*\); "
            r"12.3 GB available on this machine$",
        ),
        ({"d_model": 1_000_000_000, "n_head": 1}, r"^`d_model` 1000000000 and `n_layer` 2 needs ~\d"),
        ({"block_size": 10**12}, r"^`block_size` 1000000000000 and `bpe_vocab_size` 300 needs ~22.8 PB"),
        ({"vocab_size": 2**32}, r"^`vocab_size` 4294967296 and `block_size` 16 needs ~4.4 TB"),
        ({"d_mlp": 10**12}, r"^`d_mlp` 1000000000000 and `d_model` 16 needs"),
        ({"batch_size": 10**9}, r"^`batch_size` 1000000000 and `bpe_vocab_size` 300 needs ~90.4 TB"),
        (
            {"n_layer": 400_000, "d_model": 2, "n_head": 1},
            r"^`n_layer` 400000 needs ~16.6 GB",
        ),
        (
            {"bpe_vocab_size": 1_000_000_000},
            r"^`bpe_vocab_size` 1000000000 needs ~60.0 GB for the BPE trainer's tables; 12.3 GB available",
        ),
        ({"bpe_vocab_size": 100_000_000}, r"^`bpe_vocab_size` 100000000 and `block_size` 16 needs ~102.4 GB"),
    ],
)
def test_sizes_that_cannot_fit_are_refused_with_their_memory(machine_of_12gb, values, message):
    with pytest.raises(UsageError, match=message):
        check_training_budget(build_config({**TINY, **values}), torch.device("cpu"))


def test_a_run_that_would_take_years_says_how_long_and_what_would_pass():
    config = build_config({**TINY, "max_steps": 10**20})
    with pytest.raises(UsageError) as caught:
        check_training_budget(config, torch.device("cpu"))
    message = str(caught.value)
    assert message.startswith("`max_steps` 100000000000000000000 would take at least ~3.2e+08 years (")
    allowed = int(re.search(r"allowed: `max_steps` <= (\d+), runs estimated under 1.0 years$", message)[1])
    check_training_budget(build_config({**TINY, "max_steps": allowed}), torch.device("cpu"))


def test_evaluations_count_in_the_time():
    config = build_config({**TINY, "eval_batches": 10**15, "eval_interval": 1, "max_steps": 10})
    with pytest.raises(UsageError, match=r"^`eval_batches` 1000000000000000 would take at least ~"):
        check_training_budget(config, torch.device("cpu"))


def test_threads_far_above_the_cpus_are_refused(monkeypatch):
    monkeypatch.setattr(resources, "usable_cpus", lambda: 2)
    check_training_budget(build_config({**TINY, "threads": 8}), torch.device("cpu"))
    with pytest.raises(UsageError, match=r"^`threads` 1000000 is more than 4 per CPU"):
        check_training_budget(build_config({**TINY, "threads": 1_000_000}), torch.device("cpu"))


def test_a_pretrained_tokenizer_is_judged_by_vocab_size_alone(machine_of_12gb):
    """`bpe_vocab_size` means nothing without the BPE tokenizer."""
    config = build_config({**TINY, "tokenizer": "gpt2", "bpe_vocab_size": 10**9})
    check_training_budget(config, torch.device("cpu"))


def _must_not_run(*args, **kwargs):
    raise AssertionError("heavy work started although the run cannot fit")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"n_layer": 10**9}, "`n_layer` 1000000000 and `d_model` 16 needs ~"),
        ({"bpe_vocab_size": 10**9}, "`bpe_vocab_size` 1000000000 needs ~60.0 GB"),
        ({"threads": 10**6}, "`threads` 1000000 is more than 4 per CPU"),
        ({"max_steps": 10**20}, "`max_steps` 100000000000000000000 would take at least ~"),
    ],
)
def test_the_trainer_refuses_before_reading_the_corpus_or_training_a_tokenizer(
    tmp_path, monkeypatch, machine_of_12gb, values, message
):
    from resstream.training import loop, preparation

    monkeypatch.setattr(preparation, "stream_corpus", _must_not_run)
    monkeypatch.setattr(preparation, "cached_bpe", _must_not_run)
    monkeypatch.setattr(torch, "set_num_threads", _must_not_run)
    config = build_config({**TINY, **values, "dataset": str(tmp_path / "corpus.txt")})
    with pytest.raises(UsageError) as caught:
        loop.Trainer(config, tmp_path / "out")
    assert str(caught.value).startswith(message)
    assert not (tmp_path / "out").exists()


def test_the_vocabulary_of_a_pretrained_tokenizer_is_judged_once_it_is_known(
    tmp_path, monkeypatch, machine_of_12gb, shared_data
):
    """With `vocab_size` 0 the size comes from the tokenizer: 32768 tokens × 50257 × 3 values of
    float32 (the logits and their log-softmax) are ~20 GB, more than the 12.3 GB there are."""
    from resstream.training import loop, preparation

    monkeypatch.setattr(preparation, "build_token_cache", _must_not_run)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 50, encoding="utf-8")
    values = {**TINY, "tokenizer": "gpt2", "batch_size": 2048, "dataset": str(corpus)}
    config = build_config({**values, "data_dir": str(shared_data), "cache_dir": str(tmp_path / "cache")})
    with pytest.raises(UsageError, match=r"^`vocab_size` 50257 and `batch_size` 2048 needs ~19.\d GB"):
        loop.Trainer(config, tmp_path / "out")


def test_every_field_has_a_one_line_description():
    from resstream.training.config import description

    for name in FIELDS:
        text = description(name)
        assert text and "\n" not in text and len(text) <= 80, (name, text)


def test_preset_values_lists_each_preset_that_sets_a_field():
    from resstream.training.config import preset_values

    expected = {"reference": 100, "tiny": 2, "laptop": 20, "paper": 700, "gpt2-124m": 700}
    assert preset_values("warmup_steps") == expected
    assert preset_values("gate_lr") == {}
