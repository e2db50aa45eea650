"""`resstream.simulate(...)`: parameter-free stacked causal attention, one configuration or the grid."""

from __future__ import annotations

import dataclasses
from typing import Any

from tqdm.auto import tqdm

from resstream.errors import UsageError, closest
from resstream.simulation import SimulationConfig, SimulationRun
from resstream.simulation import simulate as run_simulation
from resstream.simulation.results import configuration_label

#: γ of the grid's anisotropic rows when the configuration has none.
GRID_GAMMA = 0.5


def grid_configurations(gamma: float = GRID_GAMMA) -> tuple[tuple[str, dict[str, Any]], ...]:
    """The four standard configurations of the grid, as (label, field overrides): no
    LayerNorm; LayerNorm with γ = 0; LayerNorm with γ > 0; the same with the residual."""
    return (
        ("no LayerNorm", {"layernorm": False, "gamma": 0.0, "residual": False}),
        ("LayerNorm, γ = 0", {"layernorm": True, "gamma": 0.0, "residual": False}),
        (f"LayerNorm, γ = {gamma:g}", {"layernorm": True, "gamma": gamma, "residual": False}),
        (f"LayerNorm, γ = {gamma:g}, residual", {"layernorm": True, "gamma": gamma, "residual": True}),
    )


def simulate(*, grid: bool = False, progress: bool = False, **fields: Any) -> SimulationRun:
    """Parameter-free causal attention stacks: a `SimulationRun`, each configuration's
    `SimulationResult` under its label (`run["no LayerNorm"]`, `run.items()`).

    `fields` are `resstream.simulation.SimulationConfig` fields (each checked there). With
    `grid`, the four standard configurations (`grid_configurations`, γ from `fields["gamma"]`
    when it is > 0) are run with the other fields shared; otherwise the one configuration
    given. Every configuration is checked before any is run. The number of simulations is
    `simulations` (the command line's `--simulations`, also spelled `--sims`). `progress`
    shows a bar per configuration.
    """
    base = SimulationConfig(**_checked_fields(fields))
    if grid:
        gamma = base.gamma or GRID_GAMMA
        configs = [
            (label, dataclasses.replace(base, **overrides)) for label, overrides in grid_configurations(gamma)
        ]
    else:
        configs = [(configuration_label(base), base)]
    results = []
    for label, config in configs:
        with tqdm(
            total=config.simulations, desc=f"simulate {label}", unit="sim", disable=not progress
        ) as bar:
            results.append((label, run_simulation(config, progress=bar.update)))
    return SimulationRun(tuple(results), grid=grid)


#: Names users reach for that mean a field of another name.
_FIELD_ALIASES = {"sims": "simulations", "n_sims": "simulations", "num_simulations": "simulations"}


def _checked_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` if each names a `SimulationConfig` field; else a UsageError naming the first
    unknown one, the field it probably means, and the fields allowed."""
    allowed = [field.name for field in dataclasses.fields(SimulationConfig)]
    for name in fields:
        if name not in allowed:
            meant = _FIELD_ALIASES.get(name)
            hint = f" (did you mean {meant!r}?)" if meant else closest(name, allowed)
            raise UsageError(f"unknown simulation field {name!r}{hint}; allowed: {', '.join(allowed)}")
    return fields
