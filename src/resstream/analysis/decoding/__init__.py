"""How a residual state becomes scores over the vocabulary (question 1's instrument).

- `decoder`: THE decoder (logit lens, embedding, tuned lens) and its exact scorer.
- `ranks`: exact ranks of given tokens among all scores, by floating-point bounds (the door to
  `ranks_exact`, `ranks_screen`, `ranks_selecting`, `ranks_sync_free` and `ranks_top_k`).
- `tuned_lens`: tuned-lens translators, their files and their model signature.
- `tuned_lens_package`: the tuned-lens package's lens layout (read and written).
- `lens_training`: the tuned-lens objective and optimiser over captured states.
"""

from resstream.analysis.decoding.decoder import DECODERS, Decoder, ExactScorer, NonFiniteInputs, decoder_of
from resstream.analysis.decoding.ranks import exact_ranks, fast_ranks
from resstream.analysis.decoding.tuned_lens import TunedLens, load_lens

__all__ = [
    "DECODERS",
    "Decoder",
    "ExactScorer",
    "NonFiniteInputs",
    "TunedLens",
    "decoder_of",
    "exact_ranks",
    "fast_ranks",
    "load_lens",
]
