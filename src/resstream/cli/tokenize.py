"""`resstream tokenize`: tokenise a corpus into a sharded token store (paper-scale training)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from resstream.cli.options import DataDirOption


def tokenize(
    dataset: Annotated[
        str,
        typer.Option(help="Named corpus or .txt/.jsonl path (read while it is tokenised)."),
    ],
    tokenizer: Annotated[str, typer.Option(help="gpt2, a tokenizer directory or a Hugging Face name.")],
    out: Annotated[
        Path, typer.Option("--out", help="Store directory (created; resumed or reused if it holds one).")
    ],
    shard_tokens: Annotated[
        int, typer.Option(help="Token ids per shard (the last one shorter).")
    ] = 100_000_000,
    workers: Annotated[
        int | None, typer.Option(help="Tokenising processes \\[default: min(8, CPUs)].", show_default=False)
    ] = None,
    data_dir: DataDirOption = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Tokenise a corpus into shard-NNNNN.bin files and manifest.json in --out; an interrupted
    run continues after its last complete shard, a finished one is reused. Train on it with
    `resstream train --dataset DIR --tokenizer NAME`."""
    from resstream.data import load_tokenizer, stream_corpus
    from resstream.data.shards import check_shard_settings, write_shards

    check_shard_settings(shard_tokens, workers)  # before the corpus and tokenizer are read
    corpus = stream_corpus(dataset, data_dir=data_dir)
    loaded = load_tokenizer(tokenizer, data_dir=data_dir)
    summary = write_shards(
        corpus,
        loaded,
        out,
        shard_tokens=shard_tokens,
        workers=workers,
        tokenizer_name=tokenizer,
        progress=not quiet,
    )
    if summary.written_shards == 0:
        typer.echo(
            f"{out} already holds the complete store: {summary.shards} shards, {summary.tokens:,} tokens "
            f"(fingerprint {summary.fingerprint}); nothing written"
        )
        return
    typer.echo(
        f"wrote {summary.written_shards} shards, {summary.written_tokens:,} tokens in "
        f"{summary.seconds:.1f} s ({summary.tokens_per_s:,.0f} tokens/s); "
        f"{out} holds {summary.shards} shards, {summary.tokens:,} tokens (fingerprint {summary.fingerprint})"
    )


def register(app: typer.Typer) -> None:
    """Add `tokenize` to the app."""
    app.command("tokenize")(tokenize)
