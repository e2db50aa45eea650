"""The residual-attenuation study as `resstream reproduce` runs it: its stages, in order.

* ``tokens``: the sharded token store of the training corpus (scales that train on a streamed
  corpus: `paper`);
* ``shift``: `shift` and `lens` of each pretrained model on the analysis corpus;
* ``sweep``: `sweep`: baseline, a fixed cut per layer and the learned gate, per seed;
* ``eval``: every trained model (`sweep --benchmarks`) and every pretrained one (`eval --model`)
  on the benchmarks;
* ``compare``: `compare` of the sweep (baseline / best fixed cut / learned gate);
* ``misalignment``: `shift` of every trained model on held-out text, gathered per variant into
  misalignment.json (`resstream.reporting.misalignment`);
* ``report``: one self-contained report.html.

Each stage names the settings, corpora and earlier stages its fingerprint covers, the steps it
runs (`resstream.study.steps`, `resstream.study.misalignment`) and the outputs a finished one
leaves behind; the engine that reuses and resumes them is `resstream.study.engine`.
"""

from __future__ import annotations

from resstream.study import steps
from resstream.study.misalignment import misalignment_steps
from resstream.study.pipeline import Stage
from resstream.study.plan import Plan, model_dirs


def _none(plan: Plan) -> tuple[str, ...]:
    return ()


STAGE_TABLE: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage(
            "tokens",
            "tokenise the training corpus into shards",
            ("train_dataset", "shard_tokenizer"),
            (),
            _none,
            steps.tokens_steps,
            applies=lambda plan: plan.scale.shard_tokenizer is not None,
            outputs=lambda p: [p.path("tokens", "manifest.json")],
        ),
        Stage(
            "shift",
            "shift and lens of the pretrained models",
            ("models", "shift_dataset", "shift_seqs", "shift_seq_len", "top_k"),
            (),
            lambda p: (p.scale.shift_dataset,),
            steps.shift_steps,
            outputs=lambda p: [d / f"{kind}.json" for kind in ("shift", "lens") for d in model_dirs(p, kind)],
        ),
        Stage(
            "sweep",
            "train baseline, fixed cuts and learned gate per seed",
            ("preset", "train_flags", "seeds", "train_dataset"),
            ("tokens",),
            lambda p: () if p.scale.shard_tokenizer else (p.scale.train_dataset,),
            steps.sweep_steps,
            outputs=lambda p: [p.path("sweep", "sweep.json")],
        ),
        Stage(
            "eval",
            "benchmarks of every trained and pretrained model",
            ("models", "benchmarks", "max_eval_tokens"),
            ("sweep",),
            lambda p: p.scale.benchmarks,
            steps.eval_steps,
            outputs=lambda p: [d / "eval.json" for d in model_dirs(p, "eval")],
        ),
        Stage(
            "compare",
            "the comparison table",
            ("benchmarks", "max_eval_tokens"),
            ("eval",),
            _none,
            steps.compare_steps,
            outputs=lambda p: [p.path("compare", "compare.json")],
        ),
        Stage(
            "misalignment",
            "shift of every trained model on held-out text",
            ("heldout_dataset", "heldout_seqs", "heldout_seq_len", "top_k", "seeds"),
            ("sweep",),
            lambda p: (p.scale.heldout_dataset,),
            misalignment_steps,
            outputs=lambda p: [p.path("misalignment", "misalignment.json")],
        ),
        Stage(
            "report",
            "report.html",
            ("name", "about", "models", "seeds"),
            ("shift", "sweep", "eval", "compare", "misalignment"),
            _none,
            steps.report_steps,
            outputs=lambda p: [p.path("report.html")],
        ),
    )
}
