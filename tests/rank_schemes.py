"""Run a test module's exactness tests under both rank schemes (issue 28): the selecting scheme
the CPU uses by default, and the fixed-shape sync-free scheme CUDA uses by default. A module
opts in with `pytestmark = pytest.mark.usefixtures("rank_scheme")` after importing the fixture."""

from __future__ import annotations

import pytest

from resstream.analysis.decoding import ranks


@pytest.fixture(params=["selecting", "sync-free"])
def rank_scheme(request, monkeypatch):
    """`sync_free="auto"` resolves to this scheme for the test's duration (explicit values are
    left as given)."""
    forced = request.param == "sync-free"
    resolve = ranks.resolve_sync_free
    monkeypatch.setattr(
        ranks,
        "resolve_sync_free",
        lambda value, device: forced if value == "auto" else resolve(value, device),
    )
    return request.param
