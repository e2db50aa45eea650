"""Every bad input of the adversarial trial (issue 9), each with the one line it must get.

A case is a command line (with `{tmp}`, `{out}` and `{corpus}` placeholders), an optional
setup that writes the files it needs into the test's temporary directory, the exit code and
the patterns the one error line must hold. The contract checked for each (tests/cli_support):
exit code, exactly one line on stderr starting "resstream: error:", no traceback, nothing
written into `{out}`. `docs/reliability.md` counts these cases.

The table is split into sections by theme so that each can grow on its own.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from resstream.cli.main import main
from tests.cli_support import assert_nothing_written
from tests.test_cli_train import TINY
from tests.test_train import corpus_text

#: Flags of a train run small enough for a test (test_cli_train's), caching under the test's folder.
TINY_TRAIN = " ".join(TINY) + " --cache-dir {tmp}/cache"


@dataclass(frozen=True)
class Hostile:
    """One bad input and the answer it must get."""

    name: str
    command: str  # split on whitespace after the placeholders are filled in
    patterns: tuple[str, ...]  # each must occur in the error line
    exit_code: int = 2
    setup: Callable[[Path], None] | None = field(default=None, compare=False)


# ------------------------------------------------------------------ run directories and outputs
SIMULATE = "simulate --layers 2 --tokens 5 --dim 4 --sims 20 --quiet"


def a_training_run(tmp: Path) -> None:
    """A directory that holds a training run (its model.json and run.json)."""
    (tmp / "run").mkdir()
    (tmp / "run" / "model.json").write_text("{}")
    (tmp / "run" / "run.json").write_text('{"config": {"model": {}}}')


def a_file_named(name: str) -> Callable[[Path], None]:
    return lambda tmp: (tmp / name).write_text("a file, not a directory")


def a_simulation_output(tmp: Path) -> None:
    """A directory that holds the output set of `resstream simulate`."""
    (tmp / "sim").mkdir()
    (tmp / "sim" / "simulate.json").write_text("{}")
    (tmp / "sim" / "run.json").write_text('{"config": {"command": "simulate"}, "files": ["simulate.json"]}')


OUTPUT_CASES: list[Hostile] = [
    Hostile(
        "train-into-an-analysis-output",
        "train {train} --dataset {corpus} --out {tmp}/sim",
        ("--out", "holds the outputs of resstream simulate", "choose another directory"),
        2,
        a_simulation_output,
    ),
    Hostile(
        "out-is-a-file",
        f"{SIMULATE} --out {{tmp}}/taken",
        ("--out", "taken", "is a file"),
        2,
        a_file_named("taken"),
    ),
    Hostile(
        "out-below-a-file",
        f"{SIMULATE} --out {{tmp}}/taken/out",
        ("cannot write to --out", "a parent is a file, not a directory"),
        2,
        a_file_named("taken"),
    ),
    Hostile(
        "analysis-into-a-training-run",
        f"{SIMULATE} --out {{tmp}}/run",
        ("--out", "holds the outputs of resstream train", "choose another directory"),
        2,
        a_training_run,
    ),
    Hostile(
        "eval-into-its-own-run",
        "eval --model {tmp}/run --out {tmp}/run --quiet",
        ("--out", "holds the outputs of resstream train"),
        2,
        a_training_run,
    ),
]


# ------------------------------------------------------------------ checkpoints and weights
def _rewrite_tensor(path: Path, key: str, change: Callable) -> None:
    """Rewrite one tensor of a safetensors file in place, as a tampering user (or a bug) would."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    tensors[key] = change(tensors[key].clone())
    save_file(tensors, str(path))


def _nan_first(tensor):
    tensor.view(-1)[0] = float("nan")
    return tensor


def _finished_run(tmp: Path, key: str = "wte.weight", change: Callable | None = None) -> None:
    """`{tmp}/run`: a finished resstream run (tiny), one of its weights changed by `change`."""
    from tests.test_evaluate import make_run

    run = make_run(tmp / "run")
    if change is not None:
        _rewrite_tensor(run / "model.safetensors", key, change)


def _checkpoint(tmp: Path, *, file: str | None = None, key: str = "", diverged: bool = False) -> None:
    """`{tmp}/run`: a run with one checkpoint (step 1); `file`'s tensor `key` holds a NaN, or the
    step after the checkpoint diverged."""
    import torch

    from resstream.training import checkpoint as ckpt
    from resstream.training.config import TrainConfig

    path = ckpt.save_checkpoint(
        tmp / "run",
        step=1,
        model_state={"wte.weight": torch.ones(4, 2)},
        optimizer_state={
            "state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.ones(4, 2)}},
            "param_groups": [{"lr": 0.1, "params": [0], "name": "decay"}],
        },
        rng_state={"cpu": torch.get_rng_state()},
        state={"config": TrainConfig().to_dict()},
    )
    if file is not None:
        _rewrite_tensor(path / file, key, _nan_first)
    if diverged:
        ckpt.mark_diverged(tmp / "run", 1, "non-finite gradient norm (nan) at step 2")


def _hf_model_with_nan_weights(tmp: Path) -> None:
    """`{tmp}/hf`: a tiny Hugging Face GPT-2 with its tokenizer; one weight holds NaN."""
    import torch

    from resstream.data import train_bpe
    from tests.test_models_loading import SENTENCES, _tiny_gpt2

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    model = _tiny_gpt2(len(tokenizer))
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight[0, :3] = float("inf")
    model.save_pretrained(tmp / "hf")
    tokenizer.save_pretrained(tmp / "hf")


NOT_FINITE = ("weights of model", "are not finite", "'wte.weight' holds 1 non-finite value of")
CHECKPOINT_CASES: list[Hostile] = [
    Hostile(
        "eval-nan-weights",
        "eval --model {tmp}/run --benchmarks shakespeare --out {out}",
        NOT_FINITE,
        setup=lambda tmp: _finished_run(tmp, change=_nan_first),
    ),
    Hostile(
        "shift-nan-weights",
        "shift --model {tmp}/run --dataset {corpus} --num-seqs 2 --seq-len 8 --quiet --out {out}",
        NOT_FINITE,
        setup=lambda tmp: _finished_run(tmp, change=_nan_first),
    ),
    Hostile(
        "shift-hf-inf-weights",
        "shift --model {tmp}/hf --dataset {corpus} --num-seqs 2 --seq-len 8 --quiet --out {out}",
        ("are not finite", "'transformer.h.1.mlp.c_fc.weight' holds 3 non-finite values of"),
        setup=_hf_model_with_nan_weights,
    ),
    Hostile(
        "eval-int64-weights",
        "eval --model {tmp}/run --benchmarks shakespeare --out {out}",
        ("tensor 'wte.weight' has dtype int64", "floating-point"),
        setup=lambda tmp: _finished_run(tmp, change=lambda t: t.round().long()),
    ),
    Hostile(
        "resume-nan-optimizer-state",
        "train --resume --out {tmp}/run",
        (
            "cannot resume from",
            "non-finite values in its optimizer state",
            "'state.0.exp_avg' holds 1 non-finite",
        ),
        setup=lambda tmp: _checkpoint(tmp, file="trainer.safetensors", key="state.0.exp_avg"),
    ),
    Hostile(
        "resume-nan-weights",
        "train --resume --out {tmp}/run",
        ("cannot resume from", "non-finite values in its weights", "'wte.weight' holds 1 non-finite"),
        setup=lambda tmp: _checkpoint(tmp, file="model.safetensors", key="wte.weight"),
    ),
    Hostile(
        "resume-diverged-without-good-checkpoint",
        "train --resume --out {tmp}/run",
        ("cannot resume: checkpoint step 1", "diverged", "no good checkpoint", "--out"),
        setup=lambda tmp: _checkpoint(tmp, diverged=True),
    ),
]


# ------------------------------------------------------------------ sizes, memory and numbers
def run_with_model_json(**changes) -> Callable[[Path], None]:
    """Setup: `{tmp}/run`, the built-in reference model's directory without its weights (the
    refusal must come before they are read), with `changes` in model.json's model config."""

    def setup(tmp: Path) -> None:
        from resstream.assets import reference_model_dir

        run = tmp / "run"
        shutil.copytree(reference_model_dir(), run, ignore=shutil.ignore_patterns("*.safetensors"))
        meta = json.loads((run / "model.json").read_text(encoding="utf-8"))
        meta["config"]["model"].update(changes)
        (run / "model.json").write_text(json.dumps(meta), encoding="utf-8")

    return setup


def hf_model_with_config(**changes) -> Callable[[Path], None]:
    """Setup: `{tmp}/hf`, a tiny GPT-2 Hugging Face directory (config.json and a tokenizer, no
    weights: the refusal must come before they are read) with `changes` in config.json."""

    def setup(tmp: Path) -> None:
        from transformers import GPT2Config

        hf = tmp / "hf"
        hf.mkdir()
        config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=300, n_positions=32).to_dict()
        config.update(architectures=["GPT2LMHeadModel"], **changes)
        (hf / "config.json").write_text(json.dumps(config), encoding="utf-8")
        (hf / "tokenizer.json").write_text("{}", encoding="utf-8")

    return setup


SHIFT = "shift --dataset {corpus} --num-seqs 2 --seq-len 8 --quiet --out {out} --model"
_TRAIN = "train --dataset {corpus} {train} --out {out}"
_SWEEP = "sweep --dataset {corpus} {train} --max-steps 3 --out {out}"
_SIMULATE = "simulate --quiet --out {out}"
BUDGET_CASES: list[Hostile] = [
    # sizes of a model to train: refused before the corpus is read or a tokenizer trained
    Hostile(
        "train-n-layer-1e9",
        f"{_TRAIN} --n-layer 1000000000",
        ("--n-layer 1000000000", "needs ~", "available"),
    ),
    Hostile("train-d-model-1e9", f"{_TRAIN} --d-model 1000000000", ("--d-model 1000000000", "needs ~")),
    Hostile(
        "train-block-size-1e12",
        f"{_TRAIN} --block-size 1000000000000",
        ("--block-size 1000000000000", "needs ~"),
    ),
    Hostile(
        "train-vocab-size-1e12",
        f"{_TRAIN} --vocab-size 1000000000000",
        ("--vocab-size 1000000000000 is outside [0, 2**32]",),
    ),
    Hostile(
        "train-vocab-size-negative", f"{_TRAIN} --vocab-size -5", ("--vocab-size -5 is outside [0, 2**32]",)
    ),
    Hostile("train-n-layer-zero", f"{_TRAIN} --n-layer 0", ("--n-layer 0 is outside [1, inf)",)),
    Hostile(
        "train-bpe-vocab-size-1e9",
        f"{_TRAIN} --bpe-vocab-size 1000000000",
        ("--bpe-vocab-size 1000000000", "needs ~"),
    ),
    # numbers that crashed inside torch, or ran forever
    Hostile("train-beta1-2", f"{_TRAIN} --beta1 2", ("--beta1 2.0 is outside [0, 1)",)),
    Hostile("train-beta1-negative", f"{_TRAIN} --beta1 -1", ("--beta1 -1.0 is outside [0, 1)",)),
    Hostile(
        "train-seed-2**64",
        f"{_TRAIN} --seed 18446744073709551616",
        ("--seed 18446744073709551616 is outside [0, 2**32)",),
    ),
    Hostile("train-lr-1e38", f"{_TRAIN} --lr 1e38", ("--lr 1e+38 is outside (0, 1e+06]",)),
    Hostile(
        "train-threads-1e6",
        f"{_TRAIN} --threads 1000000",
        ("--threads 1000000 is more than 4 per CPU", "allowed: 0"),
    ),
    Hostile(
        "train-max-steps-1e20",
        f"{_TRAIN} --max-steps 100000000000000000000",
        ("--max-steps 100000000000000000000 would take at least ~", "years", "allowed: --max-steps <= "),
    ),
    Hostile("train-max-steps-1e20-as-float", f"{_TRAIN} --max-steps 1e20", ("--max-steps", "'1e20'")),
    Hostile("sweep-n-layer-1e9", f"{_SWEEP} --n-layer 1000000000", ("--n-layer 1000000000", "needs ~")),
    Hostile(
        "sweep-seeds-2**64",
        f"{_SWEEP} --seeds 18446744073709551616",
        ("--seeds 18446744073709551616 is outside [0, 2**32)",),
    ),
    # simulations
    Hostile(
        "simulate-layers-1e9",
        f"{_SIMULATE} --layers 1000000000",
        ("--layers 1000000000 needs ~", "allowed: --layers <= "),
    ),
    Hostile(
        "simulate-sims-1e15",
        f"{_SIMULATE} --sims 1000000000000000",
        ("--simulations 1000000000000000", "would take at least ~", "years"),
    ),
    Hostile(
        "simulate-tokens-1e9",
        f"{_SIMULATE} --tokens 1000000000",
        ("--tokens 1000000000 needs ~", "allowed: --tokens <= "),
    ),
    # model configs of analysed models: refused before building the model or reading weights
    Hostile(
        "shift-model-json-n-layer-1e9",
        f"{SHIFT} {{tmp}}/run",
        ("model.json' with n_layer 1000000000", "needs ~"),
        setup=run_with_model_json(n_layer=1_000_000_000),
    ),
    Hostile(
        "eval-model-json-n-layer-1e9",
        "eval --quiet --out {out} --model {tmp}/run",
        ("model.json' with n_layer 1000000000", "needs ~"),
        setup=run_with_model_json(n_layer=1_000_000_000),
    ),
    Hostile(
        "shift-model-json-vocab-size-negative",
        f"{SHIFT} {{tmp}}/run",
        ("model.json' holds a bad config: vocab_size -5 is outside",),
        setup=run_with_model_json(vocab_size=-5),
    ),
    Hostile(
        "shift-config-json-n-layer-1e9",
        f"{SHIFT} {{tmp}}/hf",
        ("config.json' with n_layer 1000000000", "needs ~"),
        setup=hf_model_with_config(n_layer=1_000_000_000),
    ),
    Hostile(
        "shift-config-json-vocab-size-negative",
        f"{SHIFT} {{tmp}}/hf",
        ("config.json' has vocab_size -5; allowed: an integer >= 1",),
        setup=hf_model_with_config(vocab_size=-5),
    ),
    Hostile(
        "shift-config-json-vocab-size-1e12",
        f"{SHIFT} {{tmp}}/hf",
        ("config.json' with vocab_size 1000000000000", "needs ~"),
        setup=hf_model_with_config(vocab_size=10**12),
    ),
    Hostile(
        "shift-config-json-n-positions-1e12",
        f"{SHIFT} {{tmp}}/hf",
        ("config.json' with n_positions 1000000000000", "needs ~"),
        setup=hf_model_with_config(n_positions=10**12),
    ),
    Hostile(
        "shift-config-json-n-embd-1e9",
        f"{SHIFT} {{tmp}}/hf",
        ("config.json' with n_embd 1000000000", "needs ~"),
        setup=hf_model_with_config(n_embd=10**9),
    ),
]

# ------------------------------------------------------------------ corpora and text inputs


def _write(name: str, text: str) -> Callable[[Path], None]:
    """A setup that writes `text` into the file `name` of the test's directory."""
    return lambda tmp: (tmp / name).write_text(text, encoding="utf-8")


def _mkdir(name: str) -> Callable[[Path], None]:
    """A setup that makes the directory `name` in the test's directory."""
    return lambda tmp: (tmp / name).mkdir()


_TRAIN_SMALL = "train --dataset {corpus} --n-layer 2 --n-head 2 --d-model 16 --block-size 16 --quiet"

DATA_CASES: list[Hostile] = [
    Hostile(
        "jsonl-token-id-beyond-int64",
        "shift --dataset {tmp}/big.jsonl --out {out}",
        (
            "big.jsonl",
            "row 2",
            "token id 100000000000000000000000000000",
            "outside the model's vocabulary",
            "allowed: 0..",
        ),
        setup=_write(
            "big.jsonl", '{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 100000000000000000000000000000]}\n'
        ),
    ),
    Hostile(
        "jsonl-mixing-token-rows-and-text-rows",
        "shift --dataset {tmp}/mixed.jsonl --out {out}",
        ("mixed.jsonl", "mixes 'input_ids' rows and 'text' rows", "row 1 has 'input_ids', row 2 has 'text'"),
        setup=_write("mixed.jsonl", '{"input_ids": [1, 2, 3]}\n{"text": "hello there"}\n'),
    ),
    Hostile(
        "train-on-jsonl-mixing-text-rows-and-token-rows",
        "train --dataset {tmp}/mixed.jsonl {train} --out {out}",
        ("mixed.jsonl", "mixes 'input_ids' rows and 'text' rows", "row 1 has 'text', row 2 has 'input_ids'"),
        setup=_write("mixed.jsonl", '{"text": "hello there"}\n{"input_ids": [1, 2, 3]}\n'),
    ),
    Hostile(
        "lens-text-file-is-a-directory",
        "lens --text-file {tmp}/folder --out {out}",
        ("--text-file", "folder' is a directory", "give a UTF-8 text file", "--text"),
        setup=_mkdir("folder"),
    ),
    Hostile(
        "data-dir-is-a-file",
        "shift --dataset ptb --data-dir {corpus} --out {out}",
        ("--data-dir", "corpus.txt' is a file, not a directory"),
    ),
    Hostile(
        "cache-dir-is-a-file",
        _TRAIN_SMALL + " --cache-dir {corpus} --out {out}",
        ("--cache-dir", "corpus.txt' is a file, not a directory"),
    ),
]


# ------------------------------------------------------------------ shard stores (issue 21)
def _a_store(tmp: Path, edit: Callable[[Path, dict], None]) -> None:
    """`{tmp}/store`: a complete shard store of the test corpus (3 shards) made with `{tmp}/bpe`,
    then damaged by `edit(tmp, manifest)`, which may change the manifest and the files."""
    from resstream.data import Corpus, save_tokenizer, train_bpe
    from resstream.data.shards import MANIFEST, write_shards
    from resstream.data.sources import corpus_fingerprint

    text = corpus_text()
    tokenizer = train_bpe([text], 300)
    save_tokenizer(tokenizer, tmp / "bpe")
    corpus = Corpus("words", (text,), corpus_fingerprint([text]), "test")
    write_shards(corpus, tokenizer, tmp / "store", shard_tokens=5000, workers=1)
    manifest = json.loads((tmp / "store" / MANIFEST).read_text(encoding="utf-8"))
    edit(tmp, manifest)
    (tmp / "store" / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def _shard_outside(name: Callable[[Path], str]) -> Callable[[Path], None]:
    """A store whose first shard's file is `name(tmp)`: a copy of that shard outside the store
    (the same bytes, so that only where it lies is wrong)."""

    def edit(tmp: Path, manifest: dict) -> None:
        shutil.copy(tmp / "store" / manifest["shards"][0]["file"], tmp / "SECRET.bin")
        manifest["shards"][0]["file"] = name(tmp)

    return lambda tmp: _a_store(tmp, edit)


def _shard_linked_outside(tmp: Path, manifest: dict) -> None:
    """The second shard moved out of the store, a symbolic link to it in its place."""
    shard = tmp / "store" / manifest["shards"][1]["file"]
    shard.rename(tmp / "outside.bin")
    shard.symlink_to(tmp / "outside.bin")


def _flip_first_byte(tmp: Path, manifest: dict) -> None:
    """One bit of the first shard flipped in place: the same size, the manifest untouched."""
    with open(tmp / "store" / manifest["shards"][0]["file"], "r+b") as handle:
        first = handle.read(1)[0]
        handle.seek(0)
        handle.write(bytes([first ^ 1]))


def _flip_and_update_sha256(tmp: Path, manifest: dict) -> None:
    """The first shard changed and its sha256 in the manifest updated, the fingerprint not."""
    import hashlib

    _flip_first_byte(tmp, manifest)
    data = (tmp / "store" / manifest["shards"][0]["file"]).read_bytes()
    manifest["shards"][0]["sha256"] = hashlib.sha256(data).hexdigest()[:16]


def _set(key: str, value, shard: int | None = 0) -> Callable[[Path], None]:
    """A store whose manifest has `key` set to `value` (in shard `shard`'s entry, or at the top)."""

    def edit(tmp: Path, manifest: dict) -> None:
        (manifest if shard is None else manifest["shards"][shard])[key] = value

    return lambda tmp: _a_store(tmp, edit)


_ON_STORE = "train --dataset {tmp}/store {train} --tokenizer {tmp}/bpe --max-steps 2 --out {out}"
STORE_CASES: list[Hostile] = [
    Hostile(
        "train-store-shard-outside-the-store",
        _ON_STORE,
        ("manifest.json shard 0 has file '../SECRET.bin' (a path, not a plain name)", "inside the store"),
        setup=_shard_outside(lambda tmp: "../SECRET.bin"),
    ),
    Hostile(
        "train-store-shard-absolute-path",
        _ON_STORE,
        ("manifest.json shard 0 has file '/", "SECRET.bin' (an absolute path)", "inside the store"),
        setup=_shard_outside(lambda tmp: str(tmp / "SECRET.bin")),
    ),
    Hostile(
        "train-store-shard-links-outside",
        _ON_STORE,
        ("store': shard-00001.bin is a symbolic link", "a shard must be a file inside the store"),
        setup=lambda tmp: _a_store(tmp, _shard_linked_outside),
    ),
    Hostile(
        "train-store-shard-byte-flipped",
        _ON_STORE,
        ("store': shard-00000.bin does not match the sha256 in its manifest", "changed since it was tokeni"),
        setup=lambda tmp: _a_store(tmp, _flip_first_byte),
    ),
    Hostile(
        "train-store-shard-and-its-sha256-changed",
        _ON_STORE,
        ("store': manifest.json records fingerprint", "edited after tokenising"),
        setup=lambda tmp: _a_store(tmp, _flip_and_update_sha256),
    ),
    Hostile(
        "train-store-dtype-unknown",
        _ON_STORE,
        ("store': manifest.json has dtype 'float64'; allowed: uint16, uint32",),
        setup=_set("dtype", "float64", shard=None),
    ),
    Hostile(
        "train-store-tokens-not-a-number",
        _ON_STORE,
        ("manifest.json shard 0 (shard-00000.bin) has tokens None; allowed: a whole number >= 0",),
        setup=_set("tokens", None),
    ),
    Hostile(
        "train-store-sha256-not-a-string",
        _ON_STORE,
        ("manifest.json shard 2 (shard-00002.bin) has sha256 12345; allowed: 16 hex digits",),
        setup=_set("sha256", 12345, shard=2),
    ),
]


# ------------------------------------------------------------------ tokenizers with their own code (issue 21)
def _tokenizer_with_code(tmp: Path) -> None:
    """`{tmp}/custom`: a saved BPE whose tokenizer_config.json's auto_map names a class of its own,
    in a file beside it that writes `{tmp}/imported` if it is ever imported."""
    from resstream.data import save_tokenizer, train_bpe
    from tests.test_data_tokenizer import with_custom_tokenizer_code

    save_tokenizer(train_bpe([corpus_text()], 300), tmp / "custom")
    with_custom_tokenizer_code(tmp / "custom", tmp / "imported")


def _hf_model_whose_tokenizer_has_code(tmp: Path) -> None:
    """`{tmp}/hf`: a tiny Hugging Face GPT-2 whose tokenizer asks for its own class (as above)."""
    from resstream.data import train_bpe
    from tests.test_data_tokenizer import with_custom_tokenizer_code
    from tests.test_models_loading import SENTENCES, _tiny_gpt2

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    _tiny_gpt2(len(tokenizer)).save_pretrained(tmp / "hf")
    tokenizer.save_pretrained(tmp / "hf")
    with_custom_tokenizer_code(tmp / "hf", tmp / "imported")


_NAMES_ITS_CLASS = "custom/tokenizer_config.json' names 'tokenization_custom.CustomTokenizerFast'"
_NOT_SUPPORTED = "resstream runs no tokenizer's own code when it trains or tokenises"
TOKENIZER_CASES: list[Hostile] = [
    Hostile(
        "train-tokenizer-with-its-own-code",
        "train --dataset {corpus} {train} --tokenizer {tmp}/custom --out {out}",
        ("tokenizer directory '", "custom' needs custom code", _NAMES_ITS_CLASS, _NOT_SUPPORTED),
        setup=_tokenizer_with_code,
    ),
    Hostile(
        "train-tokenizer-json-beside-a-config-with-its-own-code",
        "train --dataset {corpus} {train} --tokenizer {tmp}/custom/tokenizer.json --out {out}",
        ("custom/tokenizer.json' needs custom code", _NAMES_ITS_CLASS, _NOT_SUPPORTED),
        setup=_tokenizer_with_code,
    ),
    Hostile(
        "tokenize-tokenizer-with-its-own-code",
        "tokenize --dataset {corpus} --tokenizer {tmp}/custom --quiet --out {out}",
        ("tokenizer directory '", "custom' needs custom code", _NAMES_ITS_CLASS, _NOT_SUPPORTED),
        setup=_tokenizer_with_code,
    ),
    Hostile(
        "shift-hf-model-tokenizer-with-its-own-code",
        "shift --model {tmp}/hf --dataset {corpus} --num-seqs 2 --seq-len 8 --quiet --out {out}",
        (
            "the tokenizer of model '",
            "hf/tokenizer_config.json' names 'tokenization_custom.CustomTokenizerFast'",
            "allowed only with --trust-remote-code, if you trust it",
        ),
        setup=_hf_model_whose_tokenizer_has_code,
    ),
]


# ------------------------------------------------------------------ links planted in a folder (issue 21)
def _victim(tmp: Path) -> Path:
    """`{tmp}/victim.txt`: a file of someone's that a planted link points at (the test's
    snapshot checks that it is never changed)."""
    victim = tmp / "victim.txt"
    victim.write_text("someone's notes\n", encoding="utf-8")
    return victim


def _victim_folder(tmp: Path) -> Path:
    """`{tmp}/victim/`: a folder of someone's with a file and a hidden one in it."""
    folder = tmp / "victim"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me\n", encoding="utf-8")
    (folder / ".step-0000001.abcdef123456").mkdir()  # named like a checkpoint's leftover
    return folder


def _planted_lock(make: Callable[[Path, Path], None]) -> Callable[[Path], None]:
    """`{tmp}/shared/` whose `.resstream.lock` is made by `make(lock, tmp)`."""

    def setup(tmp: Path) -> None:
        (tmp / "shared").mkdir()
        make(tmp / "shared" / ".resstream.lock", tmp)

    return setup


def _in_run(name: str) -> Callable[[Path], None]:
    """`{tmp}/run/NAME`, a link to someone's folder, in an otherwise empty run folder."""

    def setup(tmp: Path) -> None:
        (tmp / "run").mkdir()
        (tmp / "run" / name).symlink_to(_victim_folder(tmp), target_is_directory=True)

    return setup


def _resumable_elsewhere(tmp: Path) -> None:
    """`{tmp}/other`: someone's run with a checkpoint; `{tmp}/run/checkpoints` links to it."""
    _checkpoint(tmp)
    (tmp / "run").rename(tmp / "other")
    (tmp / "run").mkdir()
    (tmp / "run" / "checkpoints").symlink_to(tmp / "other" / "checkpoints", target_is_directory=True)


def _latest_pointing(where: str) -> Callable[[Path], None]:
    """A run with checkpoint 1 whose latest.json names the folder `where` (traversal)."""

    def setup(tmp: Path) -> None:
        _checkpoint(tmp)
        latest = tmp / "run" / "checkpoints" / "latest.json"
        latest.write_text(json.dumps({"step": 1, "dir": where}), encoding="utf-8")

    return setup


def _checkpoint_linked_elsewhere(tmp: Path) -> None:
    """A run whose checkpoint 1 folder is a link to someone else's checkpoint."""
    _checkpoint(tmp)
    step = tmp / "run" / "checkpoints" / "step-0000001"
    step.rename(tmp / "elsewhere")
    step.symlink_to(tmp / "elsewhere", target_is_directory=True)


def _sweep_with_linked_seed(tmp: Path) -> None:
    """`{tmp}/sweep/seed-0`, where the sweep trains its first run, is a link to someone's folder."""
    (tmp / "sweep").mkdir()
    (tmp / "sweep" / "seed-0").symlink_to(_victim_folder(tmp), target_is_directory=True)


_LOCKED = f"{SIMULATE} --out {{tmp}}/shared"
_NO_LINK = "resstream follows no link inside a folder it is given and uses only regular files"
FOLDER_CASES: list[Hostile] = [
    Hostile(
        "lock-file-is-a-link",
        _LOCKED,
        (
            "--out",
            "shared': its lock file '",
            ".resstream.lock' is a symbolic link, not a regular file",
            _NO_LINK,
        ),
        setup=_planted_lock(lambda lock, tmp: lock.symlink_to(_victim(tmp))),
    ),
    Hostile(
        "lock-file-is-a-directory",
        _LOCKED,
        ("shared': its lock file '", ".resstream.lock' is a directory, not a regular file"),
        setup=_planted_lock(lambda lock, tmp: lock.mkdir()),
    ),
    Hostile(
        "lock-file-is-a-hard-link",
        _LOCKED,
        (".resstream.lock' is a file with other hard links, not a file of its own",),
        setup=_planted_lock(lambda lock, tmp: os.link(_victim(tmp), lock)),
    ),
    Hostile(
        "lock-file-is-a-named-pipe",
        _LOCKED,
        (".resstream.lock' is a named pipe, not a regular file",),
        setup=_planted_lock(lambda lock, tmp: os.mkfifo(lock)),
    ),
    Hostile(
        "train-checkpoints-folder-is-a-link",
        "train --dataset {corpus} {train} --out {tmp}/run",
        ("--out '", "run': '", "run/checkpoints' is a symbolic link, not a directory", _NO_LINK),
        setup=_in_run("checkpoints"),
    ),
    Hostile(
        "train-tokenizer-folder-is-a-link",
        "train --dataset {corpus} {train} --out {tmp}/run",
        ("run/tokenizer' is a symbolic link, not a directory",),
        setup=_in_run("tokenizer"),
    ),
    Hostile(
        "resume-into-someone-elses-checkpoints",
        "train --resume --out {tmp}/run",
        ("run/checkpoints' is a symbolic link, not a directory",),
        setup=_resumable_elsewhere,
    ),
    Hostile(
        "resume-latest-names-a-folder-outside",
        "train --resume --out {tmp}/run",
        ("cannot resume: checkpoint in", "is corrupt", "not '../../other/step-0000001'"),
        setup=_latest_pointing("../../other/step-0000001"),
    ),
    Hostile(
        "resume-checkpoint-folder-is-a-link",
        "train --resume --out {tmp}/run",
        ("cannot resume from --out", "checkpoints/step-0000001' is a symbolic link, not a directory"),
        setup=_checkpoint_linked_elsewhere,
    ),
    Hostile(
        "sweep-run-folder-is-a-link",
        "sweep --dataset {corpus} {train} --max-steps 2 --seeds 0 --layers 0 --no-learned --out {tmp}/sweep",
        ("sweep/seed-0' is a symbolic link, not a directory", _NO_LINK),
        setup=lambda tmp: (
            (tmp / "sweep").mkdir() or (tmp / "sweep" / "seed-0").symlink_to(_victim_folder(tmp))
        ),
    ),
]


CASES = (
    OUTPUT_CASES + CHECKPOINT_CASES + BUDGET_CASES + DATA_CASES + STORE_CASES + TOKENIZER_CASES + FOLDER_CASES
)


def fill(command: str, tmp: Path) -> list[str]:
    """The command line with its placeholders filled in, split into arguments."""
    text = command.replace("{train}", TINY_TRAIN)
    text = text.replace("{tmp}", str(tmp)).replace("{out}", str(tmp / "out"))
    return text.replace("{corpus}", str(tmp / "corpus.txt")).split()


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its size and modification time, and every folder (whose
    own time changes when the lock file comes and goes)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (0, 0)
        for p in root.rglob("*")
    }


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_input_gets_one_line(case: Hostile, tmp_path, capsys):
    (tmp_path / "corpus.txt").write_text(corpus_text(), encoding="utf-8")
    if case.setup is not None:
        case.setup(tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = main(fill(case.command, tmp_path))
    err = capsys.readouterr().err.strip()
    assert code == case.exit_code, err
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error:"), err
    assert "Traceback" not in err, err
    for pattern in case.patterns:
        assert pattern in err, (pattern, err)
    assert_nothing_written(tmp_path / "out")
    after = snapshot(tmp_path)  # nothing written anywhere: not into --out, nor beside it
    assert {k: v for k, v in after.items() if not k.startswith("cache")} == before


def test_case_names_are_unique():
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
