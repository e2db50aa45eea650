"""resstream: the residual stream of causal Transformer language models."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`resstream.shift`, `.lens`, `.simulate` and `.recency`, imported on first use (torch is heavy)."""
    if name in ("shift", "lens", "simulate", "recency"):
        from resstream import api

        return getattr(api, name)
    raise AttributeError(f"module 'resstream' has no attribute {name!r}")
