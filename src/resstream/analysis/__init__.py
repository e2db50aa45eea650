"""The analyses, grouped by the question each answers; imports point down this list.

- `norms`, `stats`: the shared formulas (a norm frozen at a state, cluster intervals).
- `decoding`: how a residual state becomes scores over the vocabulary, and exact ranks.
- `shift`: where a state stops being about its input token and starts predicting the next.
- `attribution`: who wrote a prediction (exact decomposition, DLA, log-prob contributions).
- `memories`: FFN neurons as key -> value memories, and head composition.
- `recency`: the measured positional bias of attention.
- `interventions`: ablation, patching, path and attribution patching, faithfulness.
- `routes`: information-flow graphs.
- `circuits`: edge graphs (writer -> reader q/k/v/MLP/logits), edge scores (EAP, EAP-IG,
  exact), circuits by size and their faithfulness (MIB's CPR and CMD).
"""
