"""Small, hand-made outputs of every kind `resstream report` reads, as the commands write them.

Shared by tests/test_report.py and tests/test_report_browser.py. Token strings and model names
carry <, & and " so escaping is exercised everywhere they appear.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.test_reporting import EVALS, VAL, write_sweep

#: A model name that must be escaped wherever it is shown.
HOSTILE_MODEL = 'tiny <b>&"model"'


def write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def alignment_entry(model: str = "reference", num_layers: int = 2) -> dict:
    """A shift.json "models" entry whose rates change linearly with relative depth; a deeper
    model shifts relatively later."""
    layers = list(range(num_layers + 1))
    late = 0.1 * (num_layers - 2)
    depth = [layer / num_layers for layer in layers]
    in_match = [round(0.8 - 0.7 * d, 6) for d in depth]
    out_match = [round(0.1 + (0.5 - late) * d, 6) for d in depth]
    return {
        "model": model,
        "num_layers": num_layers,
        "layers": layers,
        "in_match": in_match,
        "out_match": out_match,
        "in_match_ci": [[v - 0.05, v + 0.05] for v in in_match],
        "out_match_ci": [[v - 0.05, v + 0.05] for v in out_match],
        "cos_in": [round(0.9 - 0.8 * d, 6) for d in depth],
        "cos_out": [round((0.3 - late) * d, 6) for d in depth],
        "projection": [round((0.7 - late) * d, 6) for d in depth],
        "shift_layer": 0.7,
        "shift_depths": [0, 80] + [0] * (num_layers - 2) + [10],
        "never_shifted": 10,
        "num_tokens": 100,
        "num_sequences": 4,
        "top_k": 5,
        "decoder": "logit-lens",
        "num_projection_tokens": 95,
        "tied": True,
        "decoding": "final norm, then W_U = W_E (tied)",
        "sample": "4 of 50 non-overlapping 26-token windows of 'shakespeare', reservoir-sampled with seed 0",
    }


def write_shift(directory: Path, models=(("reference", 2),)) -> Path:
    """shift.json and run.json of (model, number of layers) pairs."""
    entries = [alignment_entry(m, layers) for m, layers in models]
    write_json(
        directory / "shift.json",
        {
            "dataset": "shakespeare",
            "sample": entries[0]["sample"],
            "dataset_fingerprint": "abc",
            "num_seqs": 4,
            "seq_len": 26,
            "decoders": ["logit-lens"],
            "models": entries,
        },
    )
    write_json(directory / "run.json", {"config": {"command": "shift"}, "files": ["shift.json", "run.json"]})
    return directory


#: (id, text) of the lens fixture's tokens: the text is '<b>', ' &', ' "q"'.
LENS_TOKENS = {1: "<b>", 2: " &", 3: ' "q"', 4: " the"}


def lens_position(position: int, input_id: int, next_id: int | None, top1: list[int]) -> dict:
    def text(token):
        return None if token is None else LENS_TOKENS[token]

    ranges = []
    for layer, token in enumerate(top1):
        if ranges and ranges[-1]["token_id"] == token:
            first = ranges[-1]["layers"].split("–")[0]
            ranges[-1]["layers"] = f"{first}–{layer}"
        else:
            ranges.append({"layers": str(layer), "token_id": token, "token": text(token)})
    return {
        "position": position,
        "input_id": input_id,
        "input": text(input_id),
        "next_id": next_id,
        "next": text(next_id),
        "top_ids": [[t] for t in top1],
        "input_ranks": [0] * len(top1),
        "next_ranks": None if next_id is None else [1] * len(top1),
        "top_probs": [[0.5] for _ in top1],
        "input_probs": [0.5] * len(top1),
        "next_probs": None if next_id is None else [0.1] * len(top1),
        "ranges": [
            {**r, "is_input": r["token_id"] == input_id, "is_next": r["token_id"] == next_id} for r in ranges
        ],
    }


def write_lens(directory: Path, model: str = HOSTILE_MODEL) -> Path:
    """Three positions over layers 0..3; layers 1 and 2 decode the same at every position."""
    positions = [
        lens_position(0, 1, 2, [1, 4, 4, 2]),
        lens_position(1, 2, 3, [2, 4, 4, 3]),
        lens_position(2, 3, None, [3, 4, 4, 4]),
    ]
    data = {
        "model": model,
        "decoder": "logit-lens",
        "top_k": 1,
        "num_layers": 3,
        "decoding": "final norm, then W_U",
        "positions": positions,
    }
    write_json(directory / "lens.json", data)
    return directory


SWEEP_CONFIG = {
    "model": {"n_layer": 3, "d_model": 32, "block_size": 32, "gate_strength": 0.5},
    "data": {"dataset": "shakespeare"},
    "run": {"max_steps": 20, "batch_size": 8},
}


def write_full_sweep(directory: Path) -> Path:
    """tests/test_reporting's sweep (3 layers, seeds 0 and 1, wikitext-2 and lambada scores)
    with a training config, parameter counts and the learned runs' gate histories."""
    write_sweep(directory, VAL, EVALS, in_sweep_json={(1, "learned")})
    data = json.loads((directory / "sweep.json").read_text())
    data["config"] = SWEEP_CONFIG
    write_json(directory / "sweep.json", data)
    for seed in (0, 1):
        for run in directory.glob(f"seed-{seed}/*"):
            write_json(run / "model.json", {"val_loss": VAL[(seed, run.name)], "parameters": 12345})
        history = {"steps": [1, 2, 3], "p": [[1 / 3] * 3, [0.3, 0.3, 0.4], [0.2, 0.2, 0.6 + 0.01 * seed]]}
        write_json(directory / f"seed-{seed}" / "learned" / "gate_history.json", history)
    return directory


def bench(name: str, perplexity: float, accuracy: float | None = None) -> dict:
    return {
        "name": name,
        "loss": math.log(perplexity),
        "perplexity": perplexity,
        "accuracy": 5.0,
        "num_tokens": 300,
        "last_word_accuracy": accuracy,
        "num_examples": None if accuracy is None else 10,
    }


def write_eval(directory: Path, model: str = "/models/gpt2") -> Path:
    write_json(
        directory / "eval.json",
        {
            "model": model,
            "max_tokens": 300,
            "benchmarks": [bench("wikitext-2", 30.0), bench("lambada", 20.0, 45.0)],
        },
    )
    return directory


def compare_cell(values: list[float], best: bool = False) -> dict:
    mean = sum(values) / len(values)
    return {"mean": mean, "std": None, "n": len(values), "values": values, "best": best}


def write_compare(directory: Path) -> Path:
    """Two rows, one seed each: baseline has the lower val loss, learned the lower perplexity
    and the higher accuracy."""
    columns = [
        {"key": "val_loss", "label": "val loss", "higher_is_better": False},
        {"key": "wikitext-2/perplexity", "label": "wikitext-2 ppl", "higher_is_better": False},
        {"key": "lambada/last_word_accuracy", "label": "lambada last-word acc (%)", "higher_is_better": True},
    ]
    rows = [
        ("baseline", "baseline", [2.0], [10.0], [20.0]),
        ("learned", "learned gate", [3.0], [8.0], [30.0]),
    ]
    write_json(
        directory / "compare.json",
        {
            "convention": "mean ± std",
            "columns": columns,
            "best_fixed_cut": None,
            "fixed_cuts": [],
            "rows": [
                {
                    "row": key,
                    "label": label,
                    "cut_layer": None,
                    "alpha": None,
                    "n": 1,
                    "seeds": [0],
                    "cells": {
                        "val_loss": compare_cell(val),
                        "wikitext-2/perplexity": compare_cell(ppl),
                        "lambada/last_word_accuracy": compare_cell(acc),
                    },
                }
                for key, label, val, ppl, acc in rows
            ],
            "benchmarks": ["wikitext-2", "lambada"],
            "max_eval_tokens": 500,
        },
    )
    return directory


def metric(values: list[float | None]) -> dict:
    kept = [v for v in values if v is not None]
    if not kept:
        return {"mean": None, "std": None, "n": 0, "values": []}
    mean = sum(kept) / len(kept)
    std = None if len(kept) < 2 else math.sqrt(sum((v - mean) ** 2 for v in kept) / (len(kept) - 1))
    return {"mean": mean, "std": std, "n": len(kept), "values": kept}


def write_misalignment(directory: Path) -> Path:
    """Two variants over seeds 0 and 1; the learned gate shifted in one seed only."""
    values = {  # (seed, variant): final in_match, out_match, cos_in, cos_out, projection, shift layer
        (0, "baseline"): (0.2, 0.5, 0.10, 0.3, 0.6, 1.5),
        (1, "baseline"): (0.4, 0.5, 0.12, 0.3, 0.6, 2.5),
        (0, "learned"): (0.1, 0.6, 0.05, 0.35, 0.7, 1.0),
        (1, "learned"): (0.1, 0.6, 0.05, 0.35, 0.7, None),
    }
    names = [
        "final_in_match",
        "final_out_match",
        "final_cos_in",
        "final_cos_out",
        "final_projection",
        "shift_layer",
    ]
    runs = [
        {
            "seed": seed,
            "variant": variant,
            "path": f"seed-{seed}/{variant}",
            **dict(zip(names, row, strict=True)),
        }
        for (seed, variant), row in values.items()
    ]
    names = [
        "final_in_match",
        "final_out_match",
        "final_cos_in",
        "final_cos_out",
        "final_projection",
        "shift_layer",
    ]
    variants = []
    for variant in ("baseline", "learned"):
        mine = [r for r in runs if r["variant"] == variant]
        row = {"variant": variant, "n": len(mine), "seeds": [r["seed"] for r in mine]}
        row.update({name: metric([r[name] for r in mine]) for name in names})
        variants.append(row)
    write_json(
        directory / "misalignment.json",
        {
            "format": "resstream-misalignment/1",
            "dataset": "wikitext-2",
            "top_k": 5,
            "decoder": "logit-lens",
            "num_sequences": 32,
            "seq_len": 64,
            "metrics": names,
            "variants": variants,
            "runs": runs,
        },
    )
    return directory


def write_reproduction(root: Path) -> Path:
    """A reproduction's directory as `resstream reproduce` leaves it, every stage finished."""
    write_json(root / "reproduce.json", {"format": "resstream-reproduce/1", "scale": "tiny", "stages": {}})
    write_shift(root / "shift" / "reference")
    write_lens(root / "lens" / "reference")
    write_full_sweep(root / "sweep")
    write_eval(root / "eval" / "reference")
    write_compare(root / "compare")
    write_misalignment(root / "misalignment")
    write_shift(
        root / "misalignment" / "seed-0", models=(("seed-0/baseline", 2),)
    )  # not a pretrained model's
    return root


def write_everything(root: Path) -> list[Path]:
    """One directory per kind of output; returns them in a fixed order."""
    return [
        write_lens(root / "lens"),
        write_shift(root / "shift", models=(("reference", 2), ("other", 4))),
        write_full_sweep(root / "sweep"),
        write_compare(root / "compare"),
        write_eval(root / "eval"),
        write_misalignment(root / "misalignment"),
    ]
