"""resstream: the residual stream of causal Transformer language models.

`resstream.shift`, `.lens`, `.recency` and `.simulate` are the Python API (`resstream.api`),
imported on first use (torch is heavy).
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from resstream.api import lens, recency, shift, simulate

__all__ = ["lens", "recency", "shift", "simulate"]


def __getattr__(name: str):
    """The API functions, imported on first use."""
    if name in __all__:
        from resstream import api

        return getattr(api, name)
    raise AttributeError(f"module 'resstream' has no attribute {name!r}")
