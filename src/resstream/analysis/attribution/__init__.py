"""Who wrote the prediction? (question 2)

- `decomposition`: the residual stream as an exact sum of named components.
- `contributions`: log-probability contribution scores of added vectors.
- `readouts`: direct logit attribution, the read-out direction of a logit at every write.
- `scores`: the attribution of one prediction (DLA and contributions of every write).
- `corpus`: the same over a corpus, every position's next token the target.
- `results`: the frozen results (`AttributeResult`, `CorpusAttribution`).
"""

from resstream.analysis.attribution.corpus import attribute_batches
from resstream.analysis.attribution.decomposition import Decomposition, decompose
from resstream.analysis.attribution.results import AttributeResult, CorpusAttribution
from resstream.analysis.attribution.scores import attribute_position

__all__ = [
    "AttributeResult",
    "CorpusAttribution",
    "Decomposition",
    "attribute_batches",
    "attribute_position",
    "decompose",
]
