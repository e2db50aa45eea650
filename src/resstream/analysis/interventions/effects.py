"""Total and direct effects of intervening on components, as `results.Effect`s.

`component_effects` intervenes on each component alone (or on each given set jointly) in the
base run with the given replacement values:

* total: the model recomputes everything downstream (`engine.run_interventions`);
* direct: the component's change at the prediction's position is carried to h_L along the
  residual stream alone, every later component and the final norm's scale held at the base
  run (`carry.final_change`, `metrics.measure_direct`). The change of the target's logit by
  zero ablation is then exactly minus the component's DLA.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from resstream.analysis.decoding.decoder import Decoder
from resstream.analysis.interventions.carry import final_change
from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.engine import DEFAULT_BATCH, Intervention, edits, run_interventions
from resstream.analysis.interventions.metrics import Measured, measure, measure_direct
from resstream.analysis.interventions.results import Effect, Prediction
from resstream.analysis.interventions.runs import Run, Values

#: The paths `component_effects` measures.
PATHS = ("total", "direct")


@dataclass(frozen=True, eq=False)
class Readout:
    """What the effects are measured on: the prediction of `target` (and `foil`) at `position`
    through `decoder`."""

    decoder: Decoder
    position: int
    target: int
    foil: int | None = None

    def measure(self, finals: Tensor) -> Measured:
        """The metrics of final states at the position (N, d)."""
        return measure(self.decoder, finals, self.target, self.foil)

    def of_run(self, run: Run) -> Measured:
        """The metrics of a run's own prediction."""
        return self.measure(run.block_input(run.view.n_layers)[self.position].unsqueeze(0))


def prediction(measured: Measured) -> Prediction:
    """A `Prediction` from a one-row `Measured`."""
    values = measured.values(0)
    return Prediction(
        logprob=float(values["logprob"] or 0.0),
        logit=float(values["logit"] or 0.0),
        rank=int(values["rank"] or 0),
        logit_diff=None if values["logit_diff"] is None else float(values["logit_diff"]),
    )


def component_effects(
    base: Run,
    readout: Readout,
    values: Values,
    groups: Sequence[Sequence[Component]],
    *,
    mode: str,
    positions: Tensor | None = None,
    clean: Measured,
    corrupt: Measured | None = None,
    paths: Sequence[str] = PATHS,
    batch_size: int = DEFAULT_BATCH,
    progress: Callable[[int], None] | None = None,
) -> list[Effect]:
    """The effect of intervening on each group of components jointly (a one-component group:
    that component alone) at `positions` (None: every position), along each of `paths`."""
    at = torch.arange(base.seq_len) if positions is None else positions
    interventions = [edits(list(group), values, at) for group in groups]
    found: list[Effect] = []
    if "total" in paths:
        finals = run_interventions(
            base, interventions, readout.position, batch_size=batch_size, progress=progress
        )
        found += effects_of(groups, readout.measure(finals), clean, corrupt, mode, "total")
    if "direct" in paths:
        found += effects_of(
            groups, direct_measured(base, readout, interventions), clean, corrupt, mode, "direct"
        )
    return found


def direct_measured(base: Run, readout: Readout, interventions: Sequence[Intervention]) -> Measured:
    """The metrics of each intervention's direct path (module docstring)."""
    where = torch.tensor([readout.position])
    changes = []
    for intervention in interventions:
        total = torch.zeros(base.view.d_model, dtype=torch.float64)
        for edit in intervention:
            hit = (edit.positions == readout.position).nonzero()
            if len(hit) == 0:
                continue
            change = edit.change(base)[int(hit[0])].unsqueeze(0)
            total = total + final_change(base, edit.component, change, where)[0].cpu()
        changes.append(total)
    state = base.block_input(base.view.n_layers)[readout.position]
    stacked = torch.stack(changes).to(state.device)
    return measure_direct(readout.decoder, state, stacked, readout.target, readout.foil)


def effects_of(
    groups: Sequence[Sequence[Component]],
    patched: Measured,
    clean: Measured,
    corrupt: Measured | None,
    mode: str,
    path: str,
) -> list[Effect]:
    """One `Effect` per group from the metrics of its run (`patched`, one row per group), with
    differences from `clean` and, given the `corrupt` run, the fractions."""
    kl = patched.kl_from(clean)
    out = []
    for row, group in enumerate(groups):
        first = group[0]
        values = patched.values(row)
        diff = _minus(values["logit_diff"], clean.logit_diff)
        out.append(
            Effect(
                component="+".join(c.name for c in group),
                kind=first.kind,
                layer=first.layer,
                index=first.index,
                mode=mode,
                path=path,
                logprob=float(values["logprob"] or 0.0),
                logit=float(values["logit"] or 0.0),
                rank=int(values["rank"] or 0),
                kl=float(kl[row]),
                d_logprob=float(patched.logprob[row] - clean.logprob[0]),
                d_logit=float(patched.logit[row] - clean.logit[0]),
                d_rank=int(patched.rank[row] - clean.rank[0]),
                logit_diff=None if patched.logit_diff is None else float(patched.logit_diff[row]),
                d_logit_diff=diff,
                fraction_logprob=_fraction(
                    patched.logprob[row], clean.logprob, None if corrupt is None else corrupt.logprob
                ),
                fraction_logit_diff=_fraction(
                    None if patched.logit_diff is None else patched.logit_diff[row],
                    clean.logit_diff,
                    None if corrupt is None else corrupt.logit_diff,
                ),
            )
        )
    return out


def _minus(value: float | int | None, clean: Tensor | None) -> float | None:
    return None if value is None or clean is None else float(value) - float(clean[0])


def _fraction(patched: Tensor | None, clean: Tensor | None, corrupt: Tensor | None) -> float | None:
    """(patched − corrupt) / (clean − corrupt); None without a corrupted run or a gap."""
    if patched is None or clean is None or corrupt is None:
        return None
    gap = float(clean[0] - corrupt[0])
    return None if gap == 0.0 else float(patched - corrupt[0]) / gap


def mean_effects(samples: Sequence[Sequence[Effect]]) -> list[Effect]:
    """Effects averaged over resampled runs (same components, paths and order in each); the
    rank is the mean rank rounded, and `d_rank` that rank minus the clean rank (rounding the
    two means apart could disagree: round(2.5) − 1 ≠ round(1.5))."""
    if len(samples) == 1:
        return list(samples[0])
    out = []
    for rows in zip(*samples, strict=True):
        first = rows[0]
        numbers = {
            name: sum(getattr(r, name) for r in rows) / len(rows)
            for name in ("logprob", "logit", "kl", "d_logprob", "d_logit")
        }
        rank = round(sum(r.rank for r in rows) / len(rows))
        ranks = {"rank": rank, "d_rank": rank - (first.rank - first.d_rank)}
        optional = {
            name: None if getattr(first, name) is None else sum(getattr(r, name) for r in rows) / len(rows)
            for name in ("logit_diff", "d_logit_diff")
        }
        out.append(Effect(**{**first.__dict__, **numbers, **ranks, **optional}))
    return out


__all__ = [
    "PATHS",
    "Readout",
    "component_effects",
    "direct_measured",
    "effects_of",
    "mean_effects",
    "prediction",
]
