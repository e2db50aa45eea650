"""The study's scales: what `resstream reproduce --scale tiny|laptop|paper` trains, evaluates
and analyses (`SCALES`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scale:
    """What one scale trains, evaluates and analyses (`SCALES`)."""

    name: str
    about: str
    models: tuple[str, ...]  # pretrained models of the shift and eval stages
    preset: str  # the training preset of every sweep run
    train_flags: tuple[str, ...]  # config flags on top of the preset
    seeds: tuple[int, ...]
    train_dataset: str  # the sweep's training corpus (the preset's)
    shift_dataset: str = "wikitext-2"
    shift_seqs: int = 64
    shift_seq_len: int = 128
    top_k: int = 5
    heldout_dataset: str = "wikitext-2"  # misalignment of the trained models
    heldout_seqs: int = 64
    heldout_seq_len: int = 64  # at most the trained models' context
    benchmarks: tuple[str, ...] = ("wikitext-2", "lambada", "openwebtext", "fineweb-edu")
    max_eval_tokens: int | None = None
    shard_tokenizer: str | None = None  # a tokens stage runs first when set


SCALES: dict[str, Scale] = {
    scale.name: scale
    for scale in (
        Scale(
            name="tiny",
            about="a smoke test of the whole pipeline: 2-layer models, 20 steps, one seed",
            models=("reference",),
            preset="tiny",
            train_flags=(),
            seeds=(0,),
            train_dataset="shakespeare",
            shift_seqs=8,
            shift_seq_len=32,
            heldout_seqs=8,
            heldout_seq_len=32,
            benchmarks=("wikitext-2", "lambada"),
            max_eval_tokens=500,
        ),
        Scale(
            name="laptop",
            about="4-layer, 64-wide models trained for 800 steps on the built-in Shakespeare corpus, 3 seeds",
            models=("reference",),
            preset="laptop",
            train_flags=("--max-steps", "800"),
            seeds=(0, 1, 2),
            train_dataset="shakespeare",
            benchmarks=("wikitext-2", "lambada", "openwebtext", "fineweb-edu", "shakespeare"),
            max_eval_tokens=20_000,
        ),
        Scale(
            name="paper",
            about="the paper's protocol: 12-layer GPT-2-style models on 10B tokens of FineWeb-Edu "
            "(bf16, torch.compile, fused AdamW; GPUs under torchrun)",
            models=("gpt2", "google/gemma-2-2b"),
            preset="paper",
            train_flags=(),
            seeds=(0,),
            train_dataset="fineweb-edu-10bt",
            shift_seqs=256,
            heldout_seqs=256,
            heldout_seq_len=1024,
            shard_tokenizer="gpt2",
        ),
    )
}
