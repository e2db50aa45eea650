"""`resstream attribute`: who wrote a predicted token into the residual stream."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated

import typer

from resstream.checks import ONLY_THE_LOGIT_LENS, decoder_kind
from resstream.cli import options
from resstream.errors import UsageError, refuse_set

if TYPE_CHECKING:
    from resstream.analysis.attribution.results import AttributeResult


@options.command
def attribute(
    *,
    output: options.OutputArg,
    loading: options.ModelArg,
    one: Annotated[
        options.OneText,
        options.text_options(
            "The text whose prediction is attributed.",
            keywords=options.PREDICTION_OPTIONS,
            required=False,
            help={"foil": "A second token: attribute the target − foil logit difference."},
        ),
    ],
    top: Annotated[
        options.Count,
        typer.Option(help="Sources, neurons and query shares listed (the largest |score| first)."),
    ] = 20,
    no_sources: Annotated[
        bool, typer.Option("--no-sources", help="Skip splitting heads into source positions.")
    ] = False,
    no_neurons: Annotated[bool, typer.Option("--no-neurons", help="Skip the per-neuron scores.")] = False,
    no_contributions: Annotated[
        bool,
        typer.Option(
            "--no-contributions",
            help="DLA only: skip the log-probability contributions C of heads, sources and neurons "
            "(a score of the whole vocabulary each); the layers' C stays.",
        ),
    ] = False,
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
        options.Sample, options.corpus_mode_options("every next token is a target.", batch_size=8)
    ],
) -> None:
    """Attribute a prediction to layers, heads, attention sources and FFN neurons.

    With --dataset: every next token of a corpus sample, averaged over sequences.
    """
    in_corpus = sample.corpus_mode(candidates=candidates)
    check_mode(one, in_corpus, decoder)
    import resstream
    from resstream.analysis.attribution.results import AttributeResult, CorpusAttribution, check_rank_by
    from resstream.io import write_json
    from resstream.reporting.attribute import terminal_summary, write_attribute_report

    with options.analysis_outputs(output.out, "attribute", loading.device) as outputs:
        result: AttributeResult | CorpusAttribution
        if in_corpus:
            result = resstream.attribute_corpus(
                loading.model,
                top=top,
                neurons=not no_neurons,
                candidates=candidates,
                rank_by=check_rank_by(rank_by),
                **options.api_kwargs(sample, loading, output),
            )
        else:
            result = resstream.attribute(
                one.text,
                model=loading.model,
                top=top,
                sources=not no_sources,
                neurons=not no_neurons,
                contributions=not no_contributions,
                decoder=decoder,
                rank_by=check_rank_by(rank_by),
                **options.api_kwargs(one, loading, output),
            )
        if outputs is None:  # another rank of a torchrun job: rank 0 writes
            return
        write_json(outputs / "attribute.json", result.to_dict())
        written = write_attribute_report(result, outputs.staging)
        corpus_result = result if isinstance(result, CorpusAttribution) else None
        settings = {
            "model": loading.model,
            **one.record(),
            "top": top,
            "sources": None if in_corpus else not no_sources,
            "neurons": not no_neurons,
            "contributions": None if in_corpus else not no_contributions,
            "decoder": decoder,
            "rank_by": rank_by,
            "candidates": candidates,
            "batch_size": sample.batch_size,
        }
        options.write_corpus_mode_record(outputs, "attribute", settings, loading, sample, corpus_result)
    for line in terminal_summary(result):
        typer.echo(line)
    if isinstance(result, AttributeResult):
        typer.echo(f"computed: {result.computed}; {levels_hint(result)}")
    names = ", ".join(sorted(p.name for p in written))
    typer.echo(f"wrote attribute.json, {names} and run.json to {output.out}")


def levels_hint(result: AttributeResult) -> str:
    """How to ask for fewer or more levels than `result` computed, in flags."""
    fewer = [flag for flag, on in (("--no-sources", result.sources), ("--no-neurons", result.neurons)) if on]
    if any(math.isfinite(head.contribution) for head in result.heads):
        fewer.append("--no-contributions")
    more = "--rank-by c for every source's and neuron's C" if result.rank_by == "dla" else ""
    parts = [f"fewer: {', '.join(fewer)}" if fewer else "", f"more: {more}" if more else ""]
    return "; ".join(part for part in parts if part) or "every level computed"


def check_mode(one: options.OneText, in_corpus: bool, decoder: str) -> None:
    """A known --decoder and a text; corpus mode (--dataset) takes no text, no tuned lens and
    no option of one text (`OneText.check_corpus_mode`)."""
    kind = decoder_kind(decoder)
    if in_corpus and kind == "embedding":
        raise UsageError(ONLY_THE_LOGIT_LENS)
    if in_corpus and kind == "tuned":
        raise UsageError("`decoder` tuned:DIR applies to one text, not to corpus mode (`dataset`)")
    one.check_corpus_mode(in_corpus)


def refuse_given(given: Mapping[str, object], applies_to: str) -> None:
    """UsageError for the first option of `given` that is set (not None)."""
    refuse_set(given, f"applies to {applies_to}")


def register(app: typer.Typer) -> None:
    """Add `attribute` to the app."""
    app.command("attribute")(attribute)
