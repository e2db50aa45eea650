"""`resstream ablate` and `resstream patch`: does a component matter for a prediction?

Both read one text (`--text`/`--text-file`), the prediction at `--position` of `--target`
(`--foil` for a logit difference), and intervene on each `--component` alone at `--positions`
(`resstream.ablate` / `resstream.patch`). `ablate --dataset` without a text, or `ablate
--faithfulness`, instead checks the additive scores against the exact effects
(`resstream.faithfulness`). Each writes `<command>.json`, its report and run.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from resstream.cli import options
from resstream.cli.attribute import refuse_given
from resstream.cli.common import split_names
from resstream.cli.flags import cli_message
from resstream.errors import UsageError

if TYPE_CHECKING:
    from resstream.analysis.interventions.faithfulness import FaithfulnessResult
    from resstream.analysis.interventions.results import InterventionResult
    from resstream.rundir import OutputSet

# The options of one text and its prediction (`options.text_options`), declared once for both
# commands: ablate reads a corpus instead without a text (faithfulness over it).
TEXT_HELP = "The text whose prediction is intervened on."
FOIL_HELP = {"foil": "A second token: measure the target − foil logit difference too."}
AblateText = Annotated[
    options.OneText,
    options.text_options(TEXT_HELP, keywords=options.PREDICTION_OPTIONS, required=False, help=FOIL_HELP),
]
PatchText = Annotated[
    options.OneText, options.text_options(TEXT_HELP, keywords=options.PREDICTION_OPTIONS, help=FOIL_HELP)
]
ComponentOption = Annotated[
    list[str] | None,
    typer.Option(
        "--component",
        help="A component, e.g. emb, L3.attn, L4.mlp, L3.H2, L5.N1031, L3.H2.S7, L2.resid@5 (* for every "
        "index); repeat for several (default: every head, every MLP and the top neurons).",
    ),
]
PositionsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--positions",
        help="Positions intervened on, comma-separated or repeated (default: every position).",
    ),
]
TopNeuronsOption = Annotated[
    int | None,
    typer.Option(help="Without --component: neurons with the largest |DLA| intervened on \\[default: 20]."),
]
BatchSizeOption = Annotated[
    int | None, typer.Option(help="Interventions run together in one forward pass \\[default: 32].")
]
DirectOption = Annotated[
    bool,
    typer.Option(
        "--direct",
        help="Measure the direct path too (only through the residual stream to the logits) beside the "
        "total effect.",
    ),
]

#: Where the faithfulness options apply, for messages.
FAITHFULNESS = "faithfulness (`faithfulness`, or `dataset` without a text)"
#: The corpus options' help for `ablate`: the corpus of mean and resample ablation, or of
#: corpus faithfulness without a text.
CORPUS_HELP = {
    "dataset": "With a text: the corpus of --mode mean/resample \\[default: shakespeare]; without: "
    "faithfulness of the additive scores over a sample of it.",
    "num_seqs": "Corpus windows averaged by --mode mean \\[default: 16], resampled by resample "
    "\\[default: 8] or measured for faithfulness \\[default: 16].",
    "seq_len": "Faithfulness over a corpus: tokens per window \\[default: 64].",
    "seed": "Seed of the corpus sample.",
}


@options.command
def ablate(
    *,
    output: options.OutputArg,
    loading: Annotated[options.Loading, options.model_options(device_map=False)],
    one: AblateText,
    component: ComponentOption = None,
    positions: PositionsOption = None,
    mode: Annotated[
        str | None,
        typer.Option(help="zero, mean (corpus mean) or resample (corpus windows) \\[default: zero]."),
    ] = None,
    top_neurons: TopNeuronsOption = None,
    batch_size: BatchSizeOption = None,
    direct: DirectOption = False,
    faithfulness: Annotated[
        bool,
        typer.Option(
            "--faithfulness",
            help="Check the additive scores (C, DLA, |m|, grad×act) against exact ablations instead "
            "(also: --dataset without a text).",
        ),
    ] = False,
    top_k: Annotated[
        int | None, typer.Option(help="Faithfulness: k of the top-k overlap \\[default: 10].")
    ] = None,
    candidates: Annotated[
        int | None,
        typer.Option(
            help="Faithfulness: neurons ablated one by one per prediction \\[default: 300 for one text, "
            "100 per corpus prediction]."
        ),
    ] = None,
    sample: Annotated[
        options.Sample,
        options.corpus_options(
            dataset=None, num_seqs=None, seq_len=None, help=CORPUS_HELP, without=("batch_size",)
        ),
    ],
) -> None:
    """Ablate components (zero, mean or resample) and measure what happens to a prediction.

    With --dataset and no text, or with --faithfulness: how well the additive scores predict
    the exact effects of ablation.
    """
    if sample.dataset is None:  # every mode reads a text then
        one.require()
    import resstream
    from resstream.rundir import output_set

    chosen = intervened_kwargs(component, positions, top_neurons)
    interventions = {
        "foil": one.prediction["foil"],
        **recorded(chosen),
        "mode": mode,
        "top_neurons": top_neurons,
        "direct": direct or None,
    }
    scores = {"top_k": top_k, "candidates": candidates}
    scoring = faithfulness or (sample.dataset is not None and not one.given)
    # The API's defaults stand for what is not given: the corpus options and the prediction's.
    corpus = {**sample.api_kwargs(), "batch_size": batch_size}
    with output_set(output.out, "ablate") as outputs:
        if scoring:
            refuse_given(interventions, f"ablating components of one text, not to {FAITHFULNESS}")
            scored = resstream.faithfulness(
                one.text,
                model=loading.model,
                **given(**one.api_kwargs(), **corpus, top_k=top_k, candidates=candidates),
                **options.api_kwargs(loading, output),
            )
            report = faithfulness_report(scored, outputs)
        else:
            refuse_given(scores, f"{FAITHFULNESS}, not to ablating components")
            check_corpus_use(mode, sample)
            ablated = resstream.ablate(
                one.text,
                model=loading.model,
                **chosen,
                **given(**one.api_kwargs(), **corpus, mode=mode, direct=direct or None),
                **options.api_kwargs(loading, output),
            )
            report = intervention_report(ablated, outputs)
        settings = {
            "model": loading.model,
            **one.record(),
            **interventions,
            "direct": direct,
            "faithfulness": scoring,
            **scores,
            **sample.record(seq_len=report.seq_len),
            "batch_size": batch_size,  # ablate's own option: the corpus options have none
            "num_seqs": report.num_seqs or sample.num_seqs,
        }
        seed = sample.seed if scoring or mode in ("mean", "resample") else None
        options.write_run_record(outputs, "ablate", settings, loading, seed, report.dataset_fingerprint)
    report.show(output.out, "ablate")


@options.command
def patch(
    *,
    output: options.OutputArg,
    loading: Annotated[options.Loading, options.model_options(device_map=False)],
    corrupt: Annotated[
        str, typer.Option(help="The corrupted text: its activations are patched into the clean run.")
    ],
    one: PatchText,
    align_end: Annotated[
        bool,
        typer.Option(
            "--align-end", help="Texts of different token lengths: align them at their last tokens."
        ),
    ] = False,
    denoise: Annotated[
        bool,
        typer.Option("--denoise", help="Patch the clean run's activations into the corrupted run instead."),
    ] = False,
    direct: DirectOption = False,
    component: ComponentOption = None,
    positions: PositionsOption = None,
    receiver: Annotated[
        list[str] | None,
        typer.Option(
            "--receiver",
            help="Path patching: the effect through one receiver's input only, e.g. L5.H3.q, L5.H3.k, "
            "L5.H3.v, L5.mlp; repeat for several.",
        ),
    ] = None,
    atp: Annotated[
        bool,
        typer.Option(
            "--atp",
            help="Attribution patching: estimate every head and neuron, confirm the top ones exactly.",
        ),
    ] = False,
    confirm: Annotated[
        int | None,
        typer.Option(
            help="With --atp: components confirmed by exact patching; 0: the estimates alone (every head's "
            "and neuron's estimate is in screen.csv either way) \\[default: 20]."
        ),
    ] = None,
    top_neurons: TopNeuronsOption = None,
    batch_size: BatchSizeOption = None,
) -> None:
    """Patch activations between a clean and a corrupted text and measure the prediction.

    Each component alone takes its value from the other run (--receiver: only through a later
    component's input; --atp: a first-order estimate of every head and neuron, the top ones
    confirmed exactly, every estimate in screen.csv).
    """
    import resstream
    from resstream.rundir import output_set

    chosen = intervened_kwargs(component, positions, top_neurons)
    settings = {
        "model": loading.model,
        **one.record(),
        "corrupt": corrupt,
        "align_end": align_end,
        "direction": "denoise" if denoise else "noise",
        "direct": direct,
        **recorded(chosen),
        "receiver": receiver or None,
        "atp": atp,
        "confirm": confirm,
        "top_neurons": top_neurons,
        "batch_size": batch_size,
    }
    with output_set(output.out, "patch") as outputs:
        if not atp:
            refuse_given({"confirm": confirm}, "attribution patching (`atp`)")
        result = resstream.patch(
            one.text,
            corrupt=corrupt,
            model=loading.model,
            **one.api_kwargs(),
            **chosen,
            direction="denoise" if denoise else "noise",
            align_end=align_end,
            **given(
                receivers=receiver or None,
                atp=atp or None,
                confirm=confirm,
                batch_size=batch_size,
                direct=direct or None,
            ),
            **options.api_kwargs(loading, output),
        )
        report = intervention_report(result, outputs)
        options.write_run_record(outputs, "patch", settings, loading)
    report.show(output.out, "patch")


def intervened_kwargs(
    component: list[str] | None, positions: list[str] | None, top_neurons: int | None
) -> dict:
    """The API's keywords of what is intervened on: `components` (without them, the
    `top_neurons` given) and the parsed `positions`."""
    chosen = {"components": component or None, "positions": parse_positions(positions)}
    return {**chosen, **given(top_neurons=top_neurons)}


def recorded(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What run.json records of `intervened_kwargs`: the flags' values (`components` as --component)."""
    return {("component" if name == "components" else name): value for name, value in kwargs.items()}


def check_corpus_use(mode: str | None, sample: options.Sample) -> None:
    """With a text, the corpus options name the windows of mean and resample ablation only."""
    if mode in ("mean", "resample"):
        refuse_given({"seq_len": sample.seq_len}, "faithfulness over a corpus (`dataset` without a text)")
        return
    corpus = {"dataset": sample.dataset, "num_seqs": sample.num_seqs, "data_dir": sample.data_dir}
    refuse_given(
        {**corpus, "seq_len": sample.seq_len},
        "`mode` mean or resample with a text (or to faithfulness over a corpus, without one)",
    )


def parse_positions(values: list[str] | None) -> list[int] | None:
    """--positions (comma-separated, repeatable) as integers; None when not given."""
    if not values:
        return None
    numbers = []
    for value in values:
        for item in split_names(value):
            try:
                numbers.append(int(item))
            except ValueError:
                raise UsageError(f"`positions` {item!r} is not an integer position") from None
    if not numbers:
        raise UsageError("`positions` is empty; give at least one position (or none for every position)")
    return numbers


def given(**values: Any) -> dict[str, Any]:
    """The keyword arguments the user set (not None): the API's own defaults stand for the rest."""
    return {name: value for name, value in values.items() if value is not None}


def intervention_report(result: InterventionResult, outputs: OutputSet) -> Report:
    """Stage the files of an `InterventionResult` (`<command>.json`, its CSV, PNGs and page)."""
    from resstream.reporting.interventions import terminal_summary, write_intervention_report

    return Report(write_intervention_report(result, outputs.staging), terminal_summary(result))


def faithfulness_report(result: FaithfulnessResult, outputs: OutputSet) -> Report:
    """Stage the files of a `FaithfulnessResult` (ablate.json, its CSVs, PNGs and page)."""
    from resstream.reporting.faithfulness import terminal_summary, write_faithfulness_report

    written = write_faithfulness_report(result, outputs.staging)
    return Report(
        written,
        terminal_summary(result),
        seq_len=result.seq_len if result.dataset else None,
        num_seqs=result.num_seqs if result.dataset else None,
        dataset_fingerprint=result.dataset_fingerprint,
    )


@dataclass(frozen=True)
class Report:
    """What a run staged (run.json aside), the summary it prints, and what run.json records of
    the corpus sample it read, if any."""

    written: Sequence[Path]
    summary: str
    seq_len: int | None = None
    num_seqs: int | None = None
    dataset_fingerprint: str | None = None

    def show(self, out: Path, command: str) -> None:
        """Print the summary, then what the run wrote and where."""
        typer.echo(cli_message(self.summary, command))
        names = ", ".join(sorted({p.name for p in self.written} - {f"{command}.json"}))
        typer.echo(f"wrote {command}.json, {names} and run.json to {out}")


def register(app: typer.Typer) -> None:
    """Add `ablate` and `patch` to the app."""
    app.command("ablate")(ablate)
    app.command("patch")(patch)
