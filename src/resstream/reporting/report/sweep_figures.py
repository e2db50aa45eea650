"""Figures 4 and 5 of report.html (from sweep.json): the validation loss against the cut
layer, baseline dotted and learned gate dashed (Figure 4); the learned gate's distribution
over layers during training, one panel per seed (Figure 5); and `sweep_scale`, a sweep's
scale in one sentence (also Table II's)."""

from __future__ import annotations

from resstream.reporting.figures import figure_png
from resstream.reporting.html import figure_html
from resstream.reporting.plots import gate_heatmap_figure, sweep_val_loss_figure
from resstream.reporting.report.markup import caption_html, count_text
from resstream.training.records import MODEL_META, SweepResult, read_json

__all__ = ["gate_section", "sweep_scale", "val_loss_section"]


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
    size = f"{count_text(parameters)} parameters, " if parameters else ""
    tokens = (
        f"{steps} steps × {batch} sequences × {block} tokens = {count_text(steps * batch * block)} "
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


def val_loss_section(sweep: SweepResult) -> str:
    """Figure 4 of one sweep with its caption."""
    caption = caption_html(
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


def gate_section(sweep: SweepResult) -> str:
    """Figure 5 of one sweep (the seeds with gate records) with its caption."""
    histories = {seed: h for seed, h in sweep.gate_histories.items() if h.steps}
    strength = sweep.config.get("model", {}).get("gate_strength")
    s = f"{strength:g}" if isinstance(strength, int | float) else "s"
    how = f"α<sub>l</sub> = 1 − {s}·p<sub>l</sub>"
    caption = caption_html(
        "Figure 5.",
        "The learned gate's distribution p over layers (rows) at each logged training step "
        f"(columns), one panel per seed; layer l's identity path is scaled by {how}.",
        [f"{len(histories)} seed(s): {', '.join(map(str, sorted(histories)))}.", sweep_scale(sweep)],
        "whether the gate's preference changes the loss (Figure 4 and Table II do); one colour "
        "scale for every panel, fitted to the values drawn.",
    )
    return figure_html(figure_png(gate_heatmap_figure(histories)), "learned gate over training", caption)
