"""The Python API the CLI mirrors, one module per command, re-exported as `resstream.shift` etc.

Every function accepts its models as spec strings (run directory, Hugging Face directory or
hub name, "reference") or as models already in memory with their tokenizer, samples the
corpus, runs the analysis (`resstream.analysis`) and returns one frozen, typed result.
Library errors name the functions' parameters; the CLI shows them as flags.
"""

from resstream.api.lens import lens
from resstream.api.recency import RecencyReport, recency
from resstream.api.shift import ShiftReport, shift
from resstream.api.simulate import grid_configurations, simulate

__all__ = ["RecencyReport", "ShiftReport", "grid_configurations", "lens", "recency", "shift", "simulate"]
