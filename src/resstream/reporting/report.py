"""One self-contained HTML report of the causal-shift / residual-attenuation study.

`find_outputs(paths)` recognises what resstream commands left in each directory: shift
(shift.json), lens (lens.json), sweep (sweep.json), eval (eval.json), compare (compare.json),
misalignment (misalignment.json), or a whole reproduction (reproduce.json, whose stage folders
shift/*/, lens/*/, sweep/, eval/*/, compare/ and misalignment/ are searched instead).
`write_report(inputs, out_dir)` writes `report.html`: one file with every figure embedded as a
data: URI and its style inline, so it opens offline. It has a section for each kind of input
given, numbered as in the paper:

* Table I: the decoded top-1 token of every layer at each position of a text, layers merged
  into one column where every position's decoding agrees (lens);
* Figure 2: top-k match with the input and the next token by layer, 95% CIs (shift);
* Figure 3: cosines and projection of every model on a relative-depth axis (shift);
* Figure 4: validation loss against the cut layer, baseline dotted (sweep);
* Figure 5: the learned gate's distribution over training (sweep);
* Table II: baseline / best fixed cut / learned gate on the benchmarks, best in bold
  (compare, else the sweep's own scores), with pretrained models' rows (eval) beside them;
* Table III: the misalignment of the trained variants (misalignment).

Every caption states the scale (models, tokens, steps, seeds, read from the inputs) and what
the figure or table does and does not show. Every text that comes from data is escaped. The
numbers are the inputs' own; nothing here runs a model.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resstream.analysis.shift.alignment import AlignmentResult
from resstream.analysis.shift.lens import LensResult, merge_ranges
from resstream.errors import UsageError
from resstream.io import write_text
from resstream.reporting.figures import figure_png
from resstream.reporting.html import figure_html
from resstream.reporting.lens import INPUT_COLOUR, NEXT_COLOUR, token_kind
from resstream.reporting.misalignment import FORMAT as MISALIGNMENT_FORMAT
from resstream.reporting.misalignment import METRICS as MISALIGNMENT_METRICS
from resstream.reporting.misalignment import READING as MISALIGNMENT_READING
from resstream.reporting.plots import gate_heatmap_figure, sweep_val_loss_figure
from resstream.reporting.shift import (
    comparison_figure,
    match_rates_figure,
    result_label,
    similarity_comparison_figure,
)
from resstream.reporting.tables import (
    CONVENTION,
    CompareRow,
    CompareTable,
    Stat,
    compare_columns,
    compare_table,
    model_record,
    model_row,
)
from resstream.reporting.text import show_token
from resstream.rundir import RUN_FILE
from resstream.training.records import (
    MODEL_META,
    SWEEP_FORMAT,
    SweepResult,
    load_sweep,
    normalise_eval,
    read_json,
)

REPORT_FILE = "report.html"
REPRODUCTION_FILE = "reproduce.json"
#: The file each kind of output is recognised by, in the order the report shows them.
OUTPUT_FILES: dict[str, str] = {
    "lens": "lens.json",
    "shift": "shift.json",
    "sweep": "sweep.json",
    "compare": "compare.json",
    "eval": "eval.json",
    "misalignment": "misalignment.json",
}
#: Where a reproduction keeps each kind of output (folders below its directory; * = any).
STAGE_FOLDERS: dict[str, str] = {
    "lens": "lens/*",
    "shift": "shift/*",
    "sweep": "sweep",
    "compare": "compare",
    "eval": "eval/*",
    "misalignment": "misalignment",
}
DEFAULT_TITLE = "resstream: the causal shift and residual attenuation"


# --------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Output:
    """One command's output found in a directory: its kind, its file's content and the
    run.json beside it (None when there is none)."""

    kind: str
    directory: Path
    data: dict[str, Any]
    record: dict[str, Any] | None = None


@dataclass(frozen=True)
class ReportInputs:
    """Everything `find_outputs` recognised: the outputs, and the reproduce.json of each
    reproduction given (its scale)."""

    outputs: tuple[Output, ...]
    reproductions: tuple[Output, ...] = ()

    def of(self, kind: str) -> tuple[Output, ...]:
        """The outputs of one kind, in the order found."""
        return tuple(output for output in self.outputs if output.kind == kind)

    @property
    def directories(self) -> tuple[Path, ...]:
        """Every directory something was read from, each once."""
        found = [o.directory for o in (*self.reproductions, *self.outputs)]
        return tuple(dict.fromkeys(found))


def _shape_problem(kind: str, data: Any) -> str | None:
    """Why `data` is not the file `resstream <kind>` writes (None when it is)."""
    if not isinstance(data, dict):
        return "not a JSON object"
    wanted = {
        "lens": ("positions", list),
        "shift": ("models", list),
        "compare": ("rows", list),
        "eval": ("benchmarks", list),
    }
    if kind in wanted:
        key, kind_of = wanted[kind]
        return None if isinstance(data.get(key), kind_of) else f"no {key!r} list"
    expected = {"sweep": SWEEP_FORMAT, "misalignment": MISALIGNMENT_FORMAT}[kind]
    return None if data.get("format") == expected else f"its format is not {expected!r}"


def _read_output(kind: str, directory: Path) -> Output | None:
    """The output of `kind` in `directory`, None when its file is absent; UsageError when the
    file is there but is not what that command writes (e.g. a tuned lens's lens.json)."""
    path = directory / OUTPUT_FILES[kind]
    data = read_json(path)
    if data is None:
        return None
    problem = _shape_problem(kind, data)
    if problem is not None:
        raise UsageError(f"{str(path)!r} is not the {path.name} `resstream {kind}` writes ({problem})")
    record = read_json(directory / RUN_FILE)
    return Output(kind, directory, data, record if isinstance(record, dict) else None)


def _outputs_in(directory: Path) -> list[Output]:
    """The outputs directly in `directory`."""
    found = (_read_output(kind, directory) for kind in OUTPUT_FILES)
    return [output for output in found if output is not None]


def _stage_outputs(root: Path) -> list[Output]:
    """The outputs in a reproduction's stage folders."""
    outputs = []
    for kind, pattern in STAGE_FOLDERS.items():
        for folder in sorted(p for p in root.glob(pattern) if p.is_dir()):
            output = _read_output(kind, folder)
            if output is not None:
                outputs.append(output)
    return outputs


def _looked_for(reproduction: bool) -> str:
    """The files `find_outputs` looks for, as a list in words."""
    if reproduction:
        names = [f"{STAGE_FOLDERS[k]}/{OUTPUT_FILES[k]}" for k in OUTPUT_FILES]
    else:
        names = [*OUTPUT_FILES.values(), REPRODUCTION_FILE]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _checked_directory(path: str | Path) -> Path:
    directory = Path(path)
    if not directory.exists():
        raise UsageError(f"{str(directory)!r} does not exist; give directories that resstream commands wrote")
    if not directory.is_dir():
        raise UsageError(f"{str(directory)!r} is a file; give the directory that holds it")
    return directory


def find_outputs(paths: Sequence[str | Path]) -> ReportInputs:
    """The known outputs in each of `paths` (module docstring). UsageError, in one line naming
    the directory and the files looked for, when one holds none of them."""
    if not paths:
        raise UsageError("give at least one directory of resstream outputs")
    outputs: dict[tuple[Path, str], Output] = {}
    reproductions: list[Output] = []
    for path in paths:
        directory = _checked_directory(path)
        state = read_json(directory / REPRODUCTION_FILE)
        found = _stage_outputs(directory) if state is not None else _outputs_in(directory)
        if not found:
            what = "the reproduction" if state is not None else "the directory"
            raise UsageError(
                f"{what} {str(directory)!r} holds none of the outputs `resstream report` reads; "
                f"looked for {_looked_for(state is not None)}"
            )
        if state is not None:
            reproductions.append(Output("reproduce", directory, state if isinstance(state, dict) else {}))
        for output in found:
            outputs.setdefault((output.directory.resolve(), output.kind), output)
    return ReportInputs(tuple(outputs.values()), tuple(reproductions))


# --------------------------------------------------------------------------- page pieces
PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#222;line-height:1.4}"
    "h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}"
    "h3{font-size:1em;margin-bottom:.3em}"
    "table{border-collapse:collapse;font-size:88%;margin:.5em 0}"
    "td,th{border:1px solid #bbb;padding:3px 7px;text-align:right;vertical-align:top;white-space:nowrap}"
    "th{background:#f2f2f2}th.row,td.text{text-align:left}thead th{text-align:center}"
    "td.token{font-family:monospace;text-align:center;white-space:pre}"
    "tr.group th{text-align:left;font-weight:normal;font-style:italic;background:#fafafa}"
    ".scroll{overflow-x:auto;max-width:100%}"
    "figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}"
    ".grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:0 1.5em}"
    "figcaption,p.caption{color:#444;font-size:90%;margin:.4em 0}"
    ".note{color:#555;font-size:90%}nav ol{margin:.3em 0}"
    "code{font-size:95%}"
    "@media print{body{max-width:none}h2{break-after:avoid}"
    "figure,table,.caption{break-inside:avoid}.scroll{overflow:visible}}"
)


def _e(text: object) -> str:
    """Text from data, escaped for HTML (quotes included)."""
    return html.escape(str(text), quote=True)


def _number(value: int) -> str:
    return f"{value:,}"


#: Notation in captions (HTML).
T_IN, T_NEXT = "t<sub>i</sub>", "t<sub>i+1</sub>"
W_E, W_U = "W<sub>E</sub>", "W<sub>U</sub>"


def _caption(label: str, shows: str, scale: Sequence[str], not_shown: str) -> str:
    """A caption: the label in bold, what it shows, the scale, what it does not show.
    `label` and the `scale` sentences are plain text (escaped here); `shows` and `not_shown`
    are HTML, in which the caller escapes every text from data."""
    scale_text = " ".join(_e(part) for part in scale)
    return (
        f"<strong>{_e(label)}</strong> {shows} <em>Scale:</em> {scale_text} <em>Not shown:</em> {not_shown}"
    )


@dataclass(frozen=True)
class Section:
    """One numbered section of the page."""

    anchor: str
    heading: str
    body: str


# --------------------------------------------------------------------------- Table I
def layer_groups(result: LensResult) -> list[tuple[int, int]]:
    """Consecutive layers (first, last) over which every position's top-1 decoding agrees."""
    signatures = [tuple(t.top1[layer] for t in result.trajectories) for layer in range(result.num_layers + 1)]
    ids = {signature: index for index, signature in enumerate(dict.fromkeys(signatures))}
    return [(r.first, r.last) for r in merge_ranges([ids[s] for s in signatures])]


def _group_label(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}–{last}"


def _token_cell(result: LensResult, trajectory, layer: int) -> str:
    token = trajectory.top1[layer]
    colour = {"input": INPUT_COLOUR, "next": NEXT_COLOUR}.get(token_kind(trajectory, token) or "")
    style = f" style='background:{colour}'" if colour else ""
    return f"<td class='token'{style}>{_e(show_token(result.token_text(token)))}</td>"


def lens_table_html(result: LensResult) -> str:
    """Table I: one row per position (input token, next token), one column per group of
    layers whose decodings agree at every position; cells = the top-1 decoding, blue when it
    is the input token, green when it is the next token."""
    groups = layer_groups(result)
    head = "".join(f"<th>{_group_label(first, last)}</th>" for first, last in groups)
    rows = []
    for t in result.trajectories:
        nxt = _e(show_token(result.token_text(t.next_id))) if t.next_id is not None else ""
        cells = "".join(_token_cell(result, t, first) for first, _ in groups)
        rows.append(
            f"<tr><th>{t.position}</th><td class='token'>{_e(show_token(result.token_text(t.input_id)))}</td>"
            f"<td class='token'>{nxt}</td>{cells}</tr>"
        )
    return (
        "<div class='scroll'><table><thead>"
        f"<tr><th colspan='3'></th><th colspan='{len(groups)}'>layer (0 = embedding)</th></tr>"
        f"<tr><th>pos</th><th>input</th><th>next</th>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _lens_section(outputs: Sequence[Output]) -> str:
    parts = []
    for output in outputs:
        result = LensResult.from_dict(output.data)
        text = "".join(show_token(result.token_text(t.input_id), spaces=False) for t in result.trajectories)
        how = f" ({result.decoding})" if result.decoding else ""
        caption = _caption(
            f"Table I ({result.model}).",
            f"What each layer of {_e(result.model)} decodes to at each position of one text, through "
            f"the {_e(result.decoder + how)} decoder: the top-1 token; blue = the input token {T_IN}, "
            f"green = the next token {T_NEXT}; adjacent layers share a column where every position "
            "decodes the same.",
            [
                f"{len(result.trajectories)} positions of the text “{text}”;",
                f"layers 0–{result.num_layers} (0 = embedding).",
            ],
            "probabilities and ranks (lens.json has them), the tokens below the top-1; one text "
            "is an example, not a corpus statistic (Figure 2 is).",
        )
        parts.append(f"<h3>{_e(result.model)}</h3>{lens_table_html(result)}<p class='caption'>{caption}</p>")
    return "".join(parts)


# --------------------------------------------------------------------------- Figures 2 and 3
@dataclass(frozen=True)
class ShiftRun:
    """One model's result in one shift.json, with that file's sample."""

    result: AlignmentResult
    dataset: str
    sample: str


def _shift_runs(outputs: Sequence[Output]) -> list[ShiftRun]:
    runs = []
    for output in outputs:
        for entry in output.data["models"]:
            result = AlignmentResult.from_dict(entry)
            sample = result.sample or output.data.get("sample") or ""
            runs.append(ShiftRun(result, str(output.data.get("dataset", "")), sample))
    return runs


def _shift_scale(run: ShiftRun) -> str:
    r = run.result
    return (
        f"{r.model} (L = {r.num_layers}): {_number(r.num_tokens)} positions in {r.num_sequences} "
        f"sequences ({run.sample or run.dataset}); top-{r.top_k}, {r.decoder} decoder."
    )


def _match_section(runs: Sequence[ShiftRun]) -> str:
    parts = []
    with_decoder = len({run.result.decoder for run in runs}) > 1
    for run in runs:
        r = run.result
        name = result_label(r, with_decoder)
        shift = "never" if r.shift_layer is None else f"at layer {r.shift_layer:.2f}"
        caption = _caption(
            f"Figure 2 ({name}).",
            f"The fraction of positions whose input token {T_IN} (blue) and next token {T_NEXT} (green) "
            f"are among the top-{r.top_k} decodings of each layer's residual state, with 95% "
            f"confidence bands (cluster intervals over sequences); the dotted line marks the shift "
            f"layer, where the next token first out-ranks the input one ({shift}).",
            [_shift_scale(run)],
            "individual tokens (Table I), how far below the top-k a token ranks, and whether two "
            "models differ significantly (each has its own sample and, possibly, tokenizer).",
        )
        parts.append(figure_html(figure_png(match_rates_figure(r)), f"match rates of {name}", caption))
    if len(runs) > 1:
        parts = [f"<div class='grid'>{''.join(parts)}</div>"]  # side by side where the page is wide
        results = [run.result for run in runs]
        caption = _caption(
            "Figure 2 (all models).",
            "out_match − in_match against relative depth (layer / L): above 0 the next token is "
            "found more often than the input one; bands add the two rates' 95% half-widths "
            "(conservative).",
            [" ".join(_shift_scale(run) for run in runs)],
            "the rates themselves (the panels above); relative depth aligns models of different "
            "depth but not of different width or training.",
        )
        parts.append(figure_html(figure_png(comparison_figure(results)), "shift of every model", caption))
    return "".join(parts)


def _similarity_section(runs: Sequence[ShiftRun]) -> str:
    results = [run.result for run in runs]
    caption = _caption(
        "Figure 3.",
        "For every model, against relative depth (layer / L): the cosine of the residual state "
        f"with the input token's embedding {W_E}[{T_IN}] (left) and with the next token's unembedding "
        f"{W_U}[{T_NEXT}] (middle), and its projection on the line from the input embedding (0) to "
        "the output embedding (1) after rescaling it to the input embedding's norm (right); "
        "means over positions.",
        [" ".join(_shift_scale(run) for run in runs)],
        "the spread over positions or any confidence interval (means only); cosines are taken "
        "on the raw state before the final norm, so they are not the decoder's scores.",
    )
    return figure_html(
        figure_png(similarity_comparison_figure(results)), "similarity by relative depth", caption
    )


# --------------------------------------------------------------------------- Figures 4, 5
def _parameters(sweep: SweepResult) -> int | None:
    """The parameter count of the sweep's first run (its model.json), None if unrecorded."""
    for run in sweep.runs:
        meta = read_json(run.path / MODEL_META) if run.path is not None else None
        if isinstance(meta, dict) and isinstance(meta.get("parameters"), int):
            return meta["parameters"]
    return None


def sweep_scale(sweep: SweepResult) -> str:
    """The scale of a sweep in one sentence: model size, training tokens per run, seeds,
    cuts."""
    config = sweep.config
    model, run = config.get("model", {}), config.get("run", {})
    dataset = config.get("data", {}).get("dataset", "?")
    steps, batch, block = run.get("max_steps"), run.get("batch_size"), model.get("block_size")
    parameters = _parameters(sweep)
    size = f"{_number(parameters)} parameters, " if parameters else ""
    tokens = (
        f"{steps} steps × {batch} sequences × {block} tokens = {_number(steps * batch * block)} "
        f"training tokens of {dataset!r} per run"
        if isinstance(steps, int) and isinstance(batch, int) and isinstance(block, int)
        else f"trained on {dataset!r}"
    )
    seeds = ", ".join(map(str, sweep.seeds))
    cuts = ", ".join(map(str, sweep.layers)) or "none"
    learned = "; a learned gate per seed" if sweep.learned else ""
    return (
        f"{len(sweep.runs)} runs of {sweep.n_layer}-layer models (d_model {model.get('d_model', '?')}, "
        f"{size}context {block}); {tokens}; seeds {seeds}; fixed cuts at layers {cuts} with "
        f"α = {sweep.alpha:g}{learned}."
    )


def _val_loss_section(sweep: SweepResult) -> str:
    caption = _caption(
        "Figure 4.",
        "Final validation loss of each run with the identity path scaled by α at one layer k "
        "(points; black: mean ± sample std over seeds), against k; the baseline without a cut "
        "is dotted and the learned gate dashed (shaded: ± std over seeds).",
        [sweep_scale(sweep)],
        "the loss during training, nor the benchmarks (Table II); differences smaller than the "
        "spread over seeds are not evidence of an effect.",
    )
    return figure_html(
        figure_png(sweep_val_loss_figure(sweep)), "validation loss against the cut layer", caption
    )


def _gate_section(sweep: SweepResult) -> str:
    histories = {seed: h for seed, h in sweep.gate_histories.items() if h.steps}
    strength = sweep.config.get("model", {}).get("gate_strength")
    s = f"{strength:g}" if isinstance(strength, int | float) else "s"
    how = f"α<sub>l</sub> = 1 − {s}·p<sub>l</sub>"
    caption = _caption(
        "Figure 5.",
        "The learned gate's distribution p over layers (rows) at each logged training step "
        f"(columns), one panel per seed; layer l's identity path is scaled by {how}.",
        [f"{len(histories)} seed(s): {', '.join(map(str, sorted(histories)))}.", sweep_scale(sweep)],
        "whether the gate's preference changes the loss (Figure 4 and Table II do); one colour "
        "scale for every panel, fitted to the values drawn.",
    )
    return figure_html(figure_png(gate_heatmap_figure(histories)), "learned gate over training", caption)


# --------------------------------------------------------------------------- Table II
def _model_name(eval_output: Output) -> str:
    """How a pretrained model's row is labelled: its spec, or the folder name of a path."""
    model = str(eval_output.data.get("model") or eval_output.directory.name)
    return Path(model).name if Path(model).is_absolute() else model


def _eval_tokens(output: Output) -> str:
    counts = ", ".join(
        f"{entry.get('name')} {_number(int(entry.get('num_tokens') or 0))}"
        for entry in output.data["benchmarks"]
    )
    return f"{_model_name(output)}: scored tokens {counts}."


def _cell(table: CompareTable, row: CompareRow, column, bold: bool) -> str:
    text = _e(table.cell_text(row, column, bold=False))
    return f"<td><strong>{text}</strong></td>" if bold else f"<td>{text}</td>"


def compare_html(table: CompareTable | None, pretrained: Sequence[Output]) -> str:
    """Table II: the comparison's rows (best value per column in bold among them), then one
    row per pretrained model's eval.json (not ranked)."""
    records = [model_record(_model_name(o), normalise_eval(o.data)) for o in pretrained]
    if table is not None:
        columns = table.columns
    else:
        benchmarks = list(dict.fromkeys(name for record in records for name in record.evals))
        columns = tuple(c for c in compare_columns(records, benchmarks) if c.key != "val_loss")
        table = CompareTable((), columns, (), None)
    head = "".join(f"<th>{_e(c.label)}</th>" for c in columns)
    body = []
    for row in table.rows:
        cells = "".join(_cell(table, row, c, row.key in table.best_rows(c)) for c in columns)
        body.append(f"<tr><th class='row'>{_e(row.label)}</th><td>{row.n}</td>{cells}</tr>")
    if records:
        body.append(
            f"<tr class='group'><th colspan='{len(columns) + 2}'>pretrained models "
            "(not ranked: their own tokenizer and training data)</th></tr>"
        )
    for record in records:
        row = model_row(record, columns)
        cells = "".join(_cell(table, row, c, False) for c in columns)
        body.append(f"<tr><th class='row'>{_e(row.label)}</th><td>{row.n}</td>{cells}</tr>")
    return (
        f"<div class='scroll'><table><thead><tr><th class='row'>model</th><th>n</th>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _compare_scale(output: Output | None, sweeps: Sequence[SweepResult]) -> list[str]:
    scale = [sweep_scale(sweep) for sweep in sweeps]
    if output is not None:
        tokens = output.data.get("max_eval_tokens")
        cap = f"at most {_number(tokens)} tokens per benchmark" if tokens else "every token of each benchmark"
        benchmarks = ", ".join(output.data.get("benchmarks") or []) or "none"
        scale.append(f"Benchmarks {benchmarks}, {cap}.")
    return scale


def _sweep_table(sweep: SweepResult) -> CompareTable:
    benchmarks = list(sweep.benchmarks) or list(dict.fromkeys(b for r in sweep.runs for b in r.evals))
    return compare_table(list(sweep.runs), benchmarks)


def _benchmark_section(
    compares: Sequence[Output], sweeps: Sequence[SweepResult], evals: Sequence[Output]
) -> str:
    tables: list[tuple[CompareTable | None, Output | None]] = [
        (CompareTable.from_dict(output.data), output) for output in compares
    ]
    if not tables:
        tables = [(_sweep_table(sweep), None) for sweep in sweeps] or [(None, None)]
    parts = []
    for index, (table, output) in enumerate(tables):
        shown_evals = evals if index == 0 else ()
        footer = table.footer() if table is not None and table.rows else CONVENTION + "."
        scale = _compare_scale(output, sweeps) + [_eval_tokens(o) for o in shown_evals]
        caption = _caption(
            "Table II.",
            "Validation loss and each benchmark's perplexity (and LAMBADA last-word accuracy) of "
            "the baseline, the best fixed cut and the learned gate; bold marks the best value of "
            "each column among these trained variants. " + _e(footer[:1].upper() + footer[1:]),
            scale,
            "whether a difference is significant (n seeds only); a pretrained model's "
            "perplexity is per token of its own tokenizer, so it is not comparable with the "
            "trained models' (shown for orientation, never bold).",
        )
        parts.append(f"{compare_html(table, shown_evals)}<p class='caption'>{caption}</p>")
    return "".join(parts)


# --------------------------------------------------------------------------- Table III
def _misalignment_cell(stat: dict[str, Any] | None, variant_n: int, metric: str) -> str:
    if not stat or stat.get("mean") is None:
        return f"<td>never (0 of {variant_n} seeds)</td>" if metric == "shift_layer" else "<td>—</td>"
    text = Stat(tuple(float(v) for v in stat.get("values") or [stat["mean"]])).format()
    count = int(stat.get("n") or 0)
    if metric == "shift_layer":
        text += f" ({count} of {variant_n} seeds)"
    elif count != variant_n:
        text += f" (n={count})"
    return f"<td>{_e(text)}</td>"


def misalignment_html(data: dict[str, Any]) -> str:
    """Table III: one row per variant, each metric as mean ± std over seeds."""
    metrics = list(data.get("metrics") or MISALIGNMENT_METRICS)
    head = "".join(f"<th>{_e(m)}</th>" for m in metrics)
    rows = []
    for v in data.get("variants") or []:
        n = int(v.get("n") or 0)
        cells = "".join(_misalignment_cell(v.get(m), n, m) for m in metrics)
        rows.append(f"<tr><th class='row'>{_e(v.get('variant'))}</th><td>{n}</td>{cells}</tr>")
    return (
        f"<div class='scroll'><table><thead><tr><th class='row'>variant</th><th>n</th>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _misalignment_section(outputs: Sequence[Output]) -> str:
    parts = []
    for output in outputs:
        data = output.data
        seeds = sorted({int(run["seed"]) for run in data.get("runs") or [] if "seed" in run})
        caption = _caption(
            "Table III.",
            "How much the last layer (L) of each trained variant is still about its input token: "
            "final_* are the shift metrics at layer L (in_match and out_match: the input and the "
            "next token among the top-k; cos_in, cos_out, projection as in Figure 3), shift_layer "
            "is where the next token first out-ranks the input one (counted over the seeds where "
            f"it happened); mean ± sample std over seeds. Reading: {_e(MISALIGNMENT_READING)}.",
            [
                f"{data.get('num_sequences', '?')} sequences × {data.get('seq_len', '?')} tokens of "
                f"{data.get('dataset', '?')!r}, top-{data.get('top_k', '?')}, {data.get('decoder', '?')} "
                f"decoder; seeds {', '.join(map(str, seeds)) or '?'}.",
            ],
            "the layers below L (each run's shift.json has them); whether the differences "
            "between variants are significant (a few seeds only).",
        )
        parts.append(f"{misalignment_html(data)}<p class='caption'>{caption}</p>")
    return "".join(parts)


# --------------------------------------------------------------------------- the page
def _sections(inputs: ReportInputs) -> list[Section]:
    sweeps = [load_sweep(output.directory) for output in inputs.of("sweep")]
    shifts = _shift_runs(inputs.of("shift"))
    makers: list[tuple[bool, str, str, Callable[[], str]]] = [
        (
            bool(inputs.of("lens")),
            "table-1",
            "Table I. Decoded tokens by layer",
            lambda: _lens_section(inputs.of("lens")),
        ),
        (bool(shifts), "figure-2", "Figure 2. Match rates by layer", lambda: _match_section(shifts)),
        (
            bool(shifts),
            "figure-3",
            "Figure 3. Similarity to the input and the next token by relative depth",
            lambda: _similarity_section(shifts),
        ),
        (
            bool(sweeps),
            "figure-4",
            "Figure 4. Validation loss against the cut layer",
            lambda: "".join(_val_loss_section(s) for s in sweeps),
        ),
        (
            any(any(h.steps for h in s.gate_histories.values()) for s in sweeps),
            "figure-5",
            "Figure 5. The learned gate over training",
            lambda: "".join(
                _gate_section(s) for s in sweeps if any(h.steps for h in s.gate_histories.values())
            ),
        ),
        (
            bool(inputs.of("compare") or sweeps or inputs.of("eval")),
            "table-2",
            "Table II. Benchmarks",
            lambda: _benchmark_section(inputs.of("compare"), sweeps, inputs.of("eval")),
        ),
        (
            bool(inputs.of("misalignment")),
            "table-3",
            "Table III. Misalignment of the trained variants",
            lambda: _misalignment_section(inputs.of("misalignment")),
        ),
    ]
    return [Section(anchor, heading, make()) for present, anchor, heading, make in makers if present]


def _scale_note(inputs: ReportInputs, scale_note: str | None) -> str:
    if scale_note:
        return scale_note
    scales = [str(r.data.get("scale")) for r in inputs.reproductions if r.data.get("scale")]
    return f"a reproduction at the {', '.join(scales)} scale" if scales else ""


def report_html(inputs: ReportInputs, *, title: str = DEFAULT_TITLE, scale_note: str | None = None) -> str:
    """The page of `write_report`, as text."""
    if not inputs.outputs:
        raise UsageError("nothing to report: no outputs were found")
    sections = _sections(inputs)
    note = _scale_note(inputs, scale_note)
    contents = "".join(f"<li><a href='#{s.anchor}'>{_e(s.heading)}</a></li>" for s in sections)
    sources = ", ".join(f"<code>{_e(d)}</code>" for d in inputs.directories)
    body = "".join(f"<section id='{s.anchor}'><h2>{_e(s.heading)}</h2>{s.body}</section>" for s in sections)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{PAGE_STYLE}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        + (f"<p><strong>Scale:</strong> {_e(note)}</p>" if note else "")
        + f"<p class='note'>Made from the outputs in {sources}. Figures and tables "
        "are numbered as in the paper; a section appears only when its inputs were given. Every "
        "number comes from those outputs; nothing was recomputed.</p>"
        f"<nav><ol>{contents}</ol></nav>{body}</body></html>"
    )


def write_report(
    inputs: ReportInputs, out_dir: str | Path, *, title: str = DEFAULT_TITLE, scale_note: str | None = None
) -> Path:
    """Write `out_dir/report.html` (module docstring) and return its path. `scale_note` is a
    sentence on the scale of the whole study, shown under the title (default: the scale of
    the reproductions given, if any)."""
    page = report_html(inputs, title=title, scale_note=scale_note)
    path = Path(out_dir) / REPORT_FILE
    write_text(path, page)
    return path
