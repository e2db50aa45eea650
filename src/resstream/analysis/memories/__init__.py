"""What the weights store and how heads read each other (question 2, by weights).

- `neurons`: FFN neurons as key -> value memories (Geva et al. 2021).
- `composition`: Q-, K- and V-composition of pairs of heads (Elhage et al. 2021).
"""

from resstream.analysis.memories.composition import CompositionResult, composition
from resstream.analysis.memories.neurons import NeuronsResult, neuron_reports

__all__ = ["CompositionResult", "NeuronsResult", "composition", "neuron_reports"]
