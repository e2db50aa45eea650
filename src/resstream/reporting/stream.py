"""Tables and notebook display of a `resstream.trace` result (rendering only)."""

from __future__ import annotations

import html
from typing import Any

from resstream.errors import UsageError
from resstream.reporting.notebook import NotebookView, Table

#: A `resstream.stream.trace.Trace` (not imported: the stream layer sits above reporting).
Trace = Any


def trace_frame(trace: Trace, names: list[str], max_rows: int) -> Any:
    """The long table of `Trace.to_pandas`: text, position, token, name, index, value."""
    import pandas as pd

    unknown = [n for n in names if n not in trace]
    if unknown:
        raise UsageError(f"`names`: {', '.join(unknown)} not traced; traced: {', '.join(trace.names)}")
    sites = {site.name: site for site in trace.sites}
    rows = sum(_count(trace, sites[n]) for n in names)
    if rows > max_rows:
        raise UsageError(
            f"the table would have {rows:,} rows; allowed: {max_rows:,} (pass fewer `names`, or trace "
            f"one position with @p)"
        )
    frames = [_frame(trace, sites[name]) for name in names]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _count(trace: Trace, site: Any) -> int:
    tensor = trace[site.name]
    per_text = tensor[0].numel() if len(tensor) else 0
    if site.position is not None:
        return per_text * len(trace.lengths)
    longest = tensor.shape[1]
    return sum(per_text // longest * n for n in trace.lengths)


def _frame(trace: Trace, site: Any) -> Any:
    import numpy as np
    import pandas as pd

    tensor = trace[site.name].detach().float().cpu()
    pieces = []
    for text, length in enumerate(trace.lengths):
        chosen = tensor[text] if site.position is not None else tensor[text, :length]
        values = chosen.reshape(1 if site.position is not None else length, -1).numpy()
        positions = [site.position] if site.position is not None else list(range(length))
        width = values.shape[1]
        scalar = tensor.ndim == (1 if site.position is not None else 2)
        tokens = trace.tokens[text] if trace.tokens is not None else None
        pieces.append(
            pd.DataFrame(
                {
                    "text": text,
                    "position": np.repeat(positions, width),
                    "token": np.repeat([tokens[p] if tokens else "" for p in positions], width),
                    "name": site.name,
                    "index": np.tile(np.arange(width) if not scalar else [-1], len(positions)),
                    "value": values.reshape(-1),
                }
            )
        )
    return pd.concat(pieces, ignore_index=True)


def trace_view(trace: Trace) -> NotebookView:
    """The notebook's view: every name with its shape and dtype, and the texts' lengths."""
    rows = "".join(
        f"<tr><td><code>{html.escape(name)}</code></td><td>{tuple(t.shape)}</td>"
        f"<td>{str(t.dtype).replace('torch.', '')}</td></tr>"
        for name, t in trace.activations.items()
    )
    table = f"<table><tr><th>name</th><th>shape</th><th>dtype</th></tr>{rows}</table>"
    lengths = ", ".join(map(str, trace.lengths))
    return NotebookView(tables=[Table(f"Traced activations (texts of {lengths} tokens)", table)])


__all__ = ["trace_frame", "trace_view"]
