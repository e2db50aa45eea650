"""Does it matter causally? (question 4)

- `components`: the grammar that names every component an intervention can act on.
- `runs`: the recorded forward interventions start from, and replacement values
  (zero, mean, another run's activations).
- `engine`: interventions run in batches, each restarting from the first block it changes.
- `carry`: a change carried along the direct path (direct effects, path patching).
- `metrics`: log p(target), logits, rank and KL of a final state.
- `effects`: total and direct effects of components, as `results.Effect`s.
- `paths`: path patching, a sender's effect through one receiver's input only.
- `atp`: attribution patching, first-order estimates of every head's and neuron's patching
  effect, the largest confirmed by exact patching.
- `faithfulness`: how well each additive score (C, DLA, AtP) predicts the exact effect.
- `results`: the frozen results (`InterventionResult`, `Effect`).
"""
