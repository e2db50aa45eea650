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
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_models_adapters import ALL_CASES, char_tokenizer, tiny_model  # noqa: E402

import resstream  # noqa: E402

#: Fits every tiny model's context (resstream's: 16 tokens).
TEXT = "the old lamp"


def _least(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return "n/a" if not known else f"{min(known):g}"


def row(case: str, dtype: str, device: str, tokenizer: object) -> str:
    """One Markdown row: the family's figures in `dtype` on `device`."""
    model = copy.deepcopy(tiny_model(case)).to(device=device, dtype=getattr(torch, dtype))
    result = resstream.verify(model, tokenizer, text=TEXT)
    states = [layer.state_relative for layer in result.layers if layer.state_relative is not None]
    decomposition = max(layer.decomposition_relative for layer in result.layers)
    router = _least([block.agreement for block in result.router]) if result.router else "n/a"
    lens = _least([layer.lens_agreement for layer in result.layers])
    verdict = "pass" if result.passed else f"FAIL ({', '.join(result.failed)})"
    state = f"{max(states):.1e}" if states else "n/a"
    return (
        f"| {case} | {dtype} | {result.logit_relative:.1e} | {state} | {decomposition:.1e} | "
        f"{lens} | {router} | {verdict} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--family", action="append", help="a case of ALL_CASES (repeatable; default: all)")
    args = parser.parse_args()
    import transformers

    tokenizer = char_tokenizer()
    print("| family | dtype | logits | states | decomposition | lens | router | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for case in args.family or ALL_CASES:
        for dtype in ("float32", "bfloat16"):
            print(row(case, dtype, args.device, tokenizer), flush=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"\ndevice {name}, torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
