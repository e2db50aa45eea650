"""Where does the causal shift happen? (question 1)

- `alignment`: per layer, top-k match with the input and the next token, cosines,
  projections and the shift depth, accumulated over a corpus.
- `lens`: decoding trajectories, position by position, layer by layer.
"""

from resstream.analysis.shift.alignment import AlignmentAccumulator, AlignmentResult
from resstream.analysis.shift.lens import LensResult, trajectories

__all__ = ["AlignmentAccumulator", "AlignmentResult", "LensResult", "trajectories"]
