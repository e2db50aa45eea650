"""`resstream attribute`: who wrote a predicted token into the residual stream."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from resstream.cli import options
from resstream.errors import UsageError, refuse_set

#: The corpus options' help: each applies to corpus mode only, and says its default there.
CORPUS_HELP = {
    "dataset": "Corpus mode: a named corpus or .txt/.jsonl path; every next token is a target.",
    "num_seqs": "Corpus mode: sequences sampled \\[default: 16].",
    "seq_len": "Corpus mode: tokens per sequence \\[default: 64].",
    "batch_size": "Corpus mode: sequences per forward pass \\[default: 8].",
}


@options.command
def attribute(
    *,
    output: options.OutputArg,
    loading: options.ModelArg,
    text: Annotated[str | None, typer.Option(help="The text whose prediction is attributed.")] = None,
    text_file: Annotated[Path | None, typer.Option(help="A UTF-8 file holding the text.")] = None,
    position: Annotated[
        int | None,
        typer.Option(help="Token position to attribute (default: the last; negative: from the end)."),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(help="Target token as text, one token (default: the model's top prediction)."),
    ] = None,
    target_id: Annotated[int | None, typer.Option(help="Target token id (instead of --target).")] = None,
    foil: Annotated[
        str | None, typer.Option(help="A second token: attribute the target − foil logit difference.")
    ] = None,
    top: Annotated[
        int, typer.Option(help="Sources, neurons and query shares listed (the largest |score| first).")
    ] = 20,
    no_sources: Annotated[
        bool, typer.Option("--no-sources", help="Skip splitting heads into source positions.")
    ] = False,
    no_neurons: Annotated[bool, typer.Option("--no-neurons", help="Skip the per-neuron scores.")] = False,
    decoder: Annotated[
        str,
        typer.Option(
            help="logit-lens (every score), or tuned:DIR to add the target's trajectory through a tuned lens."
        ),
    ] = "logit-lens",
    rank_by: Annotated[
        str,
        typer.Option(
            help="What leads the summary, the figures and the listed sources and neurons: dla (the "
            "direct logit attribution = minus the zero-ablation direct effect) or c (the "
            "log-probability contribution, the seed paper's order); both are in every file."
        ),
    ] = "dla",
    candidates: Annotated[
        int | None,
        typer.Option(
            help="Corpus mode: neurons (largest first-order estimate) scored exactly \\[default: 64]."
        ),
    ] = None,
    sample: Annotated[
        options.Sample,
        options.corpus_options(dataset=None, num_seqs=None, seq_len=None, batch_size=None, help=CORPUS_HELP),
    ],
) -> None:
    """Attribute a prediction to layers, heads, attention sources and FFN neurons.

    With --dataset: every next token of a corpus sample, averaged over sequences.
    """
    import resstream
    from resstream.analysis.attribution.results import AttributeResult, CorpusAttribution, check_rank_by
    from resstream.distributed import launched_world
    from resstream.io import write_json
    from resstream.reporting.attribute import terminal_summary, write_attribute_report

    one_text = {"position": position, "target": target, "target_id": target_id, "foil": foil}
    corpus = {"num_seqs": sample.num_seqs, "seq_len": sample.seq_len, "candidates": candidates}
    in_corpus = sample.dataset is not None
    with options.analysis_outputs(output.out, "attribute", loading.device) as outputs:
        if in_corpus:
            check_mode(text, text_file, decoder, one_text)
        else:
            refuse_given(
                {**corpus, "batch_size": sample.batch_size}, "corpus mode (`dataset`), not to one text"
            )
        result: AttributeResult | CorpusAttribution
        if in_corpus:
            result = resstream.attribute_corpus(
                loading.model,
                top=top,
                neurons=not no_neurons,
                candidates=candidates,
                rank_by=check_rank_by(rank_by),
                **sample.api_kwargs(),
                **loading.api_kwargs(),
                progress=output.progress,
            )
        else:
            result = resstream.attribute(
                text,
                text_file=text_file,
                model=loading.model,
                position=position,
                target=target,
                target_id=target_id,
                foil=foil,
                top=top,
                sources=not no_sources,
                neurons=not no_neurons,
                decoder=decoder,
                rank_by=check_rank_by(rank_by),
                **loading.api_kwargs(),
                progress=output.progress,
            )
        if outputs is None:  # another rank of a torchrun job: rank 0 writes
            return
        write_json(outputs / "attribute.json", result.to_dict())
        written = write_attribute_report(result, outputs.staging)
        corpus_result = result if isinstance(result, CorpusAttribution) else None
        settings = {
            "model": loading.model,
            "text_file": str(text_file) if text_file else None,
            **one_text,
            "top": top,
            "sources": None if in_corpus else not no_sources,
            "neurons": not no_neurons,
            "decoder": decoder,
            "rank_by": rank_by,
            "dataset": sample.dataset,
            "num_seqs": corpus_result.num_seqs if corpus_result else None,
            "seq_len": corpus_result.seq_len if corpus_result else None,
            "candidates": candidates,
            "batch_size": sample.batch_size,
        }
        seed = sample.seed if in_corpus else None
        fingerprint = corpus_result.dataset_fingerprint if corpus_result else None
        options.write_run_record(
            outputs, "attribute", settings, loading, seed, fingerprint, processes=launched_world()
        )
    for line in terminal_summary(result):
        typer.echo(line)
    names = ", ".join(sorted(p.name for p in written))
    typer.echo(f"wrote attribute.json, {names} and run.json to {output.out}")


def check_mode(
    text: str | None, text_file: Path | None, decoder: str, one_text: Mapping[str, object]
) -> None:
    """Corpus mode (--dataset) takes no text, no tuned lens and no option of one text."""
    from resstream.api.attribute import ONLY_THE_LOGIT_LENS
    from resstream.api.decoders import decoder_spec

    kind = decoder_spec(decoder).kind
    if kind == "embedding":
        raise UsageError(ONLY_THE_LOGIT_LENS)
    if kind == "tuned":
        raise UsageError("`decoder` tuned:DIR applies to one text, not to corpus mode (`dataset`)")
    if text is not None or text_file is not None:
        raise UsageError("give a text (`text`/`text_file`) or a `dataset`, not both")
    refuse_given(one_text, "one text, not to corpus mode (`dataset`)")


def refuse_given(given: Mapping[str, object], applies_to: str) -> None:
    """UsageError for the first option of `given` that is set (not None)."""
    refuse_set(given, f"applies to {applies_to}")


def register(app: typer.Typer) -> None:
    """Add `attribute` to the app."""
    app.command("attribute")(attribute)
