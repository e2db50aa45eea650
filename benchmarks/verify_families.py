"""`resstream verify` on every family's tiny model, in float32 and bfloat16: the table of
docs/models.md ("Measured on tiny random models").

Each family's tiny test model (`tests/test_models_adapters.py`: two layers, d_model 32, every
feature its family has, weights perturbed so norms and biases matter) is verified on one text
with a one-token-per-character tokenizer; the script prints one Markdown row per family and
dtype (the largest relative logit and decomposition errors, the largest state error, the least
lens and router agreement, the verdict), then the device, torch and transformers versions.

    python benchmarks/verify_families.py                  # CPU, every family
    python benchmarks/verify_families.py --device cuda    # on a GPU
    python benchmarks/verify_families.py --family mixtral --family gpt_oss
    python benchmarks/verify_families.py --shapes --device cuda   # random models of real shapes
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_models_adapters import ALL_CASES, VOCAB, char_tokenizer, tiny_model  # noqa: E402

import resstream  # noqa: E402

#: Fits every tiny model's context (resstream's: 16 tokens).
TEXT = "the old lamp"
#: The text of the models of real shapes (one token per character).
LONG_TEXT = "The residual stream carries every token forward, and each block writes its update into it."


def real_shapes() -> dict[str, object]:
    """Random models (default initialisation) of the shapes of real checkpoints, by name."""
    import transformers as tf

    moe = {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8}
    return {
        "llama 1.1B shape (d2048 L22)": tf.LlamaConfig(
            hidden_size=2048,
            num_hidden_layers=22,
            num_attention_heads=32,
            num_key_value_heads=4,
            intermediate_size=5632,
            vocab_size=VOCAB,
        ),
        "qwen3 0.6B shape (d1024 L28)": tf.Qwen3Config(
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            vocab_size=VOCAB,
        ),
        "mixtral-like (d1024 L8, 8 experts top-2)": tf.MixtralConfig(
            **moe, intermediate_size=2816, num_local_experts=8, num_experts_per_tok=2, vocab_size=VOCAB
        ),
        "gpt-oss-like (d1024 L8, 32 experts top-4)": tf.GptOssConfig(
            **moe,
            head_dim=64,
            intermediate_size=1024,
            num_local_experts=32,
            num_experts_per_tok=4,
            vocab_size=VOCAB,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    }


def _least(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return "n/a" if not known else f"{min(known):g}"


def row(case: str, model: torch.nn.Module, tokenizer: object, text: str = TEXT) -> str:
    """One Markdown row: the figures of `model` (named `case`) in its dtype, on its device."""
    result = resstream.verify(model, tokenizer, text=text)
    dtype = result.dtype
    states = [layer.state_relative for layer in result.layers if layer.state_relative is not None]
    decomposition = max(layer.decomposition_relative for layer in result.layers)
    router = _least([block.agreement for block in result.router]) if result.router else "n/a"
    lens = _least([layer.lens_agreement for layer in result.layers])
    verdict = "pass" if result.passed else f"FAIL ({', '.join(result.failed)})"
    state = f"{max(states):.1e}" if states else "n/a"
    weights = result.check("weights").value
    return (
        f"| {case} | {dtype} | {result.logit_relative:.1e} | {state} | {weights:.1e} | {decomposition:.1e} | "
        f"{lens} | {router} | {verdict} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--family", action="append", help="a case of ALL_CASES (repeatable; default: all)")
    parser.add_argument("--shapes", action="store_true", help="random models of real shapes instead")
    args = parser.parse_args()
    import transformers

    tokenizer = char_tokenizer()
    print("| model | dtype | logits | states | weights | decomposition | lens | router | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    if args.shapes:
        for name, config in real_shapes().items():
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
            for dtype in (torch.float32, torch.bfloat16):
                print(row(name, model.to(args.device, dtype), tokenizer, LONG_TEXT), flush=True)
    for case in [] if args.shapes else args.family or ALL_CASES:
        for dtype in (torch.float32, torch.bfloat16):
            model = copy.deepcopy(tiny_model(case)).to(args.device, dtype)
            print(row(case, model, tokenizer), flush=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"\ndevice {name}, torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
