"""The Hugging Face hub as seen from here: can it be reached, and does a name mean it?

Shared by model loading (`resstream.models`), tokenizer loading and corpus loading
(`resstream.data`), so it sits below all three.

* `offline_reason()`: why the hub cannot be used now — an offline switch in the environment
  (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``, ``TRANSFORMERS_OFFLINE``), or a host that does
  not accept a TCP connection within seconds — or None when it may be. Offline machines then
  fail at once instead of waiting for the libraries' retries.
* `looks_like_path(spec)`: whether a spec can only be a filesystem path. Hub names are
  ``name`` or ``org/name``; a spec that starts with ``.``, ``/`` or ``~``, holds a backslash,
  has a second ``/``, ends with a separator or carries a file suffix (``.txt``, ``.json``,
  ...) is a path. Where no hub name is possible (named corpora), any ``/`` makes a path.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from pathlib import PurePath
from urllib.parse import urlparse

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
FILE_SUFFIXES = frozenset({".txt", ".jsonl", ".json", ".md", ".text"})
PROBE_TIMEOUT_S = 5


def offline_env() -> str | None:
    """Which environment variable asks for Hugging Face offline mode, as a reason."""
    for var in OFFLINE_VARIABLES:
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return f"offline mode is set ({var})"
    return None


def endpoint() -> str:
    """The hub's address (``HF_ENDPOINT`` or huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def offline_reason() -> str | None:
    """Why the hub cannot be used now (offline mode set, or the host cannot be reached within
    seconds), or None when it may be."""
    return offline_env() or probe(endpoint())


@lru_cache(maxsize=4)
def probe(address: str) -> str | None:
    """A quick TCP connection to the hub at `address`: None when it answers, else why not."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # a proxy decides; let the library try
    url = urlparse(address)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{host} is unreachable ({exc.strerror or type(exc).__name__})"


def looks_like_path(spec: str, *, hub_names: bool = True) -> bool:
    """Whether `spec` can only be a filesystem path (module docstring).

    `hub_names=False` where a spec can never be a hub name: then any ``/`` makes a path.
    """
    if spec.startswith((".", "/", "~")) or "\\" in spec or spec.endswith(("/", os.sep)):
        return True
    if spec.count("/") > (1 if hub_names else 0) or os.sep in spec.replace("/", ""):
        return True
    return PurePath(spec).suffix.lower() in FILE_SUFFIXES
