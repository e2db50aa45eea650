"""resstream and the real `tuned-lens` package (AlignmentResearch, 0.2.0) read each other's lenses.

The tests (tests/test_tuned_lens_interop.py) imitate the package's files without the package;
this script checks against the package itself, on a tiny GPT-2 (3 layers, d_model 64, vocabulary
1,000, random weights, seed 0) saved with `save_pretrained`:

(a) package → resstream: `TunedLens.from_model(model)` with random translators, `lens.save(dir)`,
    read by `resstream.load_lens(dir, model=MODEL_DIR)`;
(b) resstream → package: a resstream lens with random translators saved in resstream's layout,
    exported by `resstream tune-lens --out DIR --export tuned-lens EXPORT`, read by the package's
    `TunedLens.from_model_and_pretrained(model, EXPORT)`.

Each compares, at every layer i < L, the package's logits `lens(hidden_states[i], idx=i)` with
resstream's tuned decoder on h_i (`decoder_of(view, "tuned", lens).at(i).logits`, with h_i from
`residual_states`), in float32, and layer L (the model's own logits) likewise. It prints max
|Δlogit| per layer (with max |logit|, for scale), whether the argmax agrees everywhere and whether
the package's `unembed_hash` of the model equals resstream's, and exits 1 if any |Δ| > 1e-4, an
argmax differs or the hashes do.

The package is no dependency of resstream: install it in a side environment (torchdata < 0.10,
since the package imports `torchdata.dataloader2`, which 0.10 removed), from the repository root:

    python3 -m venv /tmp/tlpkg
    /tmp/tlpkg/bin/pip install torch==2.13.0
    printf 'torch==2.13.0\\ntransformers==5.24.0\\n' > /tmp/tlc.txt
    /tmp/tlpkg/bin/pip install -c /tmp/tlc.txt tuned-lens torchdata==0.9.0
    /tmp/tlpkg/bin/pip install -c /tmp/tlc.txt -e .
    HF_HUB_OFFLINE=1 /tmp/tlpkg/bin/python benchmarks/tuned_lens_interop.py     # ~10 s on a CPU
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as transformers_logging
from tuned_lens.nn.lenses import TunedLens as PackageLens

import resstream
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.decoding.tuned_lens import TunedLens
from resstream.analysis.decoding.tuned_lens_package import unembed_hash
from resstream.capture import residual_states
from resstream.cli.main import main as resstream_cli
from resstream.data import train_bpe
from resstream.models import as_loaded

TOLERANCE = 1e-4
LAYERS, D_MODEL, VOCAB = 3, 64, 1000


def tiny_gpt2(directory: Path) -> GPT2LMHeadModel:
    """The tiny GPT-2 (seed 0), saved to `directory` with a small tokenizer (the package needs
    none; resstream loads a model directory with its tokenizer) and read back from it (so its
    `name_or_path` is the directory, as the package records)."""
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=LAYERS,
        n_embd=D_MODEL,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    GPT2LMHeadModel(config).save_pretrained(directory)
    tokenizer = train_bpe(["the residual stream carries each token forward"] * 4, vocab_size=300)
    tokenizer.save_pretrained(directory)
    return GPT2LMHeadModel.from_pretrained(directory).eval()


def randomise(weight: torch.Tensor, bias: torch.Tensor, seed: int) -> None:
    """Fill one translator with random values (weights N(0, 0.1²), bias N(0, 1))."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=generator) * 0.1)
        bias.copy_(torch.randn(bias.shape, generator=generator))


def package_logits(lens: PackageLens, model: GPT2LMHeadModel, ids: torch.Tensor) -> list[torch.Tensor]:
    """The package's decoding of hidden_states[0..L−1], then the model's own logits."""
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        return [*(lens(h, idx=i) for i, h in enumerate(out.hidden_states[:-1])), out.logits]


def resstream_logits(lens: TunedLens, model: GPT2LMHeadModel, ids: torch.Tensor) -> list[torch.Tensor]:
    """resstream's tuned decoder of h_0..h_L."""
    view = as_loaded(model, needs_tokenizer=False).view
    decoder = decoder_of(view, "tuned", lens)
    with torch.no_grad():
        states = residual_states(view, ids)
        return [decoder.at(layer).logits(states[layer]) for layer in range(view.n_layers + 1)]


def compare(theirs: list[torch.Tensor], ours: list[torch.Tensor]) -> list[tuple[float, bool, float]]:
    """Per layer: max |Δlogit|, whether the argmax agrees at every position, and max |logit|."""
    return [
        (
            float((a.float() - b.float()).abs().max()),
            bool((a.argmax(-1) == b.argmax(-1)).all()),
            float(a.abs().max()),
        )
        for a, b in zip(theirs, ours, strict=True)
    ]


def package_to_resstream(model: GPT2LMHeadModel, model_dir: Path, work: Path, ids: torch.Tensor):
    """(a): a package lens with random translators, saved by the package, read by resstream."""
    lens = PackageLens.from_model(model)
    for i, translator in enumerate(lens):
        randomise(translator.weight, translator.bias, seed=10 + i)
    lens.save(work / "package-lens")
    ours = resstream.load_lens(work / "package-lens", model=str(model_dir))
    hashes = (lens.config.unembed_hash, unembed_hash(model.lm_head.weight))
    return compare(package_logits(lens, model, ids), resstream_logits(ours, model, ids)), hashes


def resstream_to_package(model: GPT2LMHeadModel, work: Path, ids: torch.Tensor):
    """(b): a resstream lens with random translators, exported by `tune-lens --export
    tuned-lens`, read by the package."""
    lens = TunedLens.zero(as_loaded(model, needs_tokenizer=False).view, "tiny-gpt2")
    randomise(lens.translators.weight, lens.translators.bias, seed=20)
    lens.save(work / "ours")
    export = work / "exported"
    code = resstream_cli(["tune-lens", "--out", str(work / "ours"), "--export", "tuned-lens", str(export)])
    if code != 0:
        raise SystemExit(f"tune-lens --export failed (exit {code})")
    theirs = PackageLens.from_model_and_pretrained(model, str(export))
    return compare(package_logits(theirs, model, ids), resstream_logits(lens, model, ids))


def main() -> int:
    torch.set_num_threads(2)
    transformers_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = tiny_gpt2(work / "tiny-gpt2")
        ids = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))
        forward, hashes = package_to_resstream(model, work / "tiny-gpt2", work, ids)
        backward = resstream_to_package(model, work, ids)
    print(f"tiny GPT-2: {LAYERS} layers, d_model {D_MODEL}, vocabulary {VOCAB}; {ids.numel()} random tokens")
    print("layer            | package → resstream | resstream → package | argmax agrees | max |logit|")
    for layer, (a, b) in enumerate(zip(forward, backward, strict=True)):
        name = f"{layer}" if layer < LAYERS else f"{layer} (model logits)"
        print(f"{name:<16} | {a[0]:19.2e} | {b[0]:19.2e} | {a[1] and b[1]!s:<13} | {a[2]:.3f}")
    print(f"unembed_hash equal (package vs resstream): {hashes[0] == hashes[1]}")
    worst = max(row[0] for row in forward + backward)
    agree = all(row[1] for row in forward + backward) and hashes[0] == hashes[1]
    ok = worst <= TOLERANCE and agree
    print(f"max |Δlogit| {worst:.2e} (tolerance {TOLERANCE:g}): {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
