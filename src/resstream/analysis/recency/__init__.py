"""The measured positional bias of attention (question 3's measurement beside the simulation).

- `measured`: mean attention by query and key position, its trend and the strict verdict.
"""

from resstream.analysis.recency.measured import RecencyAccumulator, RecencyResult

__all__ = ["RecencyAccumulator", "RecencyResult"]
