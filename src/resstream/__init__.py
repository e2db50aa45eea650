"""resstream: the residual stream of causal Transformer language models."""

__version__ = "0.1.0"
