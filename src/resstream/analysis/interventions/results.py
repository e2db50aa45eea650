"""The frozen results of `ablate` and `patch`: what each intervention did to one prediction.

An `Effect` is one component (or set of components) under one intervention (`mode`: zero,
mean, resample, patch, or atp for a first-order estimate) along one `path`: `total` (everything
downstream recomputes), `direct` (the change reaches the logits only through the residual
stream, every later component and the final norm's scale held at the base run) or a receiver
(path patching: through that receiver's input only). Each holds the patched metrics
(`metrics.METRICS`), their differences from the clean run and, for activation patching,
the fraction of the clean − corrupt gap the patched run sits at.

`to_dict()` gives the content of ablate.json / patch.json (schema in docs/causal.md).
Attribution patching's whole screen, every head's and every neuron's estimate, is an
`AtpScreen` (`InterventionResult.screen`; screen.csv), kept out of the JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from torch import Tensor

from resstream.display import Displayable
from resstream.reprs import summary

#: The columns of `InterventionResult.to_pandas()` (documented there).
EFFECT_COLUMNS = (
    "component",
    "kind",
    "layer",
    "index",
    "mode",
    "path",
    "metric",
    "clean",
    "patched",
    "difference",
    "fraction",
    "estimate",
)
#: The columns of `AtpScreen.to_pandas()` and screen.csv (documented there).
SCREEN_COLUMNS = ("component", "kind", "layer", "index", "estimate", "confirmed")


@dataclass(frozen=True)
class Effect:
    """One intervention's outcome (module docstring). `component` is a name in the component
    grammar (several joined by "+" for a joint intervention); `kind`, `layer` and `index` (head or
    neuron, −1 where none) of its first component; metrics are the patched values; `d_*` the
    patched minus the clean value; `fraction_*` (patch mode) (patched − corrupt) / (clean −
    corrupt); `estimate` an attribution-patching estimate of `d_logprob` (or of
    `d_logit_diff` with a foil) where one was made."""

    component: str
    kind: str
    layer: int
    index: int
    mode: str
    path: str
    logprob: float
    logit: float
    rank: int
    kl: float
    d_logprob: float
    d_logit: float
    d_rank: int
    logit_diff: float | None = None
    d_logit_diff: float | None = None
    fraction_logprob: float | None = None
    fraction_logit_diff: float | None = None
    estimate: float | None = None


@dataclass(frozen=True)
class ScreenedComponent:
    """Attribution patching's first-order `estimate` for one component (`component`, `kind`,
    `layer`, `index` as in `Effect`) of the change of the headline metric from the clean run,
    and whether exact activation patching `confirmed` it (its `Effect` then carries the same
    estimate)."""

    component: str
    kind: str
    layer: int
    index: int
    estimate: float
    confirmed: bool


@dataclass(frozen=True, eq=False)
class AtpScreen(Displayable, renderer="resstream.reporting.screen"):
    """Attribution patching's whole screen: the first-order estimate of the change of the
    headline `metric` from the clean run (as `ScreenedComponent.estimate`) when each head
    (`heads`, layers × heads) or each neuron (`neurons`, layers × neurons) alone is patched,
    float64 on the CPU; `confirmed` the names of the components exact patching confirmed.
    `to_pandas()` (screen.csv): one row per head, then per neuron, layer by layer, in
    `SCREEN_COLUMNS`: `component` (L3.H2, L5.N1031), `kind` ("head" or "neuron"), `layer`,
    `index` (the head or neuron), `estimate` and `confirmed`."""

    metric: str
    heads: Tensor
    neurons: Tensor
    confirmed: tuple[str, ...] = ()

    def __repr__(self) -> str:
        largest = max(float(self.heads.abs().max()), float(self.neurons.abs().max()))
        return summary(
            self,
            f"first-order estimates of d_{self.metric}",
            f"{self.heads.numel()} heads, {self.neurons.numel()} neurons",
            f"largest |estimate| {largest:.3g}",
            f"{len(self.confirmed)} confirmed",
        )


@dataclass(frozen=True)
class Prediction:
    """The metrics of one unpatched run: `logprob`, `logit` (before soft-capping), `rank`
    (0-based) and `logit_diff` (with a foil)."""

    logprob: float
    logit: float
    rank: int
    logit_diff: float | None = None


@dataclass(frozen=True)
class InterventionResult(Displayable, renderer="resstream.reporting.interventions"):
    """What intervening on components did to the prediction of `target` at `position` of one
    text (`tokens`), by `command` ("ablate" or "patch") in `mode`.

    `clean`: the prediction without intervention; `corrupt`: that of the corrupted text
    (patch mode); `positions`: the positions every component was intervened on (None: all);
    `effects`: one `Effect` per component, mode and path (the direct path only where `direct`
    says it was measured: `direct=True`); `screened` (attribution patching only): the
    first-order estimates of every head and of the neurons with the largest |estimate| (or of
    every component named), largest first, those confirmed exactly marked; `screen` (likewise):
    the whole screen, every head's and every neuron's estimate (`AtpScreen`, with its own
    `to_pandas()`; not in `to_dict()`, which stays small: screen.csv holds it).
    `metric` names the quantity the headline figures and estimates use (`logprob`, or
    `logit_diff` with a foil). `to_pandas()`
    gives one row per effect and metric (`EFFECT_COLUMNS`): `clean`/`patched`/`difference` of
    that metric, `fraction` (patch mode) and the first-order `estimate` where made.
    """

    command: str
    mode: str
    model: str
    tokens: tuple[str, ...]
    position: int
    target_id: int
    target: str
    clean: Prediction
    effects: tuple[Effect, ...]
    n_layers: int
    n_heads: int
    foil_id: int | None = None
    foil: str | None = None
    corrupt: Prediction | None = None
    corrupt_tokens: tuple[str, ...] | None = None
    positions: tuple[int, ...] | None = None
    samples: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    screened: tuple[ScreenedComponent, ...] = ()
    direct: bool = False
    screen: AtpScreen | None = None

    @property
    def metric(self) -> str:
        """The headline metric: `logit_diff` with a foil, else `logprob`."""
        return "logit_diff" if self.foil_id is not None else "logprob"

    def select(
        self, *, kind: str | None = None, path: str | None = None, mode: str | None = None
    ) -> list[Effect]:
        """The effects of one component kind, path and mode (None: any)."""
        return [
            e
            for e in self.effects
            if (kind is None or e.kind == kind)
            and (path is None or e.path == path)
            and (mode is None or e.mode == mode)
        ]

    def to_dict(self) -> dict[str, Any]:
        """The content of ablate.json / patch.json (every field but the whole `screen`)."""
        content = asdict(replace(self, screen=None))
        del content["screen"]
        return content | {"metric": self.metric}

    def __repr__(self) -> str:
        return summary(
            self,
            f"{self.command} {self.mode}" + (" (attribution patching)" if self.screen is not None else ""),
            self.model,
            f"target {self.target!r} at position {self.position}",
            f"clean {self.metric} {getattr(self.clean, self.metric):.3f}",
            f"{len(self.effects)} effects",
            self._strongest(),
        )

    def _strongest(self) -> str:
        """The headline effect: the largest drop of the metric, or when denoising (where every
        difference from the clean run holds the gap) the largest fraction restored."""
        totals = self.select(path="total")
        restoring = [e for e in totals if getattr(e, "fraction_" + self.metric) is not None]
        if self.mode == "denoise" and restoring:
            best = max(restoring, key=lambda e: getattr(e, "fraction_" + self.metric))
            return f"most restored {best.component} fraction {getattr(best, 'fraction_' + self.metric):.3f}"
        top = sorted(totals, key=lambda e: getattr(e, "d_" + self.metric) or 0.0)
        return f"largest drop {top[0].component} {getattr(top[0], 'd_' + self.metric):+.3f}" if top else ""


__all__ = [
    "EFFECT_COLUMNS",
    "SCREEN_COLUMNS",
    "AtpScreen",
    "Effect",
    "InterventionResult",
    "Prediction",
    "ScreenedComponent",
]
