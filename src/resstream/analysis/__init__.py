"""The analyses, grouped by the question each answers; imports point down this list.

- `norms`, `stats`: the shared formulas (a norm frozen at a state, cluster intervals).
- `decoding`: how a residual state becomes scores over the vocabulary, and exact ranks.
- `shift`: where a state stops being about its input token and starts predicting the next.
- `attribution`: who wrote a prediction (exact decomposition, DLA, log-prob contributions).
- `circuits`: FFN neurons as key -> value memories, and head composition.
- `recency`: the measured positional bias of attention.
"""
